"""Lowerings of indexing: gathers (index_select, gather, embedding, advanced indexing, flip) and the
scatters that have a gather-shaped form (slice_scatter, select_scatter, small scatters).

The IR reads by index (`gather`, `index_select`) and never writes by index, so a scatter lowers
only where each output element can find its one source by index math: a slice written back, or a
few one-hot positions per row. Data-dependent scatters with accumulation (index_put, scatter_add)
stay externs.
"""
from __future__ import annotations

import math

from ..ir import Node
from ..ir.types import broadcast_shapes
from .lower_view import bounds, permute_, slice_
from .lowering import Unsupported, aten, lowering, norm_dim

_INDEX_DTYPES = ("i64", "i32")


@lowering(aten.index_select.default)
def _index_select(b, x, dim, index):
    flat = b.reshape(index, (index.type.numel,))
    if x.type.ndim == 0:  # a 0-d tensor indexes like a 1-element vector
        return b.reshape(b.emit("index_select", b.reshape(x, (1,)), flat, dim=0), b.out_shape)
    return b.emit("index_select", x, flat, dim=norm_dim(dim, x.type.ndim))


@lowering(aten.gather.default)
def _gather(b, x, dim, index, sparse_grad=False):
    if x.type.ndim == 0:  # index is 0-d or one element: gather it as a 1-element vector
        out = b.emit("gather", b.reshape(x, (1,)), b.reshape(index, (index.type.numel,)), dim=0)
        return b.reshape(out, b.out_shape)
    return b.emit("gather", x, index, dim=norm_dim(dim, x.type.ndim))


