"""The models the demo, the benchmark and the sample notebooks compile, written as users write them.

`Block` is a GPT-2 block the way nanoGPT writes it; `MixerBlock` an MLP-Mixer block (an MLP across
the tokens of a transposed activation, then one across the channels); `NormStack` a LayerNorm-heavy
residual stack; `MLP` two linear layers around a GELU.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A GPT-2 block, written the way nanoGPT writes it."""

    def __init__(self, dim: int, heads: int, max_seq: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_out = nn.Linear(4 * dim, dim)
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)                                  # (B, T, C) each
        q, k, v = (t.view(B, T, self.heads, hs).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))                 # (B, H, T, T)
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)                          # (B, T, C)
        return self.proj(y)

    def forward(self, x):                                                       # x: (B, T, C)
        x = x + self.attention(self.ln1(x))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class MixerBlock(nn.Module):
    """An MLP-Mixer block (Tolstikhin et al. 2021)."""

    def __init__(self, tokens: int, dim: int, expand: int = 4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tok1, self.tok2 = nn.Linear(tokens, tokens * expand), nn.Linear(tokens * expand, tokens)
        self.ch1, self.ch2 = nn.Linear(dim, dim * expand), nn.Linear(dim * expand, dim)

    def forward(self, x):                                                       # x: (B, tokens, dim)
        y = self.ln1(x).transpose(1, 2)                                         # (B, dim, tokens)
        x = x + self.tok2(F.gelu(self.tok1(y))).transpose(1, 2)
        return x + self.ch2(F.gelu(self.ch1(self.ln2(x))))


class NormStack(nn.Module):
    """Residual layers of LayerNorm -> Linear -> LayerNorm -> GELU: mostly normalization work."""

    def __init__(self, dim: int, layers: int = 3):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleDict({"ln_in": nn.LayerNorm(dim), "fc": nn.Linear(dim, dim),
                                                   "ln_out": nn.LayerNorm(dim)}) for _ in range(layers))

    def forward(self, x):                                                       # x: (..., dim)
        for layer in self.layers:
            x = x + F.gelu(layer["ln_out"](layer["fc"](layer["ln_in"](x))))
        return x


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc, self.out = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):                                                       # x: (..., dim)
        return self.out(F.gelu(self.fc(x)))
