"""
tinyllama: a small Llama-shaped model written out for the tests of the FSDP2
build flow (test_fsdp2_flow.py), shaped as Hugging Face's LlamaForCausalLM
is, without needing transformers: the decoder layers in `model.layers` (a
ModuleList inside a child), `_no_split_modules`, RMSNorm, rotary positions
from a non-persistent buffer, an embedding with a padding row, and HF's
`_init_weights(module)` applied with model.apply (normal_ for linears and the
embedding, its padding row zeroed through weight[i], ones_ for the norms,
the rotary buffer recomputed). Attention is written out (no fused kernel).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rotate(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class DecoderLayer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.o_proj((att @ v).transpose(1, 2).reshape(b, t, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Inner(nn.Module):
    def __init__(self, vocab, d, heads, ff, layers):
        super().__init__()
        self.head_dim = d // heads
        self.embed_tokens = nn.Embedding(vocab, d, padding_idx=0)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, ff) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.register_buffer("inv_freq", self.rope(), persistent=False)

    def rope(self):
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float32)
        return 1.0 / (10000.0 ** (half / self.head_dim))

    def forward(self, ids):
        t = ids.shape[1]
        ang = torch.arange(t, dtype=torch.float32, device=ids.device)[:, None] * self.inv_freq
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos(), ang.sin()
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class TinyLlama(nn.Module):
    _no_split_modules = ["DecoderLayer"]

    def __init__(self, vocab=96, d=32, heads=4, ff=64, layers=4, std=0.02):
        super().__init__()
        self.std = std
        self.model = Inner(vocab, d, heads, ff, layers)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def _init_weights(self, module):
        """Hugging Face's PreTrainedModel._init_weights, for these modules."""
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.std)
            if module.padding_idx is not None:
                nn.init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, Inner):
            with torch.no_grad():
                module.inv_freq.copy_(module.rope())

    def forward(self, input_ids, labels):
        logits = self.lm_head(self.model(input_ids))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               labels[:, 1:].reshape(-1))


def on_meta(seed=0, **kw):
    """The FSDP2 build: on meta, nothing allocated (the seed is set for the init)."""
    torch.manual_seed(seed)
    with torch.device("meta"):
        return TinyLlama(**kw)


def reference(seed=0, **kw):
    """One process, the same flow on the whole model: meta, to_empty, _init_weights."""
    m = on_meta(seed, **kw)
    m.to_empty(device="cpu")
    m.apply(m._init_weights)
    return m
