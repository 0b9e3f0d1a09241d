#!/usr/bin/env python3
"""
abi_check: the ctypes binding (python/mfsdp/_lib.py) against the public
headers (runtime/include/mfsdp/), in full, as clang parses them:

  functions  every function a header exports (not the static inline ones) is
             declared in _lib._PROTOTYPES (mfsdp_nccl_* in _lib._OPTIONAL, a
             CUDA build's), with the same result and argument types, and
             _lib declares no function the headers lack;
  constants  every enum constant and integer macro MFSDP_X is _lib.X with the
             same value; _lib.RESULT_NAMES names every result;
  structs    every struct is bound in _lib.STRUCTS, by a class with the same
             field names in order, the same field types, offsets and size.

Without mfsdp_nccl.h (a build without CUDA) its names (mfsdp_nccl_*) go
unchecked. The C facts come from `clang -Xclang -ast-dump=json` (declarations, types,
constant values) and `-Xclang -fdump-record-layouts` (offsets, sizes) of one
probe file that includes the headers. Prints the first mismatch and exits 1;
exits 0 with a count of what was checked.

    abi_check.py --clang CLANG --include DIR [--cflag=-I...]... [--python DIR]
"""
import argparse
import ctypes
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

# The headers; mfsdp_mpi.h and mfsdp_nccl.h need their dependencies' include dirs.
HEADERS = ["mfsdp.h", "mfsdp_ckpt.h", "mfsdp_mpi.h", "mfsdp_nccl.h"]
NOT_CONSTANTS = re.compile(r"^MFSDP_(API|H|\w*_INIT|\w*_H)$")   # attribute, initializers, guards

SCALARS = {
    "void": None, "char": ctypes.c_char, "signed char": ctypes.c_byte,
    "unsigned char": ctypes.c_ubyte, "short": ctypes.c_short, "unsigned short": ctypes.c_ushort,
    "int": ctypes.c_int, "unsigned int": ctypes.c_uint, "long": ctypes.c_long,
    "unsigned long": ctypes.c_ulong, "long long": ctypes.c_longlong,
    "unsigned long long": ctypes.c_ulonglong, "float": ctypes.c_float, "double": ctypes.c_double,
    "_Bool": ctypes.c_bool,
}


class Mismatch(Exception):
    pass


# ---- the C side ----

