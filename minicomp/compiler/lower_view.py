"""Lowerings of views, concatenation, padding and tensor creation.

Views lower to the four IR view ops (reshape, permute, expand, slice); the result shape always
comes from the fx node's FakeTensor, so -1 sizes and squeeze rules are torch's, not re-derived here.
"""
from __future__ import annotations

from ..ir import sym
from ..ir.types import FLOATS
from .lowering import Unsupported, aten, lowering, norm_dim, size as _size


@lowering(aten.view.default, aten._unsafe_view, aten.reshape, aten.squeeze, aten.unsqueeze,
          aten.flatten.using_ints, aten.view_as, aten.reshape_as, aten.unflatten)
def _reshape(b, x, *args, **kwargs):
    return b.reshape(x, b.out_shape)


@lowering(aten.permute)
def permute_(b, x, dims):
    dims = tuple(norm_dim(d, x.type.ndim) for d in dims)
    if dims == tuple(range(x.type.ndim)):
        return x
    return b.emit("permute", x, dims=dims)


@lowering(aten.transpose.int)
def _transpose(b, x, d0, d1):
    nd = x.type.ndim
    if nd < 2:
        return x
    dims = list(range(nd))
    d0, d1 = norm_dim(d0, nd), norm_dim(d1, nd)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute_(b, x, dims)


@lowering(aten.t.default)
def _t(b, x):
    return _transpose(b, x, 0, 1)


@lowering(aten.expand.default, aten.expand_as, aten.broadcast_to)
def _expand(b, x, *args, **kwargs):
    return b.expand(x, b.out_shape)


def bounds(start, end, size):
    """Python's slice(start, end).indices(size) for ints and symbolic sizes alike (step > 0)."""
    def norm(v, default):
        if v is None:
            return default
        v = v + size if v < 0 else v
        return sym.smin(sym.smax(v, 0), size)
    start = norm(start, 0)
    return start, sym.smax(norm(end, size), start)


def slice_(b, x, dim, start, end, step=1):
    size = x.type.shape[dim]
    if isinstance(step, sym.Sym) or step <= 0:
        raise Unsupported(f"slice step {step}")
    start, end = bounds(start, end, size)
    if (start, end, step) == (0, size, 1):
        return x
    return b.emit("slice", x, dim=dim, start=start, end=end, step=step)


@lowering(aten.slice.Tensor)
def _slice(b, x, dim=0, start=None, end=None, step=1):
    if x.type.ndim == 0:
        raise Unsupported("slice of a 0-d tensor")
    return slice_(b, x, norm_dim(dim, x.type.ndim), start, end, step)


@lowering(aten.narrow)
def _narrow(b, x, dim, start, length):
    dim = norm_dim(dim, x.type.ndim)
    start = start + x.type.shape[dim] if start < 0 else start  # torch checks -size <= start
    return slice_(b, x, dim, start, start + length)


@lowering(aten.select.int)
def _select(b, x, dim, index):
    dim = norm_dim(dim, x.type.ndim)
    index = index + x.type.shape[dim] if index < 0 else index  # torch checks -size <= index < size
    return b.reshape(slice_(b, x, dim, index, index + 1), b.out_shape)


@lowering(aten.split_with_sizes, aten.split.Tensor, aten.unbind.int)
def _split(b, x, sizes=None, dim=0):
    dim = norm_dim(dim, x.type.ndim)
    outs, start = [], 0
    for v in b.val:
        n = _size(v.shape[dim]) if v.dim() == x.type.ndim else 1
        piece = slice_(b, x, dim, start, start + n)
        outs.append(b.reshape(piece, tuple(v.shape)))
        start += n
    return tuple(outs)


@lowering(aten.cat.default)
def _cat(b, tensors, dim=0):
    dt, shape = b.out_dtype, b.out_shape
    # torch.cat skips legacy 1-d empty tensors whatever the other operands' rank
    parts = [b.cast(t, dt) for t in tensors if t.type.ndim == len(shape)]
    dim = norm_dim(dim, len(shape))
    parts = [p for p in parts if p.type.shape[dim] > 0]
    if len(parts) == 1:
        return parts[0]
    return b.emit("cat", *parts, dim=dim)


