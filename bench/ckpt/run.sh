#!/bin/sh
# bench/ckpt/run.sh [BUILD_DIR] [DIR] [ROUNDS]: the checkpoint benchmark next
# to dd on the same filesystem (DIR, default a fresh directory under /tmp or
# $TMPDIR), interleaved so that both see the same machine: ROUNDS times
# (default 5), mfsdp-ckpt-bench saves, loads warm, loads cold, reshards
# (one of each) and loads warm and cold on zero3_1x6, whose ranges cut the
# saved pieces (read in part, their CRCs combined across ranks), then dd writes as many bytes as the checkpoint holds
# (conv=fsync, like the save's fsyncs), reads them back warm (from the page
# cache, as the warm load does) and cold (after dropping the file's pages
# with `dd iflag=nocache count=0`, i.e. posix_fadvise(POSIX_FADV_DONTNEED),
# which is what the bench does to the checkpoint's files before a cold
# load) and cold with O_DIRECT (`iflag=direct bs=4M`: the disk without the
# page cache, as a cold load reads it now). The bench also reads the same files into one buffer as large as
# they are (the reference read, warm and cold: see ckpt_bench.c), because a
# warm dd into a reused 1 MiB buffer that stays in the CPU's cache is not
# the work a load does (filling distinct memory). Prints the last round's
# bench output, then per quantity the median over the rounds and the
# median of the per-round ratios save/dd-write, warm load/dd-read-warm,
# cold load/dd-read-cold (the issue's goal: >= 0.8), warm load/ref-read-warm
# cold load/ref-read-cold and cold load/dd-read-direct, cut cold load/cold
# load and cut cold load/dd-read-cold, and the load average.
# Each round also runs dcp_reference.py (with $PYTHON, default the repository's
# build/venv/bin/python, when it has torch.distributed.checkpoint): PyTorch
# DCP saving the same 48 tensors (192 MiB) and loading them cold, dropped
# from the page cache the same way (one load per round, as the bench's one
# cold load; the two alternate which goes first); it prints the medians and
# ranges of both cold loads and the per-round ratio mfsdp / DCP (the goal of
# issue 30: >= 2).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-bench}
rounds=${3:-5}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
fi
cmake --build "$build" --target mfsdp-ckpt-bench -j2 >/dev/null
work=${2:-$(mktemp -d "${TMPDIR:-/tmp}/mfsdp-ckpt-bench.XXXXXX")}
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
now() { date +%s.%N; }
python=${PYTHON:-$root/build/venv/bin/python}
if ! "$python" -c 'import torch.distributed.checkpoint' 2>/dev/null; then
  echo "dcp: skipped ($python has no torch.distributed.checkpoint; set PYTHON)"
  python=
fi
dcp_cold() { # the DCP reference's cold load, MiB/s, or - when skipped
  if [ -z "$python" ]; then echo -; return; fi
  "$python" "$root/bench/ckpt/dcp_reference.py" "$work" 1 >"$work/dcp.txt"
  sed -n 's/^dcp_load_cold_MiBps=\([0-9]*\).*/\1/p' "$work/dcp.txt"
}
log=$work/rounds.txt
: >"$log"
i=0
while [ "$i" -lt "$rounds" ]; do
  rm -rf "$work/b" "$work/dd"
  mkdir -p "$work/b"
  if [ $((i % 2)) -eq 1 ]; then dcp=$(dcp_cold); fi
  out=$("$build/bench/ckpt/mfsdp-ckpt-bench" "$build/bench/ckpt/hsdp_2x4.yaml" \
        "$build/bench/ckpt/zero3_1x8.yaml" "$work/b" 1 "$build/bench/ckpt/zero3_1x6.yaml")
  if [ $((i % 2)) -eq 0 ]; then dcp=$(dcp_cold); fi
  mib=$(($(echo "$out" | sed -n 's/^ckpt_unique_bytes=//p') / 1048576))
  t0=$(now)
  dd if=/dev/zero of="$work/dd" bs=1M count="$mib" conv=fsync status=none
  t1=$(now)
  dd if="$work/dd" of=/dev/null bs=1M status=none
  t2=$(now)
  dd if="$work/dd" iflag=nocache count=0 status=none
  t3=$(now)
  dd if="$work/dd" of=/dev/null bs=1M status=none
  t4=$(now)
  dd if="$work/dd" of=/dev/null bs=4M iflag=direct status=none
  t5=$(now)
  echo "$out" | awk -v mib="$mib" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v t3="$t3" -v t4="$t4" -v t5="$t5" \
      -v dcp="$dcp" -F= '
    {split($2, w, " "); v[$1] = w[1]}
    END {
      printf "%s %s %s %s %s %s %s %s %s %s %s %s %s\n", v["ckpt_save_MiBps"], v["ckpt_load_warm_MiBps"],
             v["ckpt_load_cold_MiBps"], v["ckpt_reshard_MiBps"], mib / (t1 - t0), mib / (t2 - t1),
             mib / (t4 - t3), v["ckpt_ref_read_warm_MiBps"], v["ckpt_ref_read_cold_MiBps"], mib / (t5 - t4),
             v["ckpt_cut_load_warm_MiBps"], v["ckpt_cut_load_cold_MiBps"], dcp
    }' >>"$log"
  i=$((i + 1))
