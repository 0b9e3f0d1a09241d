"""Hugging Face interop of mfsdp-ckpt, against the reference `safetensors`
package (.ci/install-python installs it into build/venv).

    hf_interop.py MFSDP_CKPT TRAINER SCHEDULE.yaml MFSDPC

Models are written by safetensors.numpy.save_file under Hugging Face names
("model." + the schedule's names), imported with --map model.=, loaded by
the runtime (ckpt-trainer --weights-only: its dump must hold the imported
values, converted to fp32), exported, and re-read by the reference reader:
bit-exact in fp32, bf16 (multi-file, with an index) and fp16; a tied tensor
is imported from its source and exported once; mismatched models are refused
with every mismatch in one message. `mfsdpc init` writes a spec for a
Llama-like model (12 repeated blocks as one loop) that compiles, imports,
trains and exports back bit-exact.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

CKPT, TRAINER, SCHED, MFSDPC = sys.argv[1:5]
SHAPES = {"in.weight": (45, 27), "in.bias": (45,), "out.weight": (7, 45), "out.bias": (7,)}
for i in range(2):
    SHAPES[f"hidden.{i}.weight"] = (45, 45)
    SHAPES[f"hidden.{i}.bias"] = (45,)
passed = 0


def run(*args, ok=True):
    p = subprocess.run(list(args), capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    return p


def model(dtype, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for k, s in SHAPES.items():
        a = rng.standard_normal(s).astype(np.float32)
        if dtype == "bf16":  # bf16 as the upper halves of fp32 (numpy has no bf16)
            out["model." + k] = a
        else:
            out["model." + k] = a.astype(dtype)
    return out


def save_bf16(tensors, path, files=1):
    """safetensors with BF16 entries (written by hand: numpy has no bf16);
    as `files` shards + index when files > 1. Returns the bf16 bit patterns."""
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in tensors.items()}
    names = list(bits)
    chunks = [names[i::files] for i in range(files)]
    wm = {}
    for f, chunk in enumerate(chunks):
        hdr, data, at = {}, b"", 0
        for k in chunk:
            b = bits[k].tobytes()
            hdr[k] = {"dtype": "BF16", "shape": list(bits[k].shape), "data_offsets": [at, at + len(b)]}
            data += b
            at += len(b)
        j = json.dumps(hdr).encode()
        j += b" " * (-len(j) % 8)
        fn = "model.safetensors" if files == 1 else f"model-{f + 1:05d}-of-{files:05d}.safetensors"
        with open(os.path.join(path, fn), "wb") as fh:
            fh.write(struct.pack("<Q", len(j)) + j + data)
        for k in chunk:
            wm[k] = fn
    if files > 1:
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, fh)
    return bits


def read_bf16(path):
    """Entries of a BF16 safetensors file as uint16 arrays, via the reference
    reader's header parsing (safe_open) and the raw bytes."""
    from safetensors import safe_open
    out = {}
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
        data = fh.read()
    with safe_open(path, "np") as f:  # the reference reader accepts the file
        keys = set(f.keys())
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert k in keys and v["dtype"] == "BF16", (k, v)
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype=np.uint16).reshape(v["shape"])
    return out


def read_bf16_export(d):
    """A BF16 export in files: its index, its files (sorted) and every entry."""
    idx = json.load(open(f"{d}/model.safetensors.index.json"))
    files = sorted(set(idx["weight_map"].values()))
    back = {}
    for fn in files:
        back.update(read_bf16(f"{d}/{fn}"))
    return idx, files, back


def dump_main_weight(dump):
    """main_weight of every tensor from ckpt-trainer's dump (names sorted)."""
    raw = np.fromfile(dump, dtype=np.float32)
    out, at = {}, 0
    for k in sorted(SHAPES):
        n = int(np.prod(SHAPES[k]))
        out[k] = raw[at:at + n].reshape(SHAPES[k])
        at += 3 * n
    return out


def same_files(a, b):
    """The two directories hold the same files, byte for byte."""
    names = sorted(os.listdir(a))
    return names == sorted(os.listdir(b)) and all(
        open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read() for n in names)


def check(name, cond, msg=""):
    global passed
    if not cond:
        sys.exit(f"FAIL: {name} {msg}")
    print(f"ok: {name}")
    passed += 1