def clang_run(clang, args, source):
    with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as f:
        f.write(source)
        path = f.name
    try:
        p = subprocess.run([clang] + args + [path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        raise Mismatch("clang failed on the probe (%s):\n%s" % (" ".join(args), p.stderr[-4000:]))
    return p.stdout


def constant_value(node):
    """The value clang computed for an enum constant's initializer (its first
    ConstantExpr, under any implicit casts), or None without one."""
    for e in node.get("inner", []):
        if e["kind"] == "ConstantExpr" and "value" in e:
            return int(e["value"])
        if e["kind"].endswith("CastExpr"):
            v = constant_value(e)
            if v is not None:
                return v
    return None


class Headers:
    """What clang says about the public headers."""

    def __init__(self, clang, include, cflags, headers):
        self.clang, self.flags = clang, ["-I" + include] + cflags
        self.includes = "".join('#include "%s"\n' % h for h in headers)
        self.macros = self._macros()
        ast = json.loads(clang_run(clang, ["-fsyntax-only", "-Xclang", "-ast-dump=json"] + self.flags,
                                   self.includes + self._probe()))
        self.typedefs, self.records, self.functions, self.enums = {}, {}, {}, {}
        by_id = {}
        for d in ast.get("inner", []):
            self._add(d, by_id)
        for name, value in self.enums.items():       # macros arrive as the probe's enum
            if name.startswith("mfsdp_abi_probe_"):
                self.macros[name[len("mfsdp_abi_probe_"):]] = value
        self.enums = {k: v for k, v in self.enums.items() if k.startswith("MFSDP_")}
        self.layouts = self._layouts()
        self.nccl = "mfsdp_nccl.h" in headers

    def without_nccl(self, name):
        """A name of mfsdp_nccl.h (mfsdp_nccl_*) when that header was not parsed
        (a build without CUDA): _lib.py may declare it, the check cannot."""
        return not self.nccl and name.startswith("mfsdp_nccl_")

    def _macros(self):
        out = clang_run(self.clang, ["-E", "-dM"] + self.flags, self.includes)
        names = re.findall(r"^#define (MFSDP_\w+)(?!\()\s", out, re.M)
        return {n: None for n in names if not NOT_CONSTANTS.match(n)}

    def _probe(self):
        lines = ["mfsdp_abi_probe_%s = (long long)(%s)," % (n, n) for n in sorted(self.macros)]
        return "enum mfsdp_abi_probe {\n%s\n};\n" % "\n".join(lines)

    def _add(self, d, by_id):
        kind, name = d["kind"], d.get("name", "")
        if kind == "TypedefDecl":
            owned = [i.get("ownedTagDecl", {}).get("id") for i in d.get("inner", [])]
            self.typedefs[name] = (d["type"]["qualType"], owned[0] if owned else None)
            if owned and owned[0] in by_id and name not in self.records:
                self.records[name] = by_id[owned[0]]   # an anonymous struct (ncclUniqueId)
        elif kind == "RecordDecl":
            fields = [(f.get("name", ""), f["type"]["qualType"]) for f in d.get("inner", [])
                      if f["kind"] == "FieldDecl"]
            rec = {"name": name, "complete": bool(d.get("completeDefinition")), "fields": fields}
            by_id[d["id"]] = rec
            if name and (rec["complete"] or name not in self.records):
                self.records[name] = rec
        elif kind == "EnumDecl":
            value = -1
            for c in d.get("inner", []):
                if c["kind"] != "EnumConstantDecl":
                    continue
                given = constant_value(c)
                value = given if given is not None else value + 1
                self.enums[c["name"]] = value
        elif kind == "FunctionDecl" and name.startswith("mfsdp_"):
            if d.get("storageClass") == "static":
                return                                  # static inline: no symbol to bind
            params = [p["type"]["qualType"] for p in d.get("inner", []) if p["kind"] == "ParmVarDecl"]
            result = d["type"]["qualType"].split("(")[0].strip()
            self.functions[name] = (result, params)

    def _layouts(self):
        probe = "".join("char mfsdp_abi_size_%s[sizeof(struct %s)];\n" % (n, n)
                        for n, r in self.records.items() if r["complete"] and n.startswith("mfsdp_"))
        out = clang_run(self.clang, ["-fsyntax-only", "-Xclang", "-fdump-record-layouts"] + self.flags,
                        self.includes + probe)
        layouts = {}
        for block in out.split("*** Dumping AST Record Layout")[1:]:
            lines = block.strip("\n").split("\n")
            head = re.match(r"\s*0 \| (?:struct )?(\w+)$", lines[0])
            if not head:
                continue
            fields = {}
            for line in lines[1:]:
                m = re.match(r"\s*(\d+) \|   (?! )(.*\S)$", line)
                if m:
                    fields[re.findall(r"\w+", m.group(2))[-1]] = int(m.group(1))
            size = re.findall(r"\[sizeof=(\d+),", block)
            layouts[head.group(1)] = (fields, int(size[-1]))
        return layouts

    # C type strings -> ("scalar", n) | ("enum", n) | ("struct", n) | ("ptr", t, const) | ("array", t, n)
    def ctype(self, qt):
        qt = qt.strip()
        m = re.match(r"^(.*)\[(\d+)\]$", qt)
        if m:
            return ("array", self.ctype(m.group(1)), int(m.group(2)))
        m = re.match(r"^(.*)\*\s*(const)?$", qt)
        if m:
            inner = m.group(1).strip()
            return ("ptr", self.ctype(inner), bool(re.search(r"\bconst\s*$|^const\b", inner)))
        base = re.sub(r"\b(const|volatile)\b", "", qt).strip()
        base = re.sub(r"\s+", " ", base)
        m = re.match(r"^(struct|enum) (\w+)$", base)
        if m:
            return (m.group(1), m.group(2))
        if base in SCALARS:
            return ("scalar", base)
        if base in self.typedefs:
            qt2, owned = self.typedefs[base]
            if owned is not None and base in self.records and not self.records[base]["name"]:
                return ("struct", base)
            return self.ctype(qt2)
        raise Mismatch("abi_check does not know the C type %r" % qt)


# ---- the expected ctypes of a C type ----

def describe(t):
    """A ctypes type as a short readable string ("int64*", "Config*", "char[64]")."""
    if t is None:
        return "void"
    if isinstance(t, type) and issubclass(t, ctypes.Array):
        return "%s[%d]" % (describe(t._type_), t._length_)
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return describe(t._type_) + "*"
    if isinstance(t, type) and issubclass(t, ctypes.Structure):
        return t.__name__
    names = {ctypes.c_void_p: "void*", ctypes.c_char_p: "char*"}
    if t in names:
        return names[t]
    return "%s(%s)" % (t.__name__, t._type_)


def accepted(h, structs, c):
    """The ctypes declarations that bind C type c (a tuple of h.ctype)."""
    kind = c[0]
    if kind == "scalar":
        return [SCALARS[c[1]]]
    if kind == "enum":
        return [ctypes.c_int]                         # mf_abi.c asserts: public enums are ints
    if kind == "array":
        return [e * c[2] for e in accepted(h, structs, c[1])]
    if kind == "struct":
        if c[1] in structs:
            return [structs[c[1]]]
        rec = h.records.get(c[1])
        if rec and rec["complete"] and len(rec["fields"]) == 1:   # a wrapped array (ncclUniqueId)
            return accepted(h, structs, h.ctype(rec["fields"][0][1]))
        raise Mismatch("struct %s is not bound in _lib.STRUCTS" % c[1])
    pointee, const = c[1], c[2]
    if pointee == ("scalar", "void"):
        return [ctypes.c_void_p, ctypes.c_char_p] if const else [ctypes.c_void_p]
    if pointee[0] == "scalar" and pointee[1] in ("char", "unsigned char", "signed char"):
        return [ctypes.c_char_p]                      # strings, byte buffers (uint8_t *)
    if pointee[0] == "struct":
        rec = h.records.get(pointee[1])
        if not rec or not rec["complete"]:
            return [ctypes.c_void_p]                  # an opaque handle
    if pointee[0] == "ptr" and pointee[1][0] == "struct":
        rec = h.records.get(pointee[1][1])
        if not rec or not rec["complete"]:
            return [ctypes.POINTER(ctypes.c_void_p)]  # a handle's out parameter
    return [ctypes.POINTER(t) for t in accepted(h, structs, pointee)]


def expect(h, structs, qt, what):
    def check(got):
        want = accepted(h, structs, h.ctype(qt))
        if not any(got is w or describe(got) == describe(w) for w in want):
            raise Mismatch("%s: the header says %s (ctypes %s), _lib.py declares %s"
                           % (what, qt, " or ".join(describe(w) for w in want), describe(got)))
    return check


# ---- the checks ----

def check_functions(h, lib):
    declared = dict(lib._PROTOTYPES)
    declared.update(lib._OPTIONAL)
    for name in sorted(h.functions):
        result, params = h.functions[name]
        table = lib._OPTIONAL if name.startswith("mfsdp_nccl_") else lib._PROTOTYPES
        if name not in table:
            raise Mismatch("%s: exported by the headers, not declared in _lib.%s" % (
                name, "_OPTIONAL" if table is lib._OPTIONAL else "_PROTOTYPES"))
        res, args = table[name]
        if params == ["void"]:
            params = []
        expect(h, lib.STRUCTS, result, "%s: result" % name)(res)
        if len(args) != len(params):
            raise Mismatch("%s: %d arguments in the header, %d in _lib.py" % (name, len(params), len(args)))
        for i, (qt, got) in enumerate(zip(params, args)):
            expect(h, lib.STRUCTS, qt, "%s: argument %d" % (name, i + 1))(got)
    extra = sorted(n for n in set(declared) - set(h.functions) if not h.without_nccl(n))
    if extra:
        raise Mismatch("%s: declared in _lib.py, not exported by the headers" % extra[0])
    return len(h.functions)


def check_constants(h, lib):
    values = dict(h.enums)
    values.update(h.macros)
    for name in sorted(values):
        attr = name[len("MFSDP_"):]
        if not hasattr(lib, attr):
            raise Mismatch("%s = %d: no _lib.%s" % (name, values[name], attr))
        if getattr(lib, attr) != values[name]:
            raise Mismatch("%s = %d in the header, _lib.%s = %r" % (name, values[name], attr,
                                                                    getattr(lib, attr)))
    results = {v: k for k, v in h.enums.items() if k == "MFSDP_OK" or k.startswith("MFSDP_ERR_")}
    if lib.RESULT_NAMES != results:
        raise Mismatch("_lib.RESULT_NAMES is %r, the header's results %r" % (lib.RESULT_NAMES, results))
    return len(values)


def check_structs(h, lib):
    public = sorted(n for n, r in h.records.items() if r["complete"] and n.startswith("mfsdp_"))
    for name in public:
        if name not in lib.STRUCTS:
            raise Mismatch("struct %s: not bound in _lib.STRUCTS" % name)
        cls, rec = lib.STRUCTS[name], h.records[name]
        offsets, size = h.layouts[name]
        got = [(f[0], f[1]) for f in cls._fields_]
        if [f[0] for f in got] != [f[0] for f in rec["fields"]]:
            raise Mismatch("struct %s: fields %s in the header, %s in _lib.%s" % (
                name, [f[0] for f in rec["fields"]], [f[0] for f in got], cls.__name__))
        for (field, qt), (_, ct) in zip(rec["fields"], got):
            expect(h, lib.STRUCTS, qt, "struct %s.%s" % (name, field))(ct)
            if getattr(cls, field).offset != offsets[field]:
                raise Mismatch("struct %s.%s: offset %d in C, %d in _lib.%s" % (
                    name, field, offsets[field], getattr(cls, field).offset, cls.__name__))
        if ctypes.sizeof(cls) != size:
            raise Mismatch("struct %s: sizeof %d in C, %d in _lib.%s" % (name, size, ctypes.sizeof(cls),
                                                                        cls.__name__))
    extra = sorted(n for n in set(lib.STRUCTS) - set(public) if not h.without_nccl(n))
    if extra:
        raise Mismatch("struct %s: bound in _lib.STRUCTS, not in the headers" % extra[0])
    return len(public)


def check(h, lib):
    """(functions, constants, structs) checked; raises Mismatch at the first difference."""
    return check_functions(h, lib), check_constants(h, lib), check_structs(h, lib)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clang", required=True)
    ap.add_argument("--include", required=True, help="runtime/include/mfsdp")
    ap.add_argument("--cflag", action="append", default=[], help="e.g. --cflag=-I/usr/include/mpi")
    ap.add_argument("--headers", default=",".join(HEADERS), help="comma-separated, default: all")
    ap.add_argument("--python", help="the directory holding the mfsdp package")
    a = ap.parse_args(argv)
    if a.python:
        sys.path.insert(0, a.python)
    lib = importlib.import_module("mfsdp._lib")
    try:
        h = Headers(a.clang, a.include, a.cflag, a.headers.split(","))
        n = check(h, lib)
    except Mismatch as e:
        print("abi_check: %s" % e)
        return 1
    print("abi_check: ok: %d functions, %d constants, %d structs" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
