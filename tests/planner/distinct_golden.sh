#!/bin/sh
# Golden listings of the Distinct placement (docs/semantics.md §4.7): explain
# of schedules/deepseek_moe_ep.mfsdp (text: the groups each collective spans),
# explain --format yaml and diffs of a small EP spec (another layout; without
# its global names), and plan keeping a Distinct layout fixed.
#   distinct_golden.sh MFSDPC SRC_DIR SCHEDULES WORK_DIR   (UPDATE=1 rewrites the goldens)
set -eu
mfsdpc=$1 src=$2/distinct schedules=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cp "$src"/*.mfsdp "$schedules"/deepseek_moe_ep.mfsdp "$work"/ && cd "$work"
. "$2/golden_lib.sh"
check explain_ep.expected "$mfsdpc" explain deepseek_moe_ep.mfsdp
check explain_small.yaml.expected "$mfsdpc" explain --format yaml ep_small.mfsdp
for f in ep_small ep_flat; do "$mfsdpc" compile $f.mfsdp -o $f.yaml; done
check diff_flat.expected "$mfsdpc" diff ep_flat.yaml ep_small.yaml
# the same spec without its global names: diff names each tensor whose
# global names (a checkpoint's tensors) changed
sed 's/ global "[^"]*"//' ep_small.mfsdp > ep_nameless.mfsdp
check diff_global.expected "$mfsdpc" diff ep_nameless.mfsdp ep_small.mfsdp
# the expert collectives span the expert-data-parallel groups only, at the
# ring bound per group (tests/planner/test_distinct.c computes them by hand)
for want in "0   all_gather      dp_inner     inner  bf16  RDF   RDR   every         4325376        8650752" \
            "0   all_reduce      dp_outer     outer  fp32  PDF   RDF   last          4325376       17301504" \
            "over dp_outer within each (ep, dp_inner): 4 groups of 2 ranks, never across ep (Distinct)"; do
    grep -qF "$want" "$src/explain_ep.expected" || { echo "FAIL: explain_ep.expected lacks '$want'"; fail=1; }
done
# plan chooses the auto units' layout and keeps the Distinct one
"$mfsdpc" plan ep_auto.mfsdp --memory 1MiB -o planned.mfsdp > plan.out 2>&1 || { cat plan.out; fail=1; }
grep -q "grad        fp32 \[Partial, Distinct, Flat\];" planned.mfsdp || { echo "FAIL: plan dropped Distinct"; fail=1; }
grep -q 'layout experts;' planned.mfsdp || { echo "FAIL: plan changed the experts' layout"; fail=1; }
"$mfsdpc" compile planned.mfsdp -o planned.yaml || fail=1
grep -q "format: mfsdp-schedule/6" planned.yaml || { echo "FAIL: planned schedule is not format 6"; fail=1; }
exit $fail