with tempfile.TemporaryDirectory() as w:
    # fp32, one file: import, runtime load, export, reference re-read.
    src = model(np.float32, 1)
    os.mkdir(f"{w}/hf32")
    save_file(src, f"{w}/hf32/model.safetensors", metadata={"format": "pt"})
    run(CKPT, "import", f"{w}/hf32/model.safetensors", SCHED, f"{w}/c32", "--map", "model.=")
    run(CKPT, "verify", f"{w}/c32")
    run(TRAINER, "--schedule", SCHED, "--load", f"{w}/c32", "--weights-only", "1", "--dump", f"{w}/d32")
    got = dump_main_weight(f"{w}/d32")
    check("fp32 import, runtime load", all(np.array_equal(got[k], src["model." + k]) for k in SHAPES))
    run(TRAINER, "--schedule", SCHED, "--import-hf", f"{w}/hf32", "--map", "model.=", "--dump", f"{w}/i32")
    got = dump_main_weight(f"{w}/i32")
    check("fp32 mfsdp_ckpt_import_hf in the runtime", all(np.array_equal(got[k], src["model." + k]) for k in SHAPES))
    run(TRAINER, "--schedule", SCHED, "--import-hf", f"{w}/hf32", "--map", "model.=", "--export-hf", f"{w}/rx32")
    back = load_file(f"{w}/rx32/model.safetensors")
    check("fp32 mfsdp_ckpt_export_hf (parallel, no gathering) re-read by safetensors",
          set(back) == set(src) and all(np.array_equal(back[k], src[k]) for k in src))
    run(CKPT, "export", f"{w}/c32", f"{w}/out32", "--map", "model.=")
    back = load_file(f"{w}/out32/model.safetensors")
    check("fp32 export re-read by safetensors", set(back) == set(src) and
          all(back[k].dtype == np.float32 and np.array_equal(back[k], src[k]) for k in src))
    check("fp32: the tool's export and mfsdp_ckpt_export_hf's are the same bytes", same_files(f"{w}/rx32", f"{w}/out32"))

    # bf16, three files + index: import (to fp32), export bf16 in small files.
    bsrc = model("bf16", 2)
    os.mkdir(f"{w}/hf16")
    bits = save_bf16(bsrc, f"{w}/hf16", files=3)
    run(CKPT, "import", f"{w}/hf16/model.safetensors.index.json", SCHED, f"{w}/cb", "--map", "model.=")
    run(TRAINER, "--schedule", SCHED, "--load", f"{w}/cb", "--weights-only", "1", "--dump", f"{w}/db")
    got = dump_main_weight(f"{w}/db")
    expect = {k: (bits["model." + k].astype(np.uint32) << 16).view(np.float32) for k in SHAPES}
    check("bf16 multi-file import, runtime load (exact widening)",
          all(np.array_equal(got[k], expect[k]) for k in SHAPES))
    run(TRAINER, "--schedule", SCHED, "--import-hf", f"{w}/hf16/model.safetensors.index.json", "--map", "model.=",
        "--dump", f"{w}/ib")
    got = dump_main_weight(f"{w}/ib")
    check("bf16 multi-file mfsdp_ckpt_import_hf in the runtime", all(np.array_equal(got[k], expect[k]) for k in SHAPES))
    run(TRAINER, "--schedule", SCHED, "--import-hf", f"{w}/hf16", "--map", "model.=", "--export-hf", f"{w}/rxb",
        "--export-dtype", "bf16", "--export-max-file-bytes", "5000")
    idx, files, back = read_bf16_export(f"{w}/rxb")
    check(f"bf16 mfsdp_ckpt_export_hf in {len(files)} files + index, bit-exact",
          len(files) > 1 and set(back) == set(bits) and all(np.array_equal(back[k], bits[k]) for k in bits))
    run(CKPT, "export", f"{w}/cb", f"{w}/outb", "--dtype", "bf16", "--map", "model.=", "--max-file-bytes", "5000")
    idx, files, back = read_bf16_export(f"{w}/outb")
    check(f"bf16 export in {len(files)} files + index, re-read bit-exact",
          len(files) > 1 and set(back) == set(bits) and all(np.array_equal(back[k], bits[k]) for k in bits) and
          all(idx["weight_map"][k] in files for k in bits))
    check("bf16 in files: the tool's export and mfsdp_ckpt_export_hf's are the same bytes",
          same_files(f"{w}/rxb", f"{w}/outb"))

    # fp16: import and export, exact.
    hsrc = model(np.float16, 3)
    os.mkdir(f"{w}/hfh")
    save_file(hsrc, f"{w}/hfh/model.safetensors")
    run(CKPT, "import", f"{w}/hfh", SCHED, f"{w}/ch", "--map", "model.=")
    run(CKPT, "export", f"{w}/ch", f"{w}/outh", "--dtype", "fp16", "--map", "model.=")
    back = load_file(f"{w}/outh/model.safetensors")
    check("fp16 import/export bit-exact", all(back[k].dtype == np.float16 and np.array_equal(back[k], hsrc[k])
                                              for k in hsrc))

    # Tied: hidden.0.bias shares in.bias; stored once on both sides.
    tsrc = {k: v for k, v in src.items() if k != "model.hidden.0.bias"}
    os.mkdir(f"{w}/hft")
    save_file(tsrc, f"{w}/hft/model.safetensors")
    run(CKPT, "import", f"{w}/hft", SCHED, f"{w}/ct", "--map", "model.=", "--tie", "hidden.0.bias=in.bias")
    run(TRAINER, "--schedule", SCHED, "--load", f"{w}/ct", "--weights-only", "1", "--dump", f"{w}/dt")
    got = dump_main_weight(f"{w}/dt")
    check("tied tensor imported from its source", np.array_equal(got["hidden.0.bias"], src["model.in.bias"]))
    run(CKPT, "export", f"{w}/ct", f"{w}/outt", "--map", "model.=", "--tie", "hidden.0.bias=in.bias")
    back = load_file(f"{w}/outt/model.safetensors")
    check("tied tensor exported once", set(back) == set(tsrc) and all(np.array_equal(back[k], tsrc[k]) for k in tsrc))
    run(TRAINER, "--schedule", SCHED, "--import-hf", f"{w}/hft", "--map", "model.=", "--tie", "hidden.0.bias=in.bias",
        "--export-hf", f"{w}/rxt")
    back = load_file(f"{w}/rxt/model.safetensors")
    check("tied tensor through the runtime's import and export, stored once",
          set(back) == set(tsrc) and all(np.array_equal(back[k], tsrc[k]) for k in tsrc))

    # Mismatches: all listed in one error, nothing written.
    bad = dict(src)
    del bad["model.out.bias"]
    bad["model.in.weight"] = np.zeros((45, 26), np.float32)
    bad["model.extra"] = np.zeros(3, np.float32)
    os.mkdir(f"{w}/hfx")
    save_file(bad, f"{w}/hfx/model.safetensors")
    p = run(CKPT, "import", f"{w}/hfx", SCHED, f"{w}/cx", "--map", "model.=", ok=False)
    msg = p.stderr
    check("mismatched model refused, every mismatch in one message",
          p.returncode == 1 and "3 tensors do not match" in msg and "'out.bias': no Hugging Face tensor" in msg and
          "'in.weight': Hugging Face tensor 'model.in.weight' has another shape" in msg and
          "'model.extra' (as 'extra') is not in the schedule" in msg and not os.path.exists(f"{w}/cx") and
          not [d for d in os.listdir(w) if d.startswith("cx.tmp-")], msg)
    p = run(TRAINER, "--schedule", SCHED, "--import-hf", f"{w}/hfx", "--map", "model.=", ok=False)
    check("mismatched model refused by mfsdp_ckpt_import_hf", p.returncode != 0 and "3 tensors do not match" in
          p.stderr and "'out.bias': no Hugging Face tensor" in p.stderr, p.stderr)
    # mfsdpc init: a spec from a Llama-like checkpoint, then the whole path.
    rng = np.random.default_rng(5)
    shapes = {"model.embed_tokens.weight": (64, 16), "model.norm.weight": (16,), "lm_head.weight": (64, 16)}
    for i in range(12):
        shapes[f"model.layers.{i}.self_attn.q_proj.weight"] = (16, 16)
        shapes[f"model.layers.{i}.input_layernorm.weight"] = (16,)
    lsrc = {k: rng.standard_normal(s).astype(np.float16) for k, s in shapes.items()}
    os.mkdir(f"{w}/llm")
    save_file(lsrc, f"{w}/llm/model.safetensors")
    run(MFSDPC, "init", f"{w}/llm", "--mesh", "dp_outer=2,dp_inner=2", "--layout", "hfsdp", "--unit",
        "model.layers.{i}.", "-o", f"{w}/llm.mfsdp")
    spec = open(f"{w}/llm.mfsdp").read()
    check("mfsdpc init writes one loop for the repeated blocks",
          'unit "model.layers.{i}" for i in 0..12 layout hfsdp {' in spec and "weight      fp16 [Replicate, Flat];"
          in spec and 'tensor "self_attn.q_proj.weight" [16, 16];' in spec, spec)
    run(MFSDPC, "compile", f"{w}/llm.mfsdp", "-o", f"{w}/llm.yaml")
    run(CKPT, "import", f"{w}/llm", f"{w}/llm.yaml", f"{w}/cl")
    run(TRAINER, "--schedule", f"{w}/llm.yaml", "--load", f"{w}/cl", "--weights-only", "1", "--steps", "0")
    run(CKPT, "export", f"{w}/cl", f"{w}/outl", "--dtype", "fp16")
    back = load_file(f"{w}/outl/model.safetensors")
    check("init -> compile -> import -> load -> export, bit-exact",
          set(back) == set(lsrc) and all(np.array_equal(back[k], lsrc[k]) for k in lsrc))
    p = run(MFSDPC, "init", f"{w}/llm", "--mesh", "dp=4", "--layout", "hsdp", ok=False)
    check("init refuses a 2-axis mode on one axis", p.returncode == 2 and "needs a mesh of at least two axes"
          in p.stderr, p.stderr)
print(f"{passed} passed, 0 failed")
