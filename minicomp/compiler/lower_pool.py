"""Lowerings of 2-d pooling: max and average pooling as reductions over the kernel's strided views.

A (kh, kw) window at stride s is kh*kw strided slices of the padded input, one per window offset,
each already shaped like the output (N, C, OH, OW); stacked along a new last dim, the pool is one
`amax` or `sum` over it. No copy of the input is made: the slices are index math. The backwards
(a scatter-add into overlapping windows) stay externs.
"""
from __future__ import annotations

import torch

from ..ir.types import DTYPES, FLOATS, dim
from .lower_view import constant_pad, slice_
from .lowering import Unsupported, aten, compute_dtype, lowering


def _pair(v):
    return (v[0], v[0]) if len(v) == 1 else tuple(v)


def _windows(b, x, kernel, stride, padding, dilation, out_hw, fill):
    """(..., OH, OW, kh*kw): every output's window, padded with `fill` (and past the end for ceil_mode)."""
    hdim = x.type.ndim - 2
    pads = []
    for axis in (1, 0):  # constant_pad takes (left, right) pairs from the last dim backwards
        size = x.type.shape[hdim + axis]
        reach = (out_hw[axis] - 1) * stride[axis] + (kernel[axis] - 1) * dilation[axis] + 1
        pads += [padding[axis], max(reach - size - padding[axis], 0)]
    x = constant_pad(b, x, pads, fill)
    views = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            v = x
            for axis, offset in ((0, i), (1, j)):
                start = offset * dilation[axis]
                end = start + (out_hw[axis] - 1) * stride[axis] + 1
                v = slice_(b, v, hdim + axis, start, end, stride[axis])
            views.append(b.reshape(v, v.type.shape + (1,)))
    return views[0] if len(views) == 1 else b.emit("cat", *views, dim=x.type.ndim)


def _out_iota(b, out_hw, axis, scale, offset):
    """(OH, OW) i64 grid of output row (axis 0) or column (axis 1) coordinates, times scale plus offset."""
    return b.emit("iota", shape=tuple(out_hw), dim=axis, start=offset, step=scale, dtype="i64")


@lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d(b, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    if x.type.ndim not in (3, 4):
        raise Unsupported("max_pool2d of other than (C, H, W) or (N, C, H, W)")
    kernel, padding, dilation = _pair(kernel), _pair(padding), _pair(dilation)
    stride = _pair(stride) if stride else kernel
    dt = x.type.dtype
    lowest = float("-inf") if dt in FLOATS else torch.iinfo(DTYPES[dt]).min
    out_hw = tuple(dim(s) for s in b.val[0].shape[-2:])
    stacked = _windows(b, x, kernel, stride, padding, dilation, out_hw, lowest)   # (..., OH, OW, K)
    last = stacked.type.ndim - 1
    values = b.emit("amax", stacked, dims=(last,), keepdim=False)
    k = b.emit("argmax", stacked, dim=last, keepdim=False)                          # window offset
    kw = b.full(kernel[1], "i64")
    ki, kj = b.emit("div_floor", k, kw), b.emit("remainder", k, kw)
    # input coordinates of the winner: out * stride - pad + offset * dilation, flattened over (H, W)
    h, w = (b.emit("add", _out_iota(b, out_hw, axis, stride[axis], -padding[axis]),
                   b.emit("mul", k_axis, b.full(dilation[axis], "i64"))) for axis, k_axis in ((0, ki), (1, kj)))
    index = b.emit("add", b.emit("mul", h, b.full(x.type.shape[-1], "i64")), w)
    return values, index


@lowering(aten.avg_pool2d.default)
def _avg_pool2d(b, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if x.type.ndim not in (3, 4) or x.type.dtype not in FLOATS:
        raise Unsupported("avg_pool2d of other than float (C, H, W) or (N, C, H, W)")
    kernel, padding = _pair(kernel), _pair(padding)
    stride = _pair(stride) if stride else kernel
    acc = compute_dtype(x.type.dtype)
    out_hw = b.out_shape[-2:]
    stacked = _windows(b, b.cast(x, acc), kernel, stride, padding, (1, 1), out_hw, 0.0)
    total = b.emit("sum", stacked, dims=(stacked.type.ndim - 1,), keepdim=False)
    if divisor_override:
        divisor = b.full(divisor_override, acc)
    else:  # eager's count: the window clipped to the padded input, or to the input itself
        counts = []
        for axis in (0, 1):
            size, k = x.type.shape[axis - 2], kernel[axis]
            start = _out_iota(b, out_hw, axis, stride[axis], -padding[axis])
            end = b.emit("minimum", b.emit("add", start, b.full(k, "i64")), b.full(size + padding[axis], "i64"))
            if not count_include_pad:
                start = b.emit("maximum", start, b.full(0, "i64"))
                end = b.emit("minimum", end, b.full(size, "i64"))
            counts.append(b.emit("sub", end, start))
        divisor = b.cast(b.emit("mul", *counts), acc)
    return b.cast(b.emit("div", total, divisor), x.type.dtype)


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(b, x, output_size):
    """When the output size divides the input, every window is a (H/OH, W/OW) block: a reshape and a mean."""
    (h, w), (oh, ow) = x.type.shape[-2:], b.out_shape[-2:]
    if h % oh or w % ow or x.type.dtype not in FLOATS:
        raise Unsupported("adaptive pooling with uneven windows")
    acc = compute_dtype(x.type.dtype)
    blocks = b.reshape(b.cast(x, acc), x.type.shape[:-2] + (oh, h // oh, ow, w // ow))
    nd = blocks.type.ndim
    total = b.emit("sum", blocks, dims=(nd - 3, nd - 1), keepdim=False)
    return b.cast(b.emit("div", total, b.full((h // oh) * (w // ow), acc)), x.type.dtype)
