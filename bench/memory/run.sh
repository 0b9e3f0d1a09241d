#!/usr/bin/env bash
# Memory per rank of the static buffer assignment (docs/performance.md):
# for every spec given (default: schedules/*.mfsdp), compiles it and prints
#   every-buffer  the sum of all buffers (what the runtime allocated before the
#                 assignment: every buffer for the whole run)
#   allocated     persistent region + arena (what it allocates now, = explain's peak)
#   arena         the transient arena
#   live bound    the most transient bytes live at one instant
#   interference  the interference bound: the heaviest set of buffers whose live
#                 ranges pairwise meet (with one offset per buffer they must be
#                 disjoint; docs/semantics.md §10)
#   a/live        arena / live bound
#   a/interf      arena / interference bound
#   goal          "ok" when arena <= 1.05 x the interference bound (the goal,
#                 docs/performance.md), else "over"
#
#   bench/memory/run.sh [BUILD_DIR] [SPEC...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
shift || true
mfsdpc="$build/planner/mfsdpc"
[ -x "$mfsdpc" ] || { echo "run.sh: no $mfsdpc (build it first)" >&2; exit 2; }
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=("$root"/schedules/*.mfsdp)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }
printf '%-26s %14s %14s %14s %14s %14s %7s %8s %5s\n' schedule "every-buffer" allocated arena "live bound" \
  interference a/live a/interf goal
for spec in "${specs[@]}"; do
  name=$(basename "$spec" .mfsdp)
  "$mfsdpc" compile "$spec" -o "$tmp/$name.yaml"
  all=$(awk '/^- \{name: .*kind: .*count: / {
           d = $0; sub(/.*dtype: /, "", d); sub(/,.*/, "", d)
           c = $0; sub(/.*count: /, "", c); sub(/,.*/, "", c)
           s += c * (d == "fp32" ? 4 : 2) } END { printf "%.0f", s }' "$tmp/$name.yaml")
  arena=$(sed -n 's/^arena: {persistent: \([0-9]*\), transient: \([0-9]*\)}$/\2/p' "$tmp/$name.yaml")
  alloc=$(sed -n 's/^  allocated_bytes: //p' "$tmp/$name.yaml")
  live=$(sed -n 's/^  live_bytes: //p' "$tmp/$name.yaml")
  inter=$(sed -n 's/^  interference_bytes: //p' "$tmp/$name.yaml")
  ratio=$(awk -v a="$arena" -v l="$live" 'BEGIN { printf "%.3f", (l > 0 ? a / l : 1) }')
  iratio=$(awk -v a="$arena" -v l="$inter" 'BEGIN { printf "%.3f", (l > 0 ? a / l : 1) }')
  goal=$(awk -v a="$arena" -v l="$inter" 'BEGIN { print (a <= 1.05 * l ? "ok" : "over") }')
  printf '%-26s %10s MiB %10s MiB %10s MiB %10s MiB %10s MiB %7s %8s %5s\n' "$name" "$(mib "$all")" \
    "$(mib "$alloc")" "$(mib "$arena")" "$(mib "$live")" "$(mib "$inter")" "$ratio" "$iratio" "$goal"
done
