#!/usr/bin/env bash
# mfsdpc plan benchmark (docs/performance.md §plan): CPU seconds of one
# `mfsdpc plan` per (model, mesh, budget) for the Llama-3-8B and DeepSeek-MoE
# specs of schedules/ with every unit declared `layout auto`, on 4 x 8 and
# 2 x 4 x 4 meshes, each time next to the 1 s goal of issue 17 (docs/plan.md);
# then how the time grows with the units of a loop and with the number of
# `auto` declarations. Prints tables; not a test.
#
#   bench/plan/run.sh [MFSDPC]      (default build/test/planner/mfsdpc)
#
# Times are user + system CPU seconds of the process (the search is
# single-threaded; on a loaded machine wall time is inflated by waiting for
# a core, CPU time is not), the fastest of 3 runs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mfsdpc=${1:-$root/build/test/planner/mfsdpc}
[ -x "$mfsdpc" ] || { echo "run.sh: $mfsdpc not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# auto_spec SRC MESH OUT: every unit `layout auto` (auto_spec.awk).
auto_spec() {
  awk -v mesh="$2" -f "$here/auto_spec.awk" "$1" > "$3"
}

# cpu CMD...: prints "SECONDS STATUS" (fastest of 3), stdout of the last run in $work/last.txt
cpu() {
  best=""
  for _ in 1 2 3; do
    /usr/bin/time -f "%U %S" -o "$work/t" "$@" > "$work/last.txt" 2>/dev/null && st=ok || st="exit $?"
    t=$(tail -n1 "$work/t" | awk '{ printf "%.3f", $1 + $2 }')
    if [ -z "$best" ] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t; fi
  done
  echo "$best $st"
}

echo "machine: $(nproc) cores, $(uname -m), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
printf '%-14s %-12s %-8s %7s %11s %10s %9s %8s  %-16s %s\n' model mesh budget units candidates simulated memonly \
  "cpu s" "goal <= 1 s" status
for model in llama3_8b_hfsdp deepseek_moe; do
  for mesh in "dp_outer = 4, dp_inner = 8" "node = 2, socket = 4, gpu = 4"; do
    auto_spec "$root/schedules/$model.mfsdp" "$mesh" "$work/in.mfsdp"
    short=$( [ "${mesh#node}" != "$mesh" ] && echo "2x4x4" || echo "4x8")
    for budget in 8GiB 16GiB 80GiB; do
      read -r secs st < <(cpu "$mfsdpc" plan "$work/in.mfsdp" --memory "$budget")
      line=$(sed -n 's/^search: \([0-9]*\) candidates, \([0-9]*\) simulated, \([0-9]*\) more.*/\1 \2 \3/p' "$work/last.txt")
      units=$(sed -n 's/.*, \([0-9]*\) units in.*/\1/p' "$work/last.txt")
      goal=$(awk -v t="$secs" 'BEGIN { print (t <= 1.0 ? "met" : sprintf("missed (%.1fx)", t)) }')
      printf '%-14s %-12s %-8s %7s %11s %10s %9s %8s  %-16s %s\n' "${model%%_hfsdp}" "$short" "$budget" "$units" \
        $line "$secs" "$goal" "$st"
    done
  done
done

echo
echo "growth with the units of one loop (one auto declaration of N identical blocks, 4 x 8):"
printf '%8s %11s %10s %8s\n' units candidates simulated "cpu s"
for n in 8 32 64 128; do
  cat > "$work/loop.mfsdp" <<SPEC
mesh dp_outer = 4, dp_inner = 8;
microbatches 8;
unit "embed" layout zero3 { tensor "tok_embeddings.weight" [128256, 4096]; }
unit "layers.{i}" for i in 0..$n layout auto {
  tensor "attention.wqkv.weight"   [6144, 4096];
  tensor "attention.wo.weight"     [4096, 4096];
  tensor "feed_forward.w13.weight" [28672, 4096];
  tensor "feed_forward.w2.weight"  [4096, 14336];
  tensor "attention_norm.weight"   [4096] layout ddp;
}
SPEC
  read -r secs st < <(cpu "$mfsdpc" plan "$work/loop.mfsdp" --memory 80GiB)
  line=$(sed -n 's/^search: \([0-9]*\) candidates, \([0-9]*\) simulated.*/\1 \2/p' "$work/last.txt")
  printf '%8s %11s %10s %8s  %s\n' "$n" $line "$secs" "$st"
done

echo
echo "growth with the auto declarations (K single-unit auto declarations + a 16-unit auto loop, 4 x 8):"
printf '%8s %11s %10s %8s\n' K candidates simulated "cpu s"
for k in 0 1 2 3; do
  {
    echo "mesh dp_outer = 4, dp_inner = 8;"
    echo "microbatches 8;"
    for i in $(seq 1 "$k"); do echo "unit \"extra$i\" layout auto { tensor \"w\" [32000, 4096]; }"; done
    echo 'unit "layers.{i}" for i in 0..16 layout auto { tensor "a" [6144, 4096]; tensor "b" [28672, 4096]; }'
  } > "$work/decl.mfsdp"
  read -r secs st < <(cpu "$mfsdpc" plan "$work/decl.mfsdp" --memory 80GiB)
  line=$(sed -n 's/^search: \([0-9]*\) candidates, \([0-9]*\) simulated.*/\1 \2/p' "$work/last.txt")
  printf '%8s %11s %10s %8s  %s\n' "$k" $line "$secs" "$st"
done
