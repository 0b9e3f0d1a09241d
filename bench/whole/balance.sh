#!/usr/bin/env bash
# Whole: owner balance (docs/performance.md, "Whole: owner balance"). For
# Llama-3-8B (32 blocks of q, k, v, o, gate, up, down Whole; norms, the
# embedding and the head Flat) and a DeepSeek-like MoE (the shapes of
# schedules/deepseek_moe.mfsdp: 64 routed experts of 3 matrices a layer, all
# Whole; norms and the router replicated) on 8, 16, 32 and 64 ranks, 1-D
# (zero3_whole) and 2-D (hfsdp_whole), with `balance bytes` and `balance
# flops`: max/mean over the ranks of the owned main_weight bytes, their max
# over explain's lower bound for any dealing, max/mean of the owned
# Newton-Schulz FLOPs, the padding factor (sum of P*S over sum of the
# used elements, whole buckets) and the bytes per rank of the whole buckets'
# collectives in the used-prefix form against the padded form (per launch,
# summed). Every figure is `mfsdpc explain --format yaml`'s (owners,
# owners_per_rank), so the table is what explain prints.
#
#   bench/whole/balance.sh [MFSDPC]            the table
#   bench/whole/balance.sh --check [MFSDPC]    Llama-3-8B on 8, 2x4, 64 and
#       8x8 and the MoE on 64 and 8x8, balance bytes; exit 1 when the owned
#       bytes' max/mean is over 1.05 and not proven the least any dealing
#       reaches (max/bound 1: explain's lower bound, docs/semantics.md §4.6)
#       (CTest whole_balance)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
mfsdpc=${1:-$root/build/test/planner/mfsdpc}
[ -x "$mfsdpc" ] || { echo "balance.sh: $mfsdpc not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# mesh_line, embed, llama, moe: the models (bench/whole/models.sh)
# shellcheck source-path=SCRIPTDIR source=models.sh
. "$here/models.sh"

# figures YAML: "owned flops padding prefix/padded owned/bound" from explain's YAML
figures() {
  awk '
    /^    max_over_mean_ppm:/ {
      match($0, /owned_bytes: [0-9]+/); ob = substr($0, RSTART + 13, RLENGTH - 13)
      match($0, /ns_flops: [0-9]+/); fl = substr($0, RSTART + 10, RLENGTH - 10) }
    /^      owned_bytes: \{bound:/ {
      match($0, /max_over_bound_ppm: [0-9]+/); obb = substr($0, RSTART + 20, RLENGTH - 20) }
    /^      shards: / { P = $2 }
    /^      shard_length: / { len += P * $2 }
    /^      used: / { used += $2 }
    /prefix_bytes: / {
      match($0, /prefix_bytes: [0-9]+/); pre += substr($0, RSTART + 14, RLENGTH - 14)
      match($0, /padded_bytes: [0-9]+/); pad += substr($0, RSTART + 14, RLENGTH - 14) }
    END { printf "%.4f %.4f %.4f %.4f %.4f\n", ob / 1e6, fl / 1e6, used ? len / used : 1, pad ? pre / pad : 1,
                 obb / 1e6 }
  ' "$1"
}

# run MODEL MESH BALANCE: one row; in --check, exit status 1 when the owned
# bytes' max/mean is over 1.05 and the dealing is not proven best (max/bound 1)
run() {
  local whole=zero3_whole flat=zero3 ob fl pf ratio obb
  case $2 in *x*) whole=hfsdp_whole flat=hfsdp ;; esac
  "$1" "$2" "$3" "$whole" "$flat" > "$work/s.mfsdp"
  if ! "$mfsdpc" explain --format yaml "$work/s.mfsdp" > "$work/s.yaml"; then
    echo "balance.sh: $mfsdpc explain failed on $1 $2 $3 (the spec: bench/whole/models.sh)" >&2
    exit 2
  fi
  read -r ob fl pf ratio obb < <(figures "$work/s.yaml")
  printf '%-8s %-6s %-7s %16s %16s %16s %9s %15s\n' "$1" "$2" "$3" "$ob" "$obb" "$fl" "$pf" "$ratio"
  if [ $check = 1 ] && awk -v x="$ob" -v b="$obb" 'BEGIN { exit !(x > 1.05 && b > 1.0) }'; then
    echo "FAIL: $1 on $2: owned bytes max/mean $ob > 1.05 and max/bound $obb > 1" >&2
    return 1
  fi
}

printf '%-8s %-6s %-7s %16s %16s %16s %9s %15s\n' model mesh balance "owned B max/mean" "owned B max/bnd" \
  "NS FLOP max/mean" padding "prefix/padded"
fail=0
if [ $check = 1 ]; then
  for row in "llama 8" "llama 2x4" "llama 64" "llama 8x8" "moe 64" "moe 8x8"; do
    run $row bytes || fail=1
  done
  exit $fail
fi
for model in llama moe; do
  for mesh in 8 16 32 64 2x4 2x8 4x8 8x8; do
    for bal in bytes flops; do
      run "$model" "$mesh" "$bal" || fail=1
    done
  done
done
exit $fail
