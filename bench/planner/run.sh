#!/usr/bin/env bash
# Planner benchmarks: check and compile time and peak RSS for synthetic specs of
# 1 000 .. 1 000 000 tensors in two shapes, then schedule quality (bytes per rank
# per step against the ring lower bound, fusion) for every example spec.
#
#   bench/planner/run.sh [BUILD_DIR] [--max N] [--repeat R] [--timeout S]
#
# BUILD_DIR defaults to ./build; it must contain bench/planner/bench_planner
# (configure with -DCMAKE_BUILD_TYPE=Release for meaningful numbers). Each
# measurement is its own process, so peak RSS (getrusage) belongs to it alone;
# with --repeat R the fastest of R runs is kept. Times are CPU seconds (user +
# system; the pipeline is single-threaded, so on an idle machine this is the
# wall time, and on a loaded one it is not inflated by waiting for a core);
# the wall time of the compile is shown too. A measurement that runs past
# S seconds (default 300) is reported as a timeout, and the larger sizes of
# that shape and stage are skipped.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=build
max=1000000
repeat=1
limit=300
while [ $# -gt 0 ]; do
  case "$1" in
    --max) max=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) build=$1; shift ;;
  esac
done
bin="$build/bench/planner/bench_planner"
[ -x "$bin" ] || { echo "run.sh: $bin not found; build the bench_planner target first" >&2; exit 2; }

field() { # field KEY LINE
  sed -n "s/.* $1=\([^ ]*\).*/\1/p; s/^$1=\([^ ]*\).*/\1/p" <<<"$2" | head -n1
}

# best-of-R run of one measurement; prints the key=value line
measure() {
  local best="" line s
  for _ in $(seq "$repeat"); do
    line=$(timeout "$limit" "$bin" time --shape "$1" --tensors "$2" --stage "$3") || {
      if [ $? = 124 ]; then echo "rc=timeout"; else echo "rc=fail"; fi; return; }
    s=$(field cpu_s "$line")
    if [ -z "$best" ] || awk -v a="$s" -v b="$(field cpu_s "$best")" 'BEGIN{exit !(a<b)}'; then
      best=$line
    fi
  done
  echo "$best"
}

echo "machine: $(uname -m), $(nproc) cores, $(awk -F: '/model name/{print $2; exit}' /proc/cpuinfo | sed 's/^ *//'), $(date -u +%Y-%m-%d)"
echo
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
printf "%-5s %9s %7s %9s %9s %10s %9s %9s %11s %9s %8s\n" shape tensors units "check s" "check MB" \
  "compile s" "(wall s)" "compile MB" "B/tensor" ops target
misses=0
for shape in moe deep; do
  chk_dead=""; cmp_dead=""
  for n in 1000 10000 100000 1000000; do
    [ "$n" -le "$max" ] || continue
    if [ -z "$chk_dead" ]; then chk=$(measure "$shape" "$n" check); else chk="rc=skipped"; fi
    if [ -z "$cmp_dead" ]; then cmp=$(measure "$shape" "$n" compile); else cmp="rc=skipped"; fi
    crc=$(field rc "$chk"); prc=$(field rc "$cmp")
    [ "$crc" = timeout ] && chk_dead=1
    [ "$prc" = timeout ] && cmp_dead=1
    cs=$(field cpu_s "$chk"); cm=$(field peak_rss_kb "$chk")
    ps=$(field cpu_s "$cmp"); pm=$(field peak_rss_kb "$cmp"); pw=$(field seconds "$cmp")
    units=$(field units "$chk"); ops=$(field ops "$cmp")
    [ "$crc" = 0 ] || { cs=$crc; cm=-; }
    [ "$prc" = 0 ] || { ps=$prc; pm=-; ops=-; }
    target=""
    if [ "$n" = 100000 ]; then
      if [ "$crc" = 0 ] && [ "$prc" = 0 ] && awk -v c="$cs" -v p="$ps" 'BEGIN{exit !(c<0.5 && p<2.0)}'; then
        target=met
      else
        target=MISSED; misses=$((misses + 1))
      fi
    fi
    awk -v s="$shape" -v n="$n" -v u="${units:--}" -v cs="$cs" -v cm="$cm" -v ps="$ps" -v pw="$pw" -v pm="$pm" -v o="$ops" -v t="$target" '
      function num(x) { return x ~ /^[0-9.]+$/ }
      BEGIN {
        printf "%-5s %9d %7s ", s, n, u
        if (num(cs)) printf "%9.3f %9.1f ", cs, cm / 1024; else printf "%9s %9s ", cs, "-"
        if (num(ps)) printf "%10.3f %9.3f %9.1f %11.0f %9s ", ps, pw, pm / 1024, pm * 1024 / n, o
        else printf "%10s %9s %9s %11s %9s ", ps, "-", "-", "-", "-"
        printf "%8s\n", t
      }'
  done
done
echo
echo "targets at 100 000 tensors: check < 0.5 s, compile < 2 s (CPU seconds); B/tensor = compile peak RSS / tensors"
echo
"$bin" quality "$root"/schedules/*.mfsdp
echo
echo "ratio = bytes per rank per step / ring lower bound (1.00 up to padding);"
echo "launch/t = collective launches per step / tensors; fusion = per-tensor launches / launches"
exit $(( misses > 0 ))
