#!/usr/bin/env bash
# Whole: memory against Flat (docs/performance.md, "Whole: memory against
# Flat"; issue #41). For Llama-3-8B and the DeepSeek-like MoE of
# bench/whole/models.sh on the meshes 1 x 8 (written `dp = 8`), 2 x 8, 4 x 8
# and 8 x 8, three placements of the same tensors:
#   Flat           every unit zero3 (1-D) or hfsdp (2-D)
#   blocks Whole   the blocks' matrices zero3_whole / hfsdp_whole (grad and
#                  main_weight Whole), their norms, the embedding and the
#                  head Flat: the Muon recipe (matrix_optimizer="whole")
#   every 2-D Whole  the embedding and the head's output matrix Whole too
#                  (matrix_optimizer="whole_all")
# (the MoE's norms and router are ddp in all three). Each figure is the
# `plan/rank` line of `mfsdpc explain` (docs/semantics.md §9: the allocated
# peak per rank plus the optimizer state, what `mfsdpc plan` budgets), the
# ratio is over Flat's, and `padding` is Σ L / Σ used over the whole
# buckets (explain --format yaml, `owners`: padding_factor_ppm = L / used):
# how much longer a whole bucket is than its tensors (ragged shards since
# format 7: only each shard's alignment). Invariant: every number is explain's;
# a failed explain or a missing plan/rank line stops the script (exit 1).
#
#   bench/whole/memory.sh [MFSDPC] [EXPLAIN OPTIONS]   e.g. --optimizer-bytes 4
#   bench/whole/memory.sh --check [MFSDPC]   issue #41's target only: Llama-3-8B
#       blocks Whole <= 1.05x Flat's plan/rank on 1 x 8, 4 x 8 and 8 x 8; exit 1
#       naming the mesh otherwise (CTest whole_memory)
#   (default MFSDPC build/test/planner/mfsdpc; explain's default optimizer
#   state is 8 bytes per main_weight element held, Adam's; Muon's is 4)
set -euo pipefail
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mfsdpc=$root/build/test/planner/mfsdpc
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then mfsdpc=$1; shift; fi
[ -x "$mfsdpc" ] || { echo "memory.sh: $mfsdpc not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# mesh_line, embed, llama, moe: the models (bench/whole/models.sh)
# shellcheck source-path=SCRIPTDIR source=models.sh
. "$here/models.sh"

# plan_bytes MODEL MESH WHOLE FLAT [MATRIX]: "BYTES PADDING" of one spec
plan_bytes() {
  local model=$1 mesh=$2 what="$1 on $2 (${*:3})" bytes pad
  "$model" "$mesh" bytes "${@:3}" > "$work/s.mfsdp"
  if ! "$mfsdpc" explain "$work/s.mfsdp" "${opts[@]}" > "$work/s.txt" 2> "$work/err" ||
     ! "$mfsdpc" explain --format yaml "$work/s.mfsdp" "${opts[@]}" > "$work/s.yaml" 2>> "$work/err"; then
    echo "memory.sh: mfsdpc explain failed for $what:" >&2
    cat "$work/err" >&2
    exit 1
  fi
  bytes=$(sed -n 's/^plan\/rank  *[^(]*(\([0-9]*\) bytes).*/\1/p' "$work/s.txt")
  [ -n "$bytes" ] || { echo "memory.sh: no plan/rank line in explain's output for $what" >&2; exit 1; }
  pad=$(awk '/^      used: / { u = $2; used += $2 }
             /^      padding_factor_ppm: / { len += u * $2 / 1e6 }
             END { printf "%.2f", used ? len / used : 1 }' "$work/s.yaml")
  echo "$bytes $pad"
}

# row MODEL MESH UNIT: one line of the table, figures in UNIT (GiB or MiB);
# MESH 1xN is the 1-D mesh `dp = N` (zero3), labelled 1xN
row() {
  local whole=zero3_whole flat=zero3 f b e fb bb bp eb ep
  case $2 in 1x*) set -- "$1" "${2#1x}" "$3" "$2" ;; *x*) whole=hfsdp_whole flat=hfsdp ;; esac
  f=$(plan_bytes "$1" "$2" "$flat" "$flat") || exit 1
  b=$(plan_bytes "$1" "$2" "$whole" "$flat") || exit 1
  e=$(plan_bytes "$1" "$2" "$whole" "$flat" "$whole") || exit 1
  read -r fb _ <<< "$f"
  read -r bb bp <<< "$b"
  read -r eb ep <<< "$e"
  awk -v m="$1" -v mesh="${4:-$2}" -v u="$3" -v f="$fb" -v b="$bb" -v bp="$bp" -v e="$eb" -v ep="$ep" 'BEGIN {
    d = (u == "GiB") ? 2^30 : 2^20
    printf "%-6s %-5s %11.1f %-3s %11.1f %-3s %7.3fx %7sx %11.1f %-3s %7.3fx %7sx\n",
      m, mesh, f / d, u, b / d, u, b / f, bp, e / d, u, e / f, ep }'
}

opts=("$@")
if [ $check = 1 ]; then
  fail=0
  for mesh in 1x8 4x8 8x8; do
    m=$mesh whole=hfsdp_whole flat=hfsdp
    case $mesh in 1x*) m=${mesh#1x} whole=zero3_whole flat=zero3 ;; esac
    f=$(plan_bytes llama "$m" "$flat" "$flat") || exit 1
    b=$(plan_bytes llama "$m" "$whole" "$flat") || exit 1
    read -r fb _ <<< "$f"
    read -r bb _ <<< "$b"
    if awk -v f="$fb" -v b="$bb" 'BEGIN { exit !(b > 1.05 * f) }'; then
      echo "FAIL: llama $mesh blocks Whole plan/rank $bb bytes > 1.05 x Flat's $fb"
      fail=1
    else
      awk -v m="$mesh" -v f="$fb" -v b="$bb" 'BEGIN { printf "ok: llama %s blocks Whole %.3fx Flat\n", m, b / f }'
    fi
  done
  exit $fail
fi
printf '%-6s %-5s %15s %15s %8s %8s %15s %8s %8s\n' model mesh Flat "blocks Whole" ratio padding \
  "every 2-D Whole" ratio padding
for mesh in 1x8 2x8 4x8 8x8; do row llama "$mesh" GiB; done
for mesh in 1x8 2x8 4x8 8x8; do row moe "$mesh" MiB; done
