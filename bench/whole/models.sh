# shellcheck shell=bash
# Whole benches: the model generators shared by bench/whole/balance.sh and
# bench/whole/memory.sh (sourced, not run). Each prints an mfsdp spec on
# stdout; the layouts are built-in names (docs/language.md). Invariants: the
# shapes are Llama-3-8B's and those of schedules/deepseek_moe.mfsdp; with its
# optional last argument left out a generator prints exactly the spec it
# printed before that argument existed (balance.sh's table depends on it).
#
#   mesh_line MESH                     "8" -> `mesh dp = 8;`, "2x4" -> dp_outer x dp_inner
#   embed MESH BALANCE FLAT VOCAB DIM  the mesh, balance and the embedding unit
#   llama MESH BALANCE WHOLE FLAT [MATRIX]
#       Llama-3-8B: 32 blocks of q, k, v, o, gate, up, down in WHOLE, their
#       norms in FLAT; the embedding and the head's output matrix in MATRIX
#       (default FLAT), the final norm in FLAT
#   moe MESH BALANCE WHOLE FLAT [MATRIX]
#       the DeepSeek-like MoE: 4 layers of attention, 2 shared and 64 routed
#       experts (3 matrices each) in WHOLE, the norms and the router ddp; the
#       embedding and the head's output matrix in MATRIX (default FLAT)

# mesh_line MESH: "8" -> a 1-D mesh, "2x4" -> dp_outer x dp_inner
mesh_line() {
  case $1 in
    *x*) echo "mesh dp_outer = ${1%x*}, dp_inner = ${1#*x};" ;;
    *) echo "mesh dp = $1;" ;;
  esac
}

# embed MESH BALANCE FLAT VOCAB DIM: the lines every model starts with
embed() {
  cat <<SPEC
$(mesh_line "$1")
balance $2;
unit "embed" layout $3 {
  tensor "tok_embeddings.weight" [$4, $5];
}
SPEC
}

# head_line FLAT [MATRIX]: the head unit's opening line, in MATRIX when given
# (then llama gives the final norm FLAT by a per-tensor layout)
head_line() {
  echo "unit \"head\" layout ${2:-$1} {"
}

# llama MESH BALANCE WHOLE FLAT [MATRIX]
llama() {
  embed "$1" "$2" "${5:-$4}" 128256 4096
  cat <<SPEC
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
$(head_line "$4" "${5:-}")
  tensor "norm.weight"   [4096]${5:+ layout $4};
  tensor "output.weight" [128256, 4096];
}
SPEC
}

# moe MESH BALANCE WHOLE FLAT [MATRIX]
moe() {
  embed "$1" "$2" "${5:-$4}" 10240 512
  cat <<SPEC
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
$(head_line "$4" "${5:-}")
  tensor "norm.weight"   [512] layout ddp;
  tensor "output.weight" [10240, 512];
}
SPEC
}
