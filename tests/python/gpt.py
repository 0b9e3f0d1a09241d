"""
gpt: the GPT-style model of the Python tests and of bench/torch_vs_fsdp2:
a token embedding tied to the LM head, learned positions, blocks of
LayerNorm + causal self-attention + MLP with residuals, a final LayerNorm.
Small on purpose (the tests run 4 processes on 2 cores); attention is written
out (no fused kernel) so every rank computes in the same order.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)   # a key bias has zero gradient: Adam would amplify noise
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln_1(x)
        q, k, v = self.qkv(h).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=4, seq=16, checkpoint=()):
        super().__init__()
        self.checkpoint = set(checkpoint)   # indices of blocks run under activation checkpointing
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight    # tied

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for i, blk in enumerate(self.blocks):
            if i in self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_model(seed=0, **kw):
    torch.manual_seed(seed)
    m = GPT(**kw)
    with torch.no_grad():   # non-trivial norms so their gradients matter
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.1, 0.1)
    return m


def make_data(steps, world, M, b, seq=16, vocab=64, seed=1):
    """tokens[step][rank][m] -> (idx, targets) of shape [b, seq]: a synthetic
    sequence task (next token = a fixed permutation of the current one, plus noise)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(vocab, generator=g)
    n = steps * world * M * b
    x = torch.randint(0, vocab, (n, seq + 1), generator=g)
    for j in range(1, seq + 1):
        keep = torch.rand(n, generator=g) < 0.8
        x[:, j] = torch.where(keep, perm[x[:, j - 1]], x[:, j])
    x = x.view(steps, world, M, b, seq + 1)
    return x[..., :-1].contiguous(), x[..., 1:].contiguous()
