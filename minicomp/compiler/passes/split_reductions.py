"""Split reductions: a reduction to few values of many elements becomes two levels.

A row kernel runs its rows in parallel (threads on the CPU, blocks on the GPU); a full reduction --
a loss, a norm, `x.sum()` -- is one row, so it would run on one thread or one block. Reduced as
P rows of N/P first (the reshape is index math; a pointwise producer still fuses into that kernel)
and then once more over the P partials, it spreads over the machine. Inductor does the same.
A reduction over the leading dims to few columns -- a bias gradient, `dy.sum((0, 1))` -- has the
same problem: its columns are its only parallel work. Its rows are split the same way: [R, K] ->
[P, R/P, K], summed over R/P (P*K parallel columns), then over P. A batch norm's statistics over
(N, H, W) of [N, C, H, W] keep C between reduced dims: the reduced dim with the most parts is split,
its P moved first ([P, C] partials). Over channels-last data their kernel runs down the channels in
parallel over P: a ResNet's batch-norm backward kernels went from 0.52 to 0.17 ms, one thread to two.

Assumes: a graph before fusion, for a backend that generates kernels (the kernel pass list),
only sum/prod/amax/amin (associative, NaN propagates through both levels) of f32/f64 and integers:
f16/bf16 partials would round before the second level, where one level rounds once.
Guarantees: the result's type is unchanged; reductions of fewer than MIN_ELEMENTS elements, or whose
element count has no divisor in [MIN_PARTS, MAX_PARTS], are left alone; so is a column reduction
of a value stored anyway (an input, a torch op's result or operand, a graph output, or the value
one of those views), which runs in torch or joins a kernel that sums it down the same columns
already (compiler/schedule.py column_sum_in_torch).
"""
from __future__ import annotations

import math

from ...ir import Graph, Node, TensorType

OPS = ("sum", "prod", "amax", "amin")
DTYPES = ("f32", "f64", "i64", "i32", "i16", "i8", "u8")
MIN_ELEMENTS = 1 << 16
MAX_PARTS, MIN_PARTS = 256, 16
COLUMN_MAX_OUTPUTS = 4096          # a column reduction to more columns has parallel work enough
COLUMN_MAX_PARTS, COLUMN_MIN_ROWS = 64, 16


def parts(n: int, most: int = MAX_PARTS, least: int = MIN_PARTS):
    """The most rows (at most `most`, at least `least`) that split n elements evenly."""
    return next((p for p in range(most, least - 1, -1) if n % p == 0), None)


