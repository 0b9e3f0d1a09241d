#!/usr/bin/env bash
# Regenerates seeds/schedules/*.yaml: small compiled schedules (every mode of
# docs/semantics.md §4.5 on small meshes, two units, tensors that do not divide evenly)
# for the schedule fuzz targets. Small seeds keep each libFuzzer execution
# fast and mutations meaningful; schedules/*.yaml are seeds too.
#
#   bash tests/fuzz/make-seeds.sh path/to/mfsdpc
set -euo pipefail
mfsdpc=${1:?usage: make-seeds.sh MFSDPC}
out=$(cd "$(dirname "$0")" && pwd)/seeds/schedules
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"

# name | mesh | microbatches | weight | grad | main_weight
modes='
ddp_2|dp = 2|2|[Replicate]|[Partial]|[Replicate]
zero1_3|dp = 3|1|[Replicate]|[Partial]|[Flat]
zero2_2|dp = 2|2|[Replicate]|[Flat]|[Flat]
zero3_4|dp = 4|2|[Flat]|[Flat]|[Flat]
single_1x1|dp_outer = 1, dp_inner = 1|1|[Replicate, Flat]|[Partial, Flat]|[Flat, Flat]
hsdp_2x2|dp_outer = 2, dp_inner = 2|2|[Replicate, Flat]|[Partial, Flat]|[Replicate, Flat]
hfsdp_2x2|dp_outer = 2, dp_inner = 2|3|[Replicate, Flat]|[Partial, Flat]|[Flat, Flat]
hfsdp_3x2|dp_outer = 3, dp_inner = 2|1|[Replicate, Flat]|[Partial, Flat]|[Flat, Flat]
nosync_2x2|dp_outer = 2, dp_inner = 2|2|[Replicate, Flat]|[Partial, Partial]|[Replicate, Flat]
fsdp2d_2x2|dp_outer = 2, dp_inner = 2|2|[Flat, Flat]|[Flat, Flat]|[Flat, Flat]
z2z1_2x2|dp_outer = 2, dp_inner = 2|2|[Replicate, Replicate]|[Partial, Flat]|[Flat, Flat]
ddp2d_2x2|dp_outer = 2, dp_inner = 2|1|[Replicate, Replicate]|[Partial, Partial]|[Replicate, Replicate]
hfsdp_2x2x2|a = 2, b = 2, c = 2|2|[Replicate, Replicate, Flat]|[Partial, Partial, Flat]|[Flat, Flat, Flat]
'
while IFS='|' read -r name mesh mb w g o; do
  [ -n "$name" ] || continue
  n=$(awk -F, '{print NF}' <<<"$o")
  rep=$(printf 'Replicate, %.0s' $(seq "$n")); rep="[${rep%, }]"
  part=$(printf 'Partial, %.0s' $(seq "$n")); part="[${part%, }]"
  cat >"$tmp/$name.mfsdp" <<SPEC
mesh $mesh;
microbatches $mb;
layout main {
  weight      bf16 $w;
  grad        fp32 $g;
  main_weight fp32 $o;
}
layout norms {
  weight      fp32 $rep;
  grad        fp32 $part;
  main_weight fp32 $rep;
}
unit "embed" layout main {
  tensor "w" [7, 5];
}
unit "block" layout main {
  reshard_after_forward false;
  tensor "a" [9];
  tensor "n" [3] layout norms;
}
SPEC
  (cd "$tmp" && "$mfsdpc" compile "$name.mfsdp" -o "$out/$name.yaml")
done <<<"$modes"
ls "$out"