@lowering(aten.diagonal.default)
def _diagonal(b, x, offset=0, dim1=0, dim2=1):
    """x[..., i, i + offset] is every (n2 + 1)-th element once dim1, dim2 are last and merged: a strided slice."""
    nd = x.type.ndim
    d1, d2 = norm_dim(dim1, nd), norm_dim(dim2, nd)
    rest = [d for d in range(nd) if d not in (d1, d2)]
    x = permute_(b, x, rest + [d1, d2])
    n1, n2 = x.type.shape[-2:]
    flat = b.reshape(x, x.type.shape[:-2] + (n1 * n2,))
    length = b.out_shape[-1]
    start = offset if offset >= 0 else -offset * n2
    return slice_(b, flat, nd - 2, start, start + (length - 1) * (n2 + 1) + 1, n2 + 1)


@lowering(aten.constant_pad_nd.default)
def constant_pad(b, x, pad, value=0):
    """pad = (left, right) pairs from the last dim backwards; negative amounts crop (a slice)."""
    for i in range(len(pad) // 2):
        dim = x.type.ndim - 1 - i
        left, right = pad[2 * i], pad[2 * i + 1]
        size = x.type.shape[dim]
        x = slice_(b, x, dim, max(-left, 0), size - max(-right, 0))
        parts = []
        for amount in (left, right):
            if amount > 0:
                shape = list(x.type.shape)
                shape[dim] = amount
                parts.append(b.full(value, x.type.dtype, shape))
        if parts:
            parts.insert(1 if left > 0 else 0, x)
            x = b.emit("cat", *parts, dim=dim)
    return x


@lowering(aten.repeat.default)
def _repeat(b, x, repeats):
    """tile: view x as (1, s0, 1, s1, ...), expand to (r0, s0, r1, s1, ...), merge each pair."""
    shape = (1,) * (len(repeats) - x.type.ndim) + x.type.shape
    interleaved = tuple(v for s in shape for v in (1, s))
    expanded = tuple(v for r, s in zip(repeats, shape) for v in (r, s))
    return b.reshape(b.expand(b.reshape(x, interleaved), expanded), b.out_shape)


# ---- creation --------------------------------------------------------------------------------------


def _fill(b, value):
    dt = b.out_dtype
    return b.full(value, dt, b.out_shape)


@lowering(aten.full.default, aten.full_like, aten.new_full)
def _full(b, *args, **kwargs):
    value = args[1] if b.target_name != "aten.new_full.default" else args[2]
    return _fill(b, value)


@lowering(aten.zeros.default, aten.zeros_like, aten.new_zeros, aten.empty.memory_format, aten.empty_like,
          aten.new_empty, aten.empty_strided, aten.new_empty_strided, aten.empty_permuted)
def _zeros(b, *args, **kwargs):
    return _fill(b, 0)


@lowering(aten.ones.default, aten.ones_like, aten.new_ones)
def _ones(b, *args, **kwargs):
    return _fill(b, 1)


@lowering(aten.scalar_tensor.default)
def _scalar_tensor(b, value, **kwargs):
    return _fill(b, value)


@lowering(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(b, *args, **kwargs):
    nums = [a for a in args if isinstance(a, (int, float, sym.Sym))]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
    if isinstance(start, sym.Sym) or isinstance(step, sym.Sym):
        raise Unsupported("arange with a symbolic start or step")
    if b.out_dtype not in FLOATS:  # an integer arange truncates start and step first, as eager does
        start, step = int(start), int(step)
    return b.emit("iota", shape=b.out_shape, dim=0, start=start, step=step, dtype=b.out_dtype)


@lowering(aten.tril.default, aten.triu.default)
def _tril(b, x, diagonal=0):
    if x.type.ndim < 2:
        raise Unsupported("tril/triu of fewer than 2 dims")
    rows, cols = x.type.shape[-2:]
    r = b.emit("iota", shape=(rows, cols), dim=0, start=0, step=1, dtype="i64")
    c = b.emit("iota", shape=(rows, cols), dim=1, start=-diagonal, step=1, dtype="i64")
    keep = b.emit("le" if b.target_name.startswith("aten.tril") else "ge", c, r)
    return b.emit("where", keep, x, b.full(0, x.type.dtype))
