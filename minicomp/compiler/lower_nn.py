"""Lowerings of the matmul-shaped ATen ops: mm/bmm/addmm/baddbmm, convolution, and scaled dot-product
attention (forward and backward).

Matmuls and convolutions stay whole IR ops (BLAS / cuDNN calls in every backend); their bias and
scaling become pointwise ops that fuse into what follows.

Attention is spelled out as two batched matmuls around a softmax (`bmm`, `amax`, `exp`, `sum`), so the
softmax fuses and the matmuls stay BLAS calls. The forward also returns the row logsumexp that
ATen's flash kernel saves; the backward recomputes the probabilities from it (FlashAttention's
trick: no (L, S) matrix is saved between forward and backward).
"""
from __future__ import annotations

import math

from .lowering import Unsupported, aten, compute_dtype, lowering


def _bmm4(b, x, y):
    """(N, H, L, K) @ (N, H, K, S) -> (N, H, L, S) through one bmm over N*H."""
    (n, h, l, k), s = x.type.shape, y.type.shape[3]
    out = b.emit("bmm", b.reshape(x, (n * h, l, k)), b.reshape(y, (n * h, k, s)))
    return b.reshape(out, (n, h, l, s))


def _t(b, x):
    return b.emit("permute", x, dims=(0, 1, 3, 2))


