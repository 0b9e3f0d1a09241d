#!/usr/bin/env bash
# Where the time of one `mfsdpc plan` goes (docs/performance.md, section on
# `mfsdpc plan`): records the command under `perf record --call-graph dwarf`
# and prints the inclusive share of the search's stages: the layout pass,
# the transition pass, the memory bound, the lowering, the simulation, and
# the text formatting inside them. Not a test; needs perf (linux-perf).
#
#   bench/plan/profile.sh MODEL MESH [BUDGET] [MFSDPC]
#     MODEL   a spec of schedules/ without .mfsdp (llama3_8b_hfsdp, deepseek_moe)
#     MESH    "dp_outer = 4, dp_inner = 8" or "node = 2, socket = 4, gpu = 4"
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 MODEL MESH [BUDGET] [MFSDPC]" >&2; exit 2; }
model=$1 mesh=$2 budget=${3:-16GiB}
mfsdpc=${4:-$root/build/test/planner/mfsdpc}
[ -x "$mfsdpc" ] || { echo "profile.sh: $mfsdpc not found" >&2; exit 2; }
[ -f "$root/schedules/$model.mfsdp" ] || { echo "profile.sh: no schedules/$model.mfsdp" >&2; exit 2; }
command -v perf >/dev/null || { echo "profile.sh: perf not found (apt-get install linux-perf)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk -v mesh="$mesh" -f "$here/auto_spec.awk" "$root/schedules/$model.mfsdp" > "$work/in.mfsdp"
perf record -q -F 499 --call-graph dwarf,16384 -o "$work/perf.data" \
  "$mfsdpc" plan "$work/in.mfsdp" --memory "$budget" > "$work/out.txt" 2>/dev/null || true
grep '^search:' "$work/out.txt" || true
echo "inclusive share of the samples:"
perf report -i "$work/perf.data" --children --stdio -g none 2>/dev/null |
  awk '$NF ~ /^(mf_plan_search_evaluate_pruned|mf_layout_pass_run|mf_transition_run|layout_mem_bound|mf_live_build|mf_live_lower_bound|mf_interfere_bound|mf_assign_run_live|mf_lower_run|mf_simulate|__vsnprintf_internal|mf_plan_search_lower_bounds|mf_assign_run|mf_plan_new|mf_plan_free|place_group|mf_arena_printf|mf_arena_strdup|malloc|free|mf_schedule_summarize|mf_lower_drop_redundant_waits|mf_lower_cross_check|candidates|evaluate|build|check_legal|mf_simulate_run|find_critical_path|find_exposed|issue_hook|mf_arena_create|mf_arena_destroy|mf_schedule_new|mf_schedule_free|mf_layout_pass_tensor_quantum)$/ {
         printf "  %8s  %s\n", $1, $NF }'