@lowering(aten.embedding.default)
def _embedding(b, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    flat = b.reshape(indices, (indices.type.numel,))
    rows = b.emit("index_select", weight, flat, dim=0)
    return b.reshape(rows, b.out_shape)


def _wrap(b, i, n):
    """Negative indices count from the end, as in eager."""
    i = b.cast(i, "i64")
    return b.emit("where", b.emit("lt", i, b.full(0, "i64")), b.emit("add", i, b.full(n, "i64")), i)


@lowering(aten.index.Tensor)
def _index(b, x, indices):
    """x[i0, :, i2] with integer index tensors: move the indexed dims to the front, merge them into one
    dim, and index_select it with the linear index sum(i_d * stride_d) (indices broadcast to shape B).
    The result is B + the other dims, except that B stays in place when the indexed dims are adjacent."""
    nd = x.type.ndim
    dims = [d for d, i in enumerate(indices) if i is not None]
    if nd == 0 or not dims or any(indices[d].type.dtype not in _INDEX_DTYPES for d in dims):
        raise Unsupported("indexing a 0-d tensor, with no index, or by a bool mask")
    bshape = broadcast_shapes(*(indices[d].type.shape for d in dims))
    linear, stride = None, 1
    for d in reversed(dims):
        term = b.expand(_wrap(b, indices[d], x.type.shape[d]), bshape)
        if stride != 1:
            term = b.emit("mul", term, b.full(stride, "i64"))
        linear = term if linear is None else b.emit("add", term, linear)
        stride *= x.type.shape[d]
    rest = [d for d in range(nd) if d not in dims]
    rest_shape = tuple(x.type.shape[d] for d in rest)
    merged = b.reshape(permute_(b, x, dims + rest), (stride,) + rest_shape)     # (indexed, *rest)
    rows = b.emit("index_select", merged, b.reshape(linear, (math.prod(bshape),)), dim=0)
    out = b.reshape(rows, bshape + rest_shape)                                  # (*B, *rest)
    first, nb = dims[0], len(bshape)
    if dims == list(range(first, first + len(dims))) and first > 0:
        lead = list(range(nb, nb + first))
        out = permute_(b, out, lead + list(range(nb)) + list(range(nb + first, out.type.ndim)))
    return out


@lowering(aten.flip.default)
def _flip(b, x, dims):
    """A reversed gather: index_select with a descending iota along each flipped dim."""
    for d in sorted({norm_dim(d, x.type.ndim) for d in dims}) if x.type.ndim else ():
        n = x.type.shape[d]
        if n > 1:
            rev = b.emit("iota", shape=(n,), dim=0, start=n - 1, step=-1, dtype="i64")
            x = b.emit("index_select", x, rev, dim=d)
    return x


def _along(b, v, dim, ndim):
    """A 1-d node laid out along `dim` of an ndim-d tensor, for broadcasting."""
    return b.reshape(v, tuple(v.type.shape[0] if i == dim else 1 for i in range(ndim)))


@lowering(aten.slice_scatter.default)
def _slice_scatter(b, x, src, dim=0, start=None, end=None, step=1):
    """x with x[start:end:step] (along dim) replaced by src: a cat for step 1, else a masked gather."""
    nd = x.type.ndim
    dim = norm_dim(dim, nd)
    size = x.type.shape[dim]
    start, end = bounds(start, end, size)  # Python's slice.indices, symbolic sizes too
    src = b.cast(src, x.type.dtype)
    if step == 1:
        parts = [slice_(b, x, dim, 0, start), src, slice_(b, x, dim, end, size)]
        parts = [p for p in parts if not (isinstance(p.type.shape[dim], int) and p.type.shape[dim] == 0)]
        return parts[0] if len(parts) == 1 else b.emit("cat", *parts, dim=dim)
    count = src.type.shape[dim]
    rel = b.emit("iota", shape=(size,), dim=0, start=-start, step=1, dtype="i64")        # i - start
    src_row = b.emit("minimum", b.emit("maximum", b.emit("div_floor", rel, b.full(step, "i64")),
                                       b.full(0, "i64")), b.full(count - 1, "i64"))
    hit = b.emit("logical_and", b.emit("ge", rel, b.full(0, "i64")),
                 b.emit("lt", rel, b.full(count * step, "i64")))
    hit = b.emit("logical_and", hit, b.emit("eq", b.emit("remainder", rel, b.full(step, "i64")), b.full(0, "i64")))
    spread = b.emit("index_select", src, src_row, dim=dim)                              # x's shape
    return b.emit("where", _along(b, hit, dim, nd), spread, x)


@lowering(aten.slice_backward.default)
def _slice_backward(b, grad, input_sizes, dim, start, end, step):
    """The gradient of a slice: zeros of the input's shape with `grad` written back (torch's formula)."""
    return _slice_scatter(b, b.full(0, grad.type.dtype, b.out_shape), grad, dim, start, end, step)


@lowering(aten.select_scatter.default)
def _select_scatter(b, x, src, dim, index):
    dim = norm_dim(dim, x.type.ndim)
    index = index + x.type.shape[dim] if index < 0 else index  # a symbolic size: no % of a negative
    shape = list(x.type.shape)
    shape[dim] = 1
    return _slice_scatter(b, x, b.reshape(src, shape), dim, index, index + 1)


_SCATTER_MAX_K = 8  # index entries per output row we unroll into where-chains; beyond that, extern


@lowering(aten.scatter.value, aten.scatter.src)
def _scatter(b, x, dim, index, src):
    """out = x with out[.., index[.., j, ..], ..] = src[.., j, ..]: for a few j per row (one-hot targets in
    cross-entropy's backward) that is a chain of `where(iota == index_j, src_j, out)` over x's shape."""
    nd = x.type.ndim
    if nd == 0 or index.type.ndim != nd:
        raise Unsupported("scatter of a 0-d tensor or a rank-changing index")
    dim = norm_dim(dim, nd)
    k = index.type.shape[dim]
    if k > _SCATTER_MAX_K or any(index.type.shape[d] != x.type.shape[d] for d in range(nd) if d != dim):
        raise Unsupported(f"scatter with {k} indices per row or an index smaller than the input")
    if isinstance(src, Node):  # src may be larger than index: only its leading index-shaped block is read
        for d in range(nd):
            src = slice_(b, src, d, 0, index.type.shape[d])
        src = b.cast(src, x.type.dtype)
    iota = b.emit("iota", shape=x.type.shape, dim=dim, start=0, step=1, dtype=index.type.dtype)
    out = x
    for j in range(k):
        hit = b.emit("eq", iota, b.expand(slice_(b, index, dim, j, j + 1), x.type.shape))
        if isinstance(src, Node):
            value = b.expand(slice_(b, src, dim, j, j + 1), x.type.shape)
        else:
            value = b.tensor(src, x.type.dtype)
        out = b.emit("where", hit, value, out)
    return out
