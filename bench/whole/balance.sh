#!/usr/bin/env bash
# Whole: owner balance (docs/performance.md, "Whole: owner balance"). For
# Llama-3-8B (32 blocks of q, k, v, o, gate, up, down Whole; norms, the
# embedding and the head Flat) and a DeepSeek-like MoE (the shapes of
# schedules/deepseek_moe.mfsdp: 64 routed experts of 3 matrices a layer, all
# Whole; norms and the router replicated) on 8, 16, 32 and 64 ranks, 1-D
# (zero3_whole) and 2-D (hfsdp_whole), with `balance bytes` and `balance
# flops`: max/mean over the ranks of the owned main_weight bytes and of the
# owned Newton-Schulz FLOPs, the padding factor (sum of P*S over sum of the
# used elements, whole buckets) and the bytes per rank of the whole buckets'
# collectives in the used-prefix form against the padded form (per launch,
# summed). Every figure is `mfsdpc explain --format yaml`'s (owners,
# owners_per_rank), so the table is what explain prints.
#
#   bench/whole/balance.sh [MFSDPC]            the table
#   bench/whole/balance.sh --check [MFSDPC]    Llama-3-8B on 8 and 2x4 only;
#       exit 1 when its owned bytes max/mean is over 1.05 (CTest whole_balance)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
mfsdpc=${1:-$root/build/test/planner/mfsdpc}
[ -x "$mfsdpc" ] || { echo "balance.sh: $mfsdpc not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# mesh_line MESH: "8" -> a 1-D mesh, "2x4" -> dp_outer x dp_inner
mesh_line() {
  case $1 in
    *x*) echo "mesh dp_outer = ${1%x*}, dp_inner = ${1#*x};" ;;
    *) echo "mesh dp = $1;" ;;
  esac
}

# llama MESH BALANCE WHOLE FLAT
llama() {
  cat <<SPEC
$(mesh_line "$1")
balance $2;
unit "embed" layout $4 {
  tensor "tok_embeddings.weight" [128256, 4096];
}
unit "layers.{i}" for i in 0..32 layout $3 {
  tensor "attention.wq.weight"     [4096, 4096];
  tensor "attention.wk.weight"     [1024, 4096];
  tensor "attention.wv.weight"     [1024, 4096];
  tensor "attention.wo.weight"     [4096, 4096];
  tensor "feed_forward.w1.weight"  [14336, 4096];
  tensor "feed_forward.w3.weight"  [14336, 4096];
  tensor "feed_forward.w2.weight"  [4096, 14336];
  tensor "attention_norm.weight"   [4096] layout $4;
  tensor "ffn_norm.weight"         [4096] layout $4;
}
unit "head" layout $4 {
  tensor "norm.weight"   [4096];
  tensor "output.weight" [128256, 4096];
}
SPEC
}

# moe MESH BALANCE WHOLE FLAT
moe() {
  cat <<SPEC
$(mesh_line "$1")
balance $2;
unit "embed" layout $4 {
  tensor "tok_embeddings.weight" [10240, 512];
}
unit "layers.{i}" for i in 0..4 layout $3 {
  tensor "attention.wq.weight"       [512, 512];
  tensor "attention.wkv_a.weight"    [576, 512];
  tensor "attention.wkv_b.weight"    [1024, 512];
  tensor "attention.wo.weight"       [512, 512];
  tensor "attention_norm.weight"     [512] layout ddp;
  tensor "ffn_norm.weight"           [512] layout ddp;
  tensor "moe.gate.weight"           [64, 512] layout ddp;
  for s in 0..2 {
    tensor "moe.shared_experts.{s}.w1.weight" [176, 512];
    tensor "moe.shared_experts.{s}.w2.weight" [512, 176];
    tensor "moe.shared_experts.{s}.w3.weight" [176, 512];
  }
  for e in 0..64 {
    tensor "moe.experts.{e}.w1.weight" [176, 512];
    tensor "moe.experts.{e}.w2.weight" [512, 176];
    tensor "moe.experts.{e}.w3.weight" [176, 512];
  }
}
unit "head" layout $4 {
  tensor "norm.weight"   [512] layout ddp;
  tensor "output.weight" [10240, 512];
}
SPEC
}

# figures YAML: "owned flops padding prefix padded" from explain's YAML
figures() {
  awk '
    /^    max_over_mean_ppm:/ {
      match($0, /owned_bytes: [0-9]+/); ob = substr($0, RSTART + 13, RLENGTH - 13)
      match($0, /ns_flops: [0-9]+/); fl = substr($0, RSTART + 10, RLENGTH - 10) }
    /^      shards: / { P = $2 }
    /^      shard_length: / { len += P * $2 }
    /^      used: / { used += $2 }
    /prefix_bytes: / {
      match($0, /prefix_bytes: [0-9]+/); pre += substr($0, RSTART + 14, RLENGTH - 14)
      match($0, /padded_bytes: [0-9]+/); pad += substr($0, RSTART + 14, RLENGTH - 14) }
    END { printf "%.4f %.4f %.4f %.4f\n", ob / 1e6, fl / 1e6, used ? len / used : 1, pad ? pre / pad : 1 }
  ' "$1"
}

if [ $check = 1 ]; then
  models=llama meshes="8 2x4" balances=bytes
else
  models="llama moe" meshes="8 16 32 64 2x4 2x8 4x8 8x8" balances="bytes flops"
fi
printf '%-8s %-6s %-7s %14s %14s %9s %15s\n' model mesh balance "owned B max/mean" "NS FLOP max/mean" padding "prefix/padded"
fail=0
for model in $models; do
  for mesh in $meshes; do
    case $mesh in *x*) whole=hfsdp_whole flat=hfsdp ;; *) whole=zero3_whole flat=zero3 ;; esac
    for bal in $balances; do
      "$model" "$mesh" "$bal" "$whole" "$flat" > "$work/s.mfsdp"
      "$mfsdpc" explain --format yaml "$work/s.mfsdp" > "$work/s.yaml"
      read -r ob fl pf ratio < <(figures "$work/s.yaml")
      printf '%-8s %-6s %-7s %16s %16s %9s %15s\n' "$model" "$mesh" "$bal" "$ob" "$fl" "$pf" "$ratio"
      if [ $check = 1 ] && awk -v x="$ob" 'BEGIN { exit !(x > 1.05) }'; then
        echo "FAIL: $model on $mesh: owned bytes max/mean $ob > 1.05" >&2
        fail=1
      fi
    done
  done
done
exit $fail
