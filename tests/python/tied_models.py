"""
tied_models: the two tied GPT variants of test_ties.py: gpt.py's model
(same blocks, sizes, data and initial values: make() copies them from
gpt.make_model) under other module trees:

  ByUse    the head is F.linear(ln_f(x), self.wte.weight) in the model's
           own forward: one parameter under one name, read outside its unit
           (a tie only a traced forward, or ties=, can find);
  GPT2     Hugging Face GPT-2's names (transformer.wte / wpe / h.{i} /
           ln_f, lm_head.weight = transformer.wte.weight), so that
           safetensors' save_model stores the tie once and `mfsdpc init`
           has to recognise it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import gpt


class _Trunk(nn.Module):
    """Embeddings, blocks and the final norm of gpt.GPT."""

    def __init__(self, vocab=64, d=32, heads=4, layers=4, seq=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(gpt.Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def hidden(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x)


def _loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class ByUse(_Trunk):
    def forward(self, idx, targets):
        return _loss(F.linear(self.hidden(idx), self.wte.weight), targets)


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = _Trunk()
        self.lm_head = nn.Linear(32, 64, bias=False)
        self.lm_head.weight = self.transformer.wte.weight    # tied

    def forward(self, idx, targets):
        return _loss(self.lm_head(self.transformer.hidden(idx)), targets)


MODELS = {"byuse": (ByUse, ""), "gpt2": (GPT2, "transformer.")}


def make(kind, seed=0):
    """The model of `kind` holding gpt.make_model(seed)'s values."""
    cls, prefix = MODELS[kind]
    model = cls()
    src = gpt.make_model(seed).state_dict()
    values = {prefix + k.replace("blocks.", "h."): v for k, v in src.items() if k != "lm_head.weight"}
    model.load_state_dict(values, strict=False)
    missing = {n for n, _ in model.named_parameters()} - set(values)
    assert not missing, missing
    return model
