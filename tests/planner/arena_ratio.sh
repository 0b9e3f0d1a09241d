#!/usr/bin/env bash
# The buffer assignment's quality on every example (docs/semantics.md §10):
# compiles each spec with the real mfsdpc and reads the arena size and the two
# lower bounds back from the written YAML (`arena: {..., transient: A}`,
# `summary: live_bytes: L`, `interference_bytes: I`), then checks, with awk,
# not with the packer or the clique search:
#   L <= I <= A   (each a lower bound on the arena; the interference bound,
#                  the heaviest set of pairwise interfering buffers, is at
#                  least the peak instant's set)
#   A <= 1.05 x I (the goal, against the bound that holds with one offset per
#                  buffer; that the printed clique really interferes is
#                  tests/core/test_interfere.c's job)
# and prints A / L next to it. Also checks, per spec, that the one peak
# `mfsdpc explain` prints is the schedule's allocated_bytes = the persistent
# region + the arena, byte for byte (docs/semantics.md §9), and that the
# interference bound it prints is the summary's.
#
#   arena_ratio.sh MFSDPC SOURCE_DIR
set -euo pipefail
mfsdpc=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cd "$src"
fail=0
n=0
for spec in schedules/*.mfsdp examples/mlp/*.mfsdp tests/runtime/specs/*.mfsdp tests/ckpt/specs/*.mfsdp \
            tests/grammar/valid/*.mfsdp tests/gpu/*.mfsdp bench/ckpt/*.mfsdp; do
  [ -e "$spec" ] || continue
  out="$tmp/out.yaml"
  if ! "$mfsdpc" compile "$spec" -o "$out" >"$tmp/log" 2>&1; then
    echo "FAIL $spec: does not compile"; cat "$tmp/log"; fail=1; continue
  fi
  arena=$(sed -n 's/^arena: {persistent: [0-9]*, transient: \([0-9]*\)}$/\1/p' "$out")
  pers=$(sed -n 's/^arena: {persistent: \([0-9]*\), transient: [0-9]*}$/\1/p' "$out")
  alloc=$(sed -n 's/^  allocated_bytes: \([0-9]*\)$/\1/p' "$out")
  if ! "$mfsdpc" explain "$spec" >"$tmp/explain" 2>"$tmp/log"; then
    echo "FAIL $spec: explain failed"; cat "$tmp/log"; fail=1; continue
  fi
  peak=$(sed -n 's/^  memory\/rank  peak .* (\([0-9]*\) bytes) allocated = .*/\1/p' "$tmp/explain")
  if [ -z "$peak" ] || [ -z "$pers" ] || [ "$peak" != "$alloc" ] || [ "$peak" != "$((pers + ${arena:-0}))" ]; then
    echo "FAIL $spec: explain's peak '$peak', allocated_bytes '$alloc', persistent + arena '$pers' + '$arena'"
    fail=1; continue
  fi
  live=$(sed -n 's/^  live_bytes: \([0-9]*\)$/\1/p' "$out")
  inter=$(sed -n 's/^  interference_bytes: \([0-9]*\)$/\1/p' "$out")
  if [ -z "$arena" ] || [ -z "$live" ] || [ -z "$inter" ]; then
    echo "FAIL $spec: no arena, live_bytes or interference_bytes in the compiled schedule"; fail=1; continue
  fi
  shown=$(sed -n 's/^ *arena interference lower bound .* (\([0-9]*\) bytes), arena\/bound .*/\1/p' "$tmp/explain")
  if [ "$shown" != "$inter" ]; then
    echo "FAIL $spec: explain prints the interference bound '$shown', the summary has '$inter'"; fail=1; continue
  fi
  ratio() { awk -v a="$1" -v l="$2" 'BEGIN { printf "%.4f", (l > 0 ? a / l : 1) }'; }
  if awk -v a="$arena" -v l="$live" -v i="$inter" 'BEGIN { exit !(i < l || a < i || a > 1.05 * i) }'; then
    echo "FAIL $spec: arena $arena interference bound $inter live bound $live: arena/interference" \
      "$(ratio "$arena" "$inter") (goal <= 1.05; a bound above the arena, or an interference bound" \
      "below the live bound, is a wrong bound)"
    fail=1
  else
    printf 'ok   %-45s arena %14s interference %14s live %14s arena/interference %s arena/live %s\n' \
      "$spec" "$arena" "$inter" "$live" "$(ratio "$arena" "$inter")" "$(ratio "$arena" "$live")"
  fi
  n=$((n + 1))
done
[ "$n" -gt 20 ] || { echo "FAIL: only $n specs found under $src"; exit 1; }
exit $fail
