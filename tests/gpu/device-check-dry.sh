#!/usr/bin/env bash
# device-check-dry.sh BUILD: the device check's no-GPU path, end to end (CTest
# device_check_dry_run): packs BUILD with `device-check.sh --pack`, checks the
# tree's contents and size, runs `device-check.sh --prebuilt` on it and
# expects exit 77 (no GPU, nothing failed) within its time box, with every
# stage named in the summary. The run uses the packed NCCL stub
# (MFSDP_CHECK_NCCL_STUB=1), as on a device without NCCL: everything that
# needs no GPU must still load and pass with it.
set -u
BUILD=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/mfsdp-devcheck.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail() { echo "device-check-dry: $*" >&2; [ -f "$T/out/summary.txt" ] && cat "$T/out/summary.txt" >&2; exit 1; }

if "$BUILD/tests/gpu/mfsdp-gpu-bench" probe >/dev/null 2>&1; then
    echo "device-check-dry: a GPU is visible: run tests/gpu/device-check.sh itself (skipped)"
    exit 77
fi
bash "$HERE/device-check.sh" --pack "$BUILD" "$T/pre" >"$T/pack.log" 2>&1 || { cat "$T/pack.log"; fail "--pack failed"; }
for f in bin/mfsdp-gpu-bench bin/mfsdpc bin/mfsdp-replay bin/test_cuda_kernels bin/test_gpu_guard \
         nccl-stub/libnccl.so.2 data/llama_1x1.mfsdp device-check.sh MANIFEST; do
    [ -e "$T/pre/$f" ] || fail "the packed tree has no $f"
done
has() { compgen -G "$T/pre/lib/$1" >/dev/null; }
has 'libcudart.so*' || fail "libcudart is not carried"
has 'libyaml*' || fail "libyaml is not carried"
has 'libcmocka*' || fail "libcmocka is not carried"
has 'libc.so*' && fail "glibc must not be carried"
grep -q '^size: ' "$T/pre/MANIFEST" || fail "MANIFEST has no size"
# The stub answers every NCCL import.
nm -D --defined-only "$T/pre/nccl-stub/libnccl.so.2" | grep -q ' ncclCommSplit$' || fail "the stub lacks ncclCommSplit"

OUT="$T/out" MFSDP_CHECK_NCCL_STUB=1 MFSDP_CHECK_BUDGET_S=200 timeout 300 bash "$T/pre/device-check.sh" --prebuilt "$T/pre" >"$T/run.log" 2>&1
rc=$?
[ $rc = 77 ] || { cat "$T/run.log"; fail "--prebuilt exited $rc (want 77: no GPU, nothing failed)"; }
S="$T/out/summary.txt"
for s in "0. probe" "1. kernels" "2. replay oracle" "3. overlap" "4. ordering stress" "5. kernel bandwidth" \
         "6. host time" "done in"; do
    grep -q "$s" "$S" || fail "the summary has no '$s'"
done
grep -q '\[FAIL\]\|\[TIMEOUT\]' "$S" && fail "a check failed"
for t in test_gpu_guard test_gpu_errors test_gpu_plan test_cuda_convert "mfsdpc simulate"; do
    grep -q "\[PASS\] $t" "$S" || fail "'$t' did not pass"
done
echo "device-check-dry: exit $rc; $(grep '^  size' "$S")"
exit 0
