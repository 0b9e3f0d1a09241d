"""
tied_models: the two tied GPT variants of test_ties.py, built from gpt.py's
blocks (same sizes, same data):

  ByUse    the head is F.linear(ln_f(x), self.tok.weight): one parameter
           under one name, read outside its unit (a tie only a traced
           forward, or ties=, can find);
  GPT2     Hugging Face GPT-2's names (transformer.wte / wpe / h.{i} /
           ln_f, lm_head.weight = transformer.wte.weight), so that
           safetensors' save_model stores the tie once and `mfsdpc init`
           has to recognise it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import gpt


def _init_norms(m):
    with torch.no_grad():   # non-trivial norms so their gradients matter
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.1, 0.1)
    return m


def _causal_lm(x_of, blocks, ln_f, head_weight, idx, targets):
    """head_weight() is called at the head, so the parameter is read there."""
    x = x_of(idx)
    for blk in blocks:
        x = blk(x)
    logits = F.linear(ln_f(x), head_weight())
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class ByUse(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=4, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(gpt.Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def embed(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))

    def forward(self, idx, targets):
        return _causal_lm(self.embed, self.blocks, self.ln_f, lambda: self.tok.weight, idx, targets)


class _Transformer(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(gpt.Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def embed(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))


class GPT2(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=4, seq=16):
        super().__init__()
        self.transformer = _Transformer(vocab, d, heads, layers, seq)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight    # tied

    def forward(self, idx, targets):
        t = self.transformer
        return _causal_lm(t.embed, t.h, t.ln_f, lambda: self.lm_head.weight, idx, targets)


MODELS = {"byuse": ByUse, "gpt2": GPT2}


def make(kind, seed=0):
    torch.manual_seed(seed)
    return _init_norms(MODELS[kind]())
