#!/usr/bin/env bash
# One table of input limits (issue 25; core/mf_limits.h): the language
# (mfsdpc compile), the schedule loader (mfsdp-replay, mfsdpc simulate on a
# schedule) and the planner (mfsdpc plan) refuse input beyond the same
# limits with a located message naming the limit, and take input at them.
# (A mutated schedule with microbatches 2^40 loaded and ran for minutes.)
#
#   limits.sh MFSDPC MFSDP_REPLAY SPEC WORKDIR
# SPEC: a valid spec of 4 ranks whose first `microbatches` line is its own.
set -u
mfsdpc=$1 replay=$2 spec=$3 work=$4
. "$(dirname "$0")/cli_lib.sh"
cli_begin "$work"

# sub IN OUT OLD NEW [N]: OUT is IN with the first OLD replaced by NEW, in
# which each '@' stands for N bytes 'n' (a 1 MiB name, too long for argv)
sub() { python3 -c 'import sys; s=open(sys.argv[1]).read(); assert sys.argv[3] in s, sys.argv[3]
new = sys.argv[4].replace("@", "n" * int(sys.argv[5])) if len(sys.argv) > 5 else sys.argv[4]
open(sys.argv[2], "w").write(s.replace(sys.argv[3], new, 1))' "$@"; }

"$mfsdpc" compile "$spec" -o s.yaml || { fail "cannot compile $spec"; exit 1; }
mb=$(grep -m1 -E '^microbatches [0-9]+;' "$spec") || { fail "no microbatches line in $spec"; exit 1; }
unit=$(sed -n 's/^unit "\([^"{}]*\)".*/\1/p' "$spec" | head -n 1)
[ -n "$unit" ] || { fail "no plain unit name in $spec"; exit 1; }
# a loadable schedule reaches the world check (so the loader took it)
loads="does not match the mesh"

# ---- microbatches: 65536 ----
sub "$spec" mb_max.mfsdp "$mb" "microbatches 65536;"
sub "$spec" mb_over.mfsdp "$mb" "microbatches 65537;"
expect 0 "" "$mfsdpc" check mb_max.mfsdp
expect 1 "mb_over.mfsdp:[0-9]+:[0-9]+: error: microbatches 65537 is too many \(limit is 65536\)" \
  "$mfsdpc" check mb_over.mfsdp
"$mfsdpc" compile mb_max.mfsdp -o mb_max.yaml || fail "cannot compile mb_max.mfsdp"
sub s.yaml mb_over.yaml "$(grep -m1 '^microbatches:' s.yaml)" "microbatches: 1099511627776"
expect 2 "$loads" "$replay" mb_max.yaml --ranks 3
expect 2 "mb_over.yaml:[0-9]+:[0-9]+: error: microbatches must be at most 65536, got 1099511627776" \
  "$replay" mb_over.yaml --ranks 3
expect 1 "microbatches must be at most 65536" "$mfsdpc" simulate mb_over.yaml
sub s.yaml pf_over.yaml "$(grep -m1 '^prefetch:' s.yaml)" "prefetch: 1025"
expect 2 "pf_over.yaml:[0-9]+:[0-9]+: error: prefetch must be at most 1024, got 1025" "$replay" pf_over.yaml

# ---- the mesh: 2^24 ranks, each axis size too ----
mesh=$(grep -m1 '^mesh ' "$spec")
sub "$spec" world_max.mfsdp "$mesh" "mesh a = 4096, b = 4096;"
sub "$spec" world_over.mfsdp "$mesh" "mesh a = 4096, b = 8192;"
expect 0 "" "$mfsdpc" check world_max.mfsdp
expect 1 "world_over.mfsdp:[0-9]+:[0-9]+: error: the mesh has 33554432 ranks \(limit is 16777216\)" \
  "$mfsdpc" check world_over.mfsdp
axes=$(grep -m1 '^mesh:' s.yaml)
sub s.yaml world_over.yaml "$axes" "mesh: {axes: [{name: dp_outer, size: 8192}, {name: dp_inner, size: 4096}]}"
sub s.yaml axis_over.yaml "$axes" "mesh: {axes: [{name: dp_outer, size: 4294967296}, {name: dp_inner, size: 2}]}"
expect 2 "world_over.yaml:[0-9]+:[0-9]+: error: the mesh has 33554432 ranks \(limit is 16777216\)" \
  "$replay" world_over.yaml
expect 2 "axis_over.yaml:[0-9]+:[0-9]+: error: the axis size must be at most 16777216, got 4294967296" \
  "$replay" axis_over.yaml

# ---- names: 1 MiB ----
sub "$spec" name_max.mfsdp "\"$unit\"" '"@"' 1048576
sub "$spec" name_over.mfsdp "\"$unit\"" '"@"' 1048577
expect 0 "" "$mfsdpc" check name_max.mfsdp
expect 1 "name_over.mfsdp:[0-9]+:[0-9]+: error: a name of 1048577 bytes is too long \(limit is 1048576\)" \
  "$mfsdpc" check name_over.mfsdp
tensor=$(sed -n 's/^  - {name: \([^,]*\), offset: .*/\1/p' s.yaml | head -n 1)   # named once
sub s.yaml name_max.yaml "{name: $tensor," "{name: @," 1048576
sub s.yaml name_over.yaml "{name: $tensor," "{name: @," 1048577
expect 2 "$loads" "$replay" name_max.yaml --ranks 3
expect 2 "name_over.yaml:[0-9]+:[0-9]+: error: the tensor name of 1048577 bytes is too long \(limit is 1048576\)" \
  "$replay" name_over.yaml --ranks 3

# ---- plan: 4 000 000 candidates (100 000 with --exhaustive), refused at once ----
{ echo "mesh dp_outer = 2, dp_inner = 4;"; echo "microbatches 2;"
  for i in 1 2 3 4 5 6; do echo "unit \"u$i\" layout auto { tensor \"w$i\" [$((100 + i)), 64]; }"; done; } > plan6.mfsdp
head -n 6 plan6.mfsdp > plan4.mfsdp
expect 1 "plan6.mfsdp: error: the search space is too large: more than 4000000 candidates .*narrow it: .*loop.*fix the layouts.*prefetch and bucket_size" \
  timeout 10 "$mfsdpc" plan plan6.mfsdp --memory 1GiB
expect 1 "more than 100000 candidates for --exhaustive" timeout 10 "$mfsdpc" plan plan4.mfsdp --memory 1GiB --exhaustive
ran=$((ran + 1))
if timeout 60 "$mfsdpc" plan plan4.mfsdp --memory 1GiB >out.txt 2>err.txt && grep -q '^search: [0-9]* candidates' out.txt; then
  echo "ok: plan4.mfsdp (within the limit) is searched: $(grep '^search:' out.txt | cut -c1-80)"
else fail "plan within the limit: $(head -c 300 err.txt)"; fi

cli_end