def _scores(b, q, k, is_causal, attn_mask, scale, acc):
    """scale * q @ k^T plus the mask: (N, H, L, S) in the accumulation dtype."""
    if q.type.ndim != 4 or k.type.ndim != 4 or q.type.shape[:2] != k.type.shape[:2]:
        raise Unsupported("attention wants (N, H, L, E) operands with equal heads")
    scale = 1.0 / math.sqrt(q.type.shape[3]) if scale is None else scale
    s = b.emit("mul", _bmm4(b, b.cast(q, acc), _t(b, b.cast(k, acc))), b.full(scale, acc))
    shape = s.type.shape
    if attn_mask is not None:
        if attn_mask.type.dtype == "b8":
            attn_mask = b.emit("where", attn_mask, b.full(0.0, acc), b.full(float("-inf"), acc))
        s = b.emit("add", s, b.cast(attn_mask, acc))
    if is_causal:  # top-left aligned: query i sees keys j <= i
        rows = b.emit("iota", shape=shape[2:], dim=0, start=0, step=1, dtype="i64")
        cols = b.emit("iota", shape=shape[2:], dim=1, start=0, step=1, dtype="i64")
        s = b.emit("where", b.emit("le", cols, rows), s, b.full(float("-inf"), acc))
    return s, scale


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa(b, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p:
        raise Unsupported("attention with dropout")
    acc = compute_dtype(q.type.dtype)
    s, _ = _scores(b, q, k, is_causal, attn_mask, scale, acc)          # (N, H, L, S)
    m = b.emit("amax", s, dims=(3,), keepdim=True)
    # a fully masked row has max -inf; shift it by 0 so it sums to 0 and yields 0, as the flash kernel does
    dead_max = b.emit("eq", m, b.full(float("-inf"), acc))
    m = b.emit("where", dead_max, b.full(0.0, acc), m)
    e = b.emit("exp", b.emit("sub", s, m))
    total = b.emit("sum", e, dims=(3,), keepdim=True)                 # (N, H, L, 1)
    dead = b.emit("eq", total, b.full(0.0, acc))
    denom = b.emit("where", dead, b.full(1.0, acc), total)
    out = b.emit("div", _bmm4(b, e, b.cast(v, acc)), denom)          # (N, H, L, Ev)
    lse = b.emit("where", dead, b.full(0.0, acc), b.emit("add", b.emit("log", total), m))
    lse = b.reshape(lse, lse.type.shape[:3])
    return b.cast(out, q.type.dtype), b.cast(lse, "f32")


@lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_backward(b, grad_out, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    if dropout_p:
        raise Unsupported("attention with dropout")
    acc = compute_dtype(q.type.dtype)
    s, scale = _scores(b, q, k, is_causal, attn_mask, scale, acc)
    lse4 = b.reshape(b.cast(lse, acc), lse.type.shape + (1,))
    p = b.emit("exp", b.emit("sub", s, lse4))                         # (N, H, L, S) probabilities
    do, vf = b.cast(grad_out, acc), b.cast(v, acc)
    dv = _bmm4(b, _t(b, p), do)                                        # (N, H, S, Ev)
    dp = _bmm4(b, do, _t(b, vf))                                       # (N, H, L, S)
    row = b.emit("sum", b.emit("mul", do, b.cast(out, acc)), dims=(3,), keepdim=True)
    ds = b.emit("mul", b.emit("mul", p, b.emit("sub", dp, row)), b.full(scale, acc))
    dq = _bmm4(b, ds, b.cast(k, acc))
    dk = _bmm4(b, _t(b, ds), b.cast(q, acc))
    return b.cast(dq, q.type.dtype), b.cast(dk, k.type.dtype), b.cast(dv, v.type.dtype)


# ---- matmul and convolution ------------------------------------------------------------------------


@lowering(aten.mm.default)
def _mm(b, x, y):
    return b.emit("mm", x, y)


@lowering(aten.bmm.default)
def _bmm(b, x, y):
    return b.emit("bmm", x, y)


@lowering(aten.addmm.default)
def _addmm(b, bias, x, y, beta=1, alpha=1):
    return _scale_add(b, b.emit("mm", x, y), bias, beta, alpha)


@lowering(aten.baddbmm.default)
def _baddbmm(b, bias, x, y, beta=1, alpha=1):
    return _scale_add(b, b.emit("bmm", x, y), bias, beta, alpha)


@lowering(aten.addmv.default)
def _addmv(b, bias, mat, vec, *, beta=1, alpha=1):
    prod = b.emit("mm", mat, b.reshape(vec, (vec.type.numel, 1)))
    return _scale_add(b, b.reshape(prod, (mat.type.shape[0],)), bias, beta, alpha)


def _scale_add(b, prod, bias, beta, alpha):
    dt = prod.type.dtype
    if alpha != 1:
        prod = b.emit("mul", prod, b.full(alpha, dt))
    if beta == 0:
        return prod
    bias = b.cast(bias, dt)
    if beta != 1:
        bias = b.emit("mul", bias, b.full(beta, dt))
    return b.emit("add", prod, bias)


def fold_batch_norm(b, conv, running_mean, running_var, eps, weight, bias):
    """Batch norm in eval mode of a convolution's result only it reads, as one convolution: its
    weight scaled by weight * rsqrt(var + eps) per output channel, its bias (b - mean) * that +
    bias. The scaling is per call and weight-sized (the parameters may change between calls); the
    norm's pass over the activations is gone. None, having emitted nothing, where it does not apply
    (a transposed convolution; low precision: eager normalizes a bf16 result in f32)."""
    if (conv.op != "conv" or conv.attrs["transposed"] or conv.type.dtype not in ("f32", "f64")
            or running_mean is None or running_var is None
            or len(b.fx_node.args[0].users) != 1):  # the convolution's result is read elsewhere too
        return None
    x, w = conv.args[:2]
    dt = conv.type.dtype
    rstd = b.emit("rsqrt", b.emit("add", b.cast(running_var, dt), b.full(eps, dt)))
    mean = b.cast(running_mean, dt)
    scale = rstd if weight is None else b.emit("mul", rstd, b.cast(weight, dt))
    shift = b.emit("neg", b.emit("mul", mean, scale))
    if len(conv.args) > 2:
        shift = b.emit("add", shift, b.emit("mul", conv.args[2], scale))
    if bias is not None:
        shift = b.emit("add", shift, b.cast(bias, dt))
    w2 = b.emit("mul", w, b.reshape(scale, (w.type.shape[0],) + (1,) * (w.type.ndim - 1)))
    return b.emit("conv", x, w2, shift, **conv.attrs)


@lowering(aten.convolution.default)
def _convolution(b, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    args = (x, w) if bias is None else (x, w, bias)
    return b.emit("conv", *args, stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation),
                  transposed=bool(transposed), output_padding=tuple(output_padding), groups=int(groups))
