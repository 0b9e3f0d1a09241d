#!/usr/bin/env bash
# readers.sh TRAINER CKPT MFSDPC SCHEDULE [PYTHON]: every reader of checkpoints
# and Hugging Face files opens only regular files. A FIFO in place of a data
# file, the manifest, a Hugging Face file or its index is refused with a
# message naming it, by `mfsdp-ckpt verify`, a load, `mfsdp-ckpt import`, a
# runtime import, `mfsdpc init` and (with PYTHON, the package's environment)
# mfsdp.read_manifest; every run is bounded by a timeout, so a reader that
# blocks in open() fails the test (exit 124) instead of hanging it. Also: an
# index that assigns a file a tensor it lacks is refused naming the tensor,
# and output directories given with a trailing `/` are written (a save, a
# runtime export, the tool's export, import and reshard).
TRAINER=$1 CKPT=$2 MFSDPC=$3 sched=$4 py=${5:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
n=0
# refuses NAME REGEX CMD...: CMD exits 1 within 20 s, its output matching REGEX
refuses() {
  local name=$1 regex=$2 out rc
  shift 2
  out=$(timeout 20 "$@" 2>&1)
  rc=$?
  [ $rc -ne 124 ] || fail "$name: still blocked after 20 s"
  [ $rc -ne 0 ] || fail "$name: accepted: $out"
  echo "$out" | grep -Eq -- "$regex" || fail "$name: message '$out' does not match /$regex/"
  echo "ok: $name: $(echo "$out" | grep -Eo -- "$regex.*" | head -c 140)"
  n=$((n + 1))
}
fifo_for() { rm -f "$1" && mkfifo "$1"; }
fifo_re="a FIFO, not a regular file: refused"

"$TRAINER" --schedule "$sched" --steps 1 --save "$WORK/good" >/dev/null || fail "save"
cp -r "$WORK/good" "$WORK/bad"; fifo_for "$WORK/bad/rank-00001.safetensors"
refuses "verify, a data file" "rank-00001.safetensors: $fifo_re" "$CKPT" verify "$WORK/bad"
refuses "load, a data file" "refused: rank [0-9]: .*rank-00001.safetensors: $fifo_re" \
  "$TRAINER" --schedule "$sched" --load "$WORK/bad"
refuses "load with MFSDP_CKPT_VERIFY_FILES, a data file" "rank-00001.safetensors: $fifo_re" \
  "$TRAINER" --schedule "$sched" --load "$WORK/bad" --verify-files 1
rm -rf "$WORK/bad"; cp -r "$WORK/good" "$WORK/bad"; fifo_for "$WORK/bad/manifest.json"
refuses "verify, the manifest" "manifest.json: $fifo_re" "$CKPT" verify "$WORK/bad"
refuses "load, the manifest" "manifest.json: $fifo_re" "$TRAINER" --schedule "$sched" --load "$WORK/bad"
if [ -n "$py" ]; then
  got=$(timeout 20 "$py" -c "import sys, mfsdp.checkpoint as c; print(c.read_manifest(sys.argv[1]))" "$WORK/bad") ||
    fail "read_manifest of a FIFO: exit $?"
  [ "$got" = None ] || fail "read_manifest of a FIFO: $got"
  echo "ok: mfsdp.checkpoint.read_manifest, the manifest: None"
  n=$((n + 1))
fi

# Hugging Face: one file, then four files and an index.
"$CKPT" export "$WORK/good" "$WORK/hf1" >/dev/null || fail "export"
"$CKPT" export "$WORK/good" "$WORK/hf3" --max-file-bytes 9000 >/dev/null || fail "export in files"
[ -e "$WORK/hf3/model-00004-of-00004.safetensors" ] || fail "export in files: not 4 files: $(ls "$WORK/hf3")"
fifo_for "$WORK/hf1/model.safetensors"
refuses "import, a model file" "model.safetensors: $fifo_re" "$CKPT" import "$WORK/hf1" "$sched" "$WORK/imp1"
refuses "runtime import, a model file" "model.safetensors: $fifo_re" \
  "$TRAINER" --schedule "$sched" --import-hf "$WORK/hf1"
refuses "mfsdpc init, a model file" "model.safetensors: $fifo_re" \
  "$MFSDPC" init "$WORK/hf1" --mesh dp=2 --layout zero3 -o "$WORK/init.mfsdp"
[ ! -e "$WORK/init.mfsdp" ] || fail "mfsdpc init left an output behind"
cp -r "$WORK/hf3" "$WORK/hf3i"; fifo_for "$WORK/hf3i/model.safetensors.index.json"
refuses "import, an index" "model.safetensors.index.json: $fifo_re" \
  "$CKPT" import "$WORK/hf3i" "$sched" "$WORK/imp3"
cp -r "$WORK/hf3" "$WORK/hf3f"; fifo_for "$WORK/hf3f/model-00002-of-00004.safetensors"
refuses "import, a shard of an index" "model-00002-of-00004.safetensors: $fifo_re" \
  "$CKPT" import "$WORK/hf3f" "$sched" "$WORK/imp3"
refuses "mfsdpc init, a shard of an index" "model-00002-of-00004.safetensors: $fifo_re" \
  "$MFSDPC" init "$WORK/hf3f" --mesh dp=2 --layout zero3 -o "$WORK/init.mfsdp"

# An index that assigns the first file a tensor the second one holds: the
# message names the file and the tensor it lacks.
cp -r "$WORK/hf3" "$WORK/hf3m"
moved=$(sed -n 's/.*"\([^"]*\)": "model-00002-of-00004.safetensors".*/\1/p' "$WORK/hf3m/model.safetensors.index.json" |
        head -1)
[ -n "$moved" ] || fail "no tensor of the second file in the index"
sed -i "s/\"$moved\": \"model-00002-of-00004.safetensors\"/\"$moved\": \"model-00001-of-00004.safetensors\"/" \
  "$WORK/hf3m/model.safetensors.index.json"
refuses "import, an index that assigns a file a tensor it lacks" \
  "model-00001-of-00004.safetensors: holds [0-9]+ of the [0-9]+ tensors the index assigns to it: '$moved' is not in it" \
  "$CKPT" import "$WORK/hf3m" "$sched" "$WORK/imp3"

# Output paths ending in '/': DIR.tmp-ID is made next to DIR, not inside it.
"$TRAINER" --schedule "$sched" --steps 1 --save "$WORK/s/" --export-hf "$WORK/rh//" >/dev/null ||
  fail "save to a path ending in /"
"$CKPT" verify "$WORK/s" >/dev/null || fail "verify of the save to s/"
"$CKPT" export "$WORK/s/" "$WORK/e/" >/dev/null || fail "export to a path ending in /"
"$CKPT" import "$WORK/e/" "$sched" "$WORK/i/" >/dev/null || fail "import to a path ending in /"
"$CKPT" reshard "$WORK/s/" "$sched" "$WORK/r/" >/dev/null || fail "reshard to a path ending in /"
for d in s rh e i r; do [ -d "$WORK/$d" ] || fail "no $d after writing $d/"; done
[ -z "$(ls -d "$WORK"/*.tmp-* 2>/dev/null)" ] || fail "a temporary directory is left: $(ls -d "$WORK"/*.tmp-*)"
echo "ok: save, runtime export, export, import and reshard to paths ending in /"
n=$((n + 1))
echo "$n passed, 0 failed"