done
echo "$out"
[ -z "$python" ] || cat "$work/dcp.txt"
awk -v n="$rounds" '
  function median(a, k,    b, i, j, t) {
    for (i = 1; i <= k; i++) b[i] = a[i]
    for (i = 2; i <= k; i++) for (j = i; j > 1 && b[j - 1] > b[j]; j--) { t = b[j]; b[j] = b[j - 1]; b[j - 1] = t }
    return k % 2 ? b[(k + 1) / 2] : (b[k / 2] + b[k / 2 + 1]) / 2
  }
  function range(a, k, f,    i, lo, hi) {
    lo = hi = a[1]
    for (i = 2; i <= k; i++) { if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
    return sprintf(f " to " f, lo, hi)
  }
  { for (c = 1; c <= 13; c++) col[c, NR] = $c
    rs[NR] = $1 / $5; rw[NR] = $2 / $6; rc[NR] = $3 / $7; qw[NR] = $2 / $8; qc[NR] = $3 / $9; rd[NR] = $3 / $10
    xc[NR] = $12 / $3; xd[NR] = $12 / $7 }
  END {
    split("save_MiBps load_warm_MiBps load_cold_MiBps reshard_MiBps dd_write_MiBps dd_read_warm_MiBps dd_read_cold_MiBps ref_read_warm_MiBps ref_read_cold_MiBps dd_read_direct_MiBps cut_load_warm_MiBps cut_load_cold_MiBps", name, " ")
    printf "rounds=%d (medians; dd: bs=1M, write conv=fsync, cold read after iflag=nocache count=0)\n", n
    for (c = 1; c <= 12; c++) { for (r = 1; r <= NR; r++) x[r] = col[c, r]; printf "%s=%.0f\n", name[c], median(x, NR) }
    printf "save_over_dd_write=%.2f\n", median(rs, NR)
    printf "load_warm_over_dd_read_warm=%.2f\n", median(rw, NR)
    printf "load_cold_over_dd_read_cold=%.2f\n", median(rc, NR)
    printf "load_warm_over_ref_read_warm=%.2f\n", median(qw, NR)
    printf "load_cold_over_ref_read_cold=%.2f\n", median(qc, NR)
    printf "load_cold_over_dd_read_direct=%.2f\n", median(rd, NR)
    printf "cut_load_cold_over_load_cold=%.2f\n", median(xc, NR)
    printf "cut_load_cold_over_dd_read_cold=%.2f\n", median(xd, NR)
    printf "per round (save/ddw, warm/ddr, cold/ddr, warm/ref, cold/ref, cold/dd-direct, cut cold/cold):"
    for (r = 1; r <= NR; r++) printf " %.2f/%.2f/%.2f/%.2f/%.2f/%.2f/%.2f", rs[r], rw[r], rc[r], qw[r], qc[r], rd[r], xc[r]
    printf "\n"
    if (col[13, NR] == "-") exit
    for (r = 1; r <= NR; r++) { x[r] = col[3, r]; y[r] = col[13, r]; rr[r] = col[3, r] / col[13, r] }
    printf "cold load vs PyTorch DCP (the same 192 MiB, one process; medians [range]):\n"
    printf "  mfsdp_load_cold_MiBps=%.0f [%s]\n", median(x, NR), range(x, NR, "%.0f")
    printf "  dcp_load_cold_MiBps=%.0f [%s]\n", median(y, NR), range(y, NR, "%.0f")
    printf "  load_cold_over_dcp_load_cold=%.2f [%s] (goal >= 2)\n", median(rr, NR), range(rr, NR, "%.2f")
    printf "  per round (mfsdp cold / DCP cold):"
    for (r = 1; r <= NR; r++) printf " %.0f/%.0f=%.2f", x[r], y[r], rr[r]
    printf "\n"
  }' "$log"
df -T "$work" | tail -1 | awk '{print "filesystem=" $2 " (" $7 ")"}'
echo "load_average=$(cut -d' ' -f1-3 /proc/loadavg)"
