#!/bin/sh
# Golden listings of Whole (docs/semantics.md §9.1): explain's owners table
# and owners per rank (text, and YAML), and diff's owner changes.
#   whole_golden.sh MFSDPC SRC_DIR WORK_DIR     (UPDATE=1 rewrites the goldens)
set -eu
mfsdpc=$1 src=$2/whole work=$3
rm -rf "$work" && mkdir -p "$work" && cp "$src"/*.mfsdp "$work"/ && cd "$work"
. "$2/golden_lib.sh"
check explain_1d.expected "$mfsdpc" explain explain_1d.mfsdp
check explain_2d.yaml.expected "$mfsdpc" explain --format yaml explain_2d.mfsdp
for f in explain_1d diff_flat diff_bytes diff_flops; do "$mfsdpc" compile $f.mfsdp -o $f.yaml; done
check diff_flat.expected "$mfsdpc" diff diff_flat.yaml explain_1d.yaml
check diff_owners.expected "$mfsdpc" diff diff_bytes.yaml diff_flops.yaml
# the hand-computed figures of explain_1d (test_whole_cost.c) are in its golden
for want in "T2 all_gather dp                             4200             6144" \
            "padding factor L/sum(used) = 2560 / 2414 = 1.0605 (ragged shards, the longest 1024)"; do
    grep -qF "$want" "$src/explain_1d.expected" || { echo "FAIL: explain_1d.expected lacks '$want'"; fail=1; }
done
grep -q "tensor blk.x: main_weight owner shard 0 -> shard 1" "$src/diff_owners.expected" || { echo "FAIL: x's owner"; fail=1; }
exit $fail