def _split_columns(n: Node, stored: set) -> list | None:
    """A reduction to few values over many rows -> partials over P parts of its rows, then over P.
    Over the leading dims, [R..., K...] -> [P, R/P, K]. Over the first dim and others with kept dims
    between (a batch norm's (N, H, W) of [N, C, H, W]) the reduced dim with the most parts is split
    and its P moved first: [P, C] partials, the kept dims in their order, so a kept dim contiguous in
    memory (C of channels-last data) stays the last and the partial kernel runs down those columns
    in parallel over P (codegen/columns.py); over NCHW data it is P x C rows instead of C. A
    reduction that keeps the first dim (over a row's last dims) has its kept rows to run in parallel."""
    x = n.args[0]
    dims, shape = tuple(sorted(n.attrs["dims"])), x.type.shape
    k = len(dims)
    if not 0 < k < len(shape) or any(not isinstance(s, int) for s in shape):
        return None  # (over a symbolic size: not split)
    rows = math.prod(shape[d] for d in dims)
    cols = math.prod(shape[d] for d in range(len(shape)) if d not in dims)
    if cols > COLUMN_MAX_OUTPUTS or rows * cols < MIN_ELEMENTS or x.op in ("input", "constant") or x in stored:
        return None
    if dims != tuple(range(k)):  # split when kept dims sit between reduced ones (a batch norm's C);
        return _split_inner(n, dims, rows) if dims[0] == 0 else None  # a kept first dim is rows enough
    p = parts(rows, COLUMN_MAX_PARTS, 2)
    if p is None or rows // p < COLUMN_MIN_ROWS:
        return None
    grid = Node("reshape", [x], {"shape": (p, rows // p, cols)}, TensorType((p, rows // p, cols), x.type.dtype),
                meta=n.meta)
    return [grid] + _two_levels(n, grid, (1,), (cols,), n.type.dtype)


def _split_inner(n: Node, dims: tuple, rows: int) -> list | None:
    """_split_columns over dims that are not all leading: the reduced dim with the most parts is split
    (ties: the outer one)."""
    x, shape = n.args[0], n.args[0].type.shape
    p, d = max(((parts(shape[d], COLUMN_MAX_PARTS, 2) or 0, -d) for d in dims))
    d = -d
    if p < 2 or rows // p < COLUMN_MIN_ROWS:
        return None
    dt, xt, nd = n.type.dtype, x.type.dtype, len(shape)
    split = shape[:d] + (p, shape[d] // p) + shape[d + 1:]  # P at position d, the rest of dim d at d + 1
    grid = Node("reshape", [x], {"shape": split}, TensorType(split, xt), meta=n.meta)
    order = (d,) + tuple(i for i in range(nd + 1) if i != d)
    moved = Node("permute", [grid], {"dims": order}, TensorType(tuple(split[i] for i in order), xt), meta=n.meta)
    reduced = tuple(e + 1 for e in dims)  # in `moved`: every dim one later (P first; dim d's rest where d was)
    kept = tuple(shape[i] for i in range(nd) if i not in dims)
    # float64 partials: one rounding at the end, as one level rounds (a batch norm's statistics as
    # eager's: a ReLU input a rounding from 0 keeps its side)
    return [grid, moved] + _two_levels(n, moved, reduced, kept, "f64" if n.op == "sum" and dt == "f32" else dt)


def _two_levels(n: Node, grid: Node, reduced: tuple, kept: tuple, acc: str) -> list:
    """n's reduction as partials of `grid` (P first) over `reduced`, then over P, in dtype `acc`, and
    the result in n's type."""
    dt, nodes, src = n.type.dtype, [], grid
    if acc != dt:
        src = Node("cast", [grid], {"dtype": acc}, TensorType(grid.type.shape, acc), meta=n.meta)
        nodes.append(src)
    p = grid.type.shape[0]
    partial = Node(n.op, [src], {"dims": reduced, "keepdim": False}, TensorType((p,) + kept, acc), meta=n.meta)
    total = Node(n.op, [partial], {"dims": (0,), "keepdim": False}, TensorType(kept, acc), meta=n.meta)
    nodes += [partial, total]
    if acc != dt:
        nodes.append(Node("cast", [total], {"dtype": dt}, TensorType(kept, dt), meta=n.meta))
    return nodes + [Node("reshape", [nodes[-1]], {"shape": n.type.shape}, n.type, meta=n.meta)]


def run(graph: Graph, ctx) -> Graph:
    nodes, replace = [], {}
    from ..buffers import stored_anyway
    stored = stored_anyway(graph, ctx.kernel_ops)
    for n in graph.nodes:
        nodes.append(n)
        if n.op not in OPS or n.type.dtype not in DTYPES:
            continue
        if math.prod(n.type.shape) != 1:
            split = _split_columns(n, stored)
            if split is not None:
                nodes[-1:] = split
                replace[n] = split[-1]
            continue
        x = n.args[0]
        numel = math.prod(x.type.shape)
        if not isinstance(numel, int):  # a reduction over symbolic sizes is not split
            continue
        p = parts(numel) if numel >= MIN_ELEMENTS else None
        if p is None or len(n.attrs["dims"]) != len(x.type.shape):
            continue
        dt = n.type.dtype
        rows = Node("reshape", [x], {"shape": (p, numel // p)}, TensorType((p, numel // p), dt), meta=n.meta)
        partial = Node(n.op, [rows], {"dims": (1,), "keepdim": False}, TensorType((p,), dt), meta=n.meta)
        total = Node(n.op, [partial], {"dims": (0,), "keepdim": False}, TensorType((), dt), meta=n.meta)
        nodes[-1:] = [rows, partial, total]
        if n.type.shape != ():
            nodes.append(Node("reshape", [total], {"shape": n.type.shape}, n.type, meta=n.meta))
        replace[n] = nodes[-1]
    graph.nodes = nodes
    graph.replace_uses(replace)
    return graph
