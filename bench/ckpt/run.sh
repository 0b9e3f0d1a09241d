#!/bin/sh
# bench/ckpt/run.sh [BUILD_DIR] [DIR]: the checkpoint benchmark next to dd on
# the same filesystem (DIR, default a fresh directory under /tmp or $TMPDIR):
# dd writes (conv=fsync) and reads back as many bytes as the checkpoint holds,
# then mfsdp-ckpt-bench saves, loads and reshards; prints both and the ratios.
# Both read back what was just written (page cache), like for like.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-bench}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
fi
cmake --build "$build" --target mfsdp-ckpt-bench -j2 >/dev/null
work=${2:-$(mktemp -d "${TMPDIR:-/tmp}/mfsdp-ckpt-bench.XXXXXX")}
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
out=$("$build/bench/ckpt/mfsdp-ckpt-bench" "$build/bench/ckpt/hsdp_2x4.yaml" "$build/bench/ckpt/zero3_1x8.yaml" "$work")
echo "$out"
bytes=$(echo "$out" | sed -n 's/^ckpt_unique_bytes=//p')
mib=$((bytes / 1048576))
t0=$(date +%s.%N)
dd if=/dev/zero of="$work/dd" bs=1M count="$mib" conv=fsync status=none
t1=$(date +%s.%N)
dd if="$work/dd" of=/dev/null bs=1M status=none
t2=$(date +%s.%N)
echo "$out" | awk -v mib="$mib" -v t0="$t0" -v t1="$t1" -v t2="$t2" -F= '
  {v[$1] = $2}
  END {
    w = mib / (t1 - t0); r = mib / (t2 - t1)
    printf "dd_write_MiBps=%.0f (conv=fsync, %d MiB)\ndd_read_MiBps=%.0f\n", w, mib, r
    printf "save_over_dd_write=%.2f\nload_over_dd_read=%.2f\n", v["ckpt_save_MiBps"] / w, v["ckpt_load_MiBps"] / r
  }'
df -T "$work" | tail -1 | awk '{print "filesystem=" $2 " (" $7 ")"}'
