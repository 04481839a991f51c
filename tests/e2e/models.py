"""The e2e model zoo: small models written by us that cover what deep-learning code commonly does.

Each entry of ZOO is `name -> make()` returning `(module, example_inputs)`; inputs are CPU tensors
(float32, or int64 indices), small enough that a forward + backward compile stays around a second.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from minicomp.models import MixerBlock


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, d_out=8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, d_out)

    def forward(self, x):  # (B, d_in) -> (B, d_out)
        return self.fc2(F.relu(self.fc1(x)))


class LayerNormGelu(nn.Module):
    def __init__(self, d=32, approximate="none"):
        super().__init__()
        self.ln, self.fc, self.approximate = nn.LayerNorm(d), nn.Linear(d, d), approximate

    def forward(self, x):  # (B, T, d)
        return F.gelu(self.fc(self.ln(x)), approximate=self.approximate)


class CausalSelfAttention(nn.Module):
    """minGPT's attention: explicit mask and softmax, or F.scaled_dot_product_attention(is_causal=True)."""

    def __init__(self, d=32, n_head=4, max_t=16, sdpa=False):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.n_head, self.sdpa = n_head, sdpa
        self.register_buffer("mask", torch.tril(torch.ones(max_t, max_t)).view(1, 1, max_t, max_t))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class GPTBlock(nn.Module):
    def __init__(self, d=32, n_head=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ConvBNReLU(nn.Module):
    def __init__(self, c_in=3, c_out=8):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x):  # (N, C, H, W)
        return F.relu(self.bn(self.conv(x)))


class SmallCNN(nn.Module):
    """ResNet's stem and head: conv, batch norm, 3x3/2 max pool, average pools, a linear classifier."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.stem, self.conv = ConvBNReLU(3, c), nn.Conv2d(c, c, 3, padding=1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):  # (N, 3, H, W) -> (N, classes)
        x = F.max_pool2d(self.stem(x), 3, stride=2, padding=1)
        x = F.avg_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class PointwiseSoup(nn.Module):
    """Many pointwise ops, broadcasting a (B, 1, D) against (T, D), with Python scalars mixed in."""

    def forward(self, x, y):
        a = torch.exp(-x.abs()) + torch.log(y.abs() + 1.0)
        b = torch.tanh(a) * torch.sigmoid(y) - 0.5
        c = torch.where(x > y, a, b.pow(2))
        d = torch.clamp(c, -0.75, 0.75) + (x >= 0.1).float() * (y < 0).to(x.dtype)
        e = torch.sqrt(d.abs() + 1e-3) / (1.0 + torch.rsqrt(a + 2.0))
        f = torch.maximum(e, b) - torch.minimum(a, 0.3 * e) + x.pow(3) / 3 + 2 ** (-a)
        return torch.sin(f) * torch.cos(c) + torch.erf(b) - F.silu(e) + F.softplus(a)


class RMSNorm(nn.Module):
    def __init__(self, d=32, eps=1e-6, builtin=False):
        super().__init__()
        self.weight, self.eps, self.builtin = nn.Parameter(torch.rand(d) + 0.5), eps, builtin

    def forward(self, x):
        if self.builtin:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class GroupNormModel(nn.Module):
    def __init__(self, c=8, groups=4):
        super().__init__()
        self.gn = nn.GroupNorm(groups, c)

    def forward(self, x):  # (N, C, H, W)
        return F.silu(self.gn(x))


class EmbeddingIndex(nn.Module):
    """Token + position embeddings, a gather of one logit per row and a row pick by index."""

    def __init__(self, vocab=20, d=16, max_t=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_t, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, targets):  # idx, targets: (B, T) int64
        T = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        logits = self.head(h)                                      # (B, T, vocab)
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
        return picked + logits[:, -1].index_select(-1, targets[0]).sum(-1, keepdim=True), logits[0][targets[1]]


class SoftmaxModel(nn.Module):
    def forward(self, x):  # (N, C, K): cross-entropy of (N, C) logits against targets in [0, K)
        return F.softmax(x, dim=-1), F.log_softmax(x * 2.0, dim=1), F.cross_entropy(x[:, :, 0], x[:, 0].argmax(-1))


class Reductions(nn.Module):
    def forward(self, x):  # (A, B, C)
        return (x.sum(), x.mean(dim=(0, 2)), x.amax(-1), x.amin(dim=0, keepdim=True), x.prod(1),
                x.var(dim=1), x.std(dim=-1, unbiased=False), x.argmax(dim=1), x.max(dim=2).values,
                torch.logsumexp(x, dim=1), x.norm(dim=-1))


ZOO = {
    "mlp": lambda: (MLP(), (torch.randn(4, 16),)),
    "layernorm_gelu": lambda: (LayerNormGelu(), (torch.randn(2, 5, 32),)),
    "layernorm_gelu_tanh": lambda: (LayerNormGelu(approximate="tanh"), (torch.randn(2, 5, 32),)),
    "attention": lambda: (CausalSelfAttention(), (torch.randn(2, 8, 32),)),
    "attention_sdpa": lambda: (CausalSelfAttention(sdpa=True), (torch.randn(2, 8, 32),)),
    "gpt_block": lambda: (GPTBlock(), (torch.randn(2, 8, 32),)),
    "mixer": lambda: (MixerBlock(tokens=8, dim=32, expand=2), (torch.randn(2, 8, 32),)),
    "conv_bn_relu": lambda: (ConvBNReLU(), (torch.randn(2, 3, 8, 8),)),
    "small_cnn": lambda: (SmallCNN(), (torch.randn(2, 3, 12, 12),)),
    "pointwise_soup": lambda: (PointwiseSoup(), (torch.randn(3, 1, 16), torch.randn(5, 16))),
    "rmsnorm": lambda: (RMSNorm(), (torch.randn(2, 5, 32),)),
    "rmsnorm_builtin": lambda: (RMSNorm(builtin=True), (torch.randn(2, 5, 32),)),
    "groupnorm": lambda: (GroupNormModel(), (torch.randn(2, 8, 4, 4),)),
    "softmax": lambda: (SoftmaxModel(), (torch.randn(4, 6, 5),)),
    "reductions": lambda: (Reductions(), (torch.randn(3, 4, 5),)),
    "embedding": lambda: (EmbeddingIndex(), (torch.randint(0, 8, (2, 8)), torch.randint(0, 8, (2, 8)))),
}
