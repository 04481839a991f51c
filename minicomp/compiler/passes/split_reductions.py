"""Split reductions: a reduction of a big tensor to one value becomes two levels.

A row kernel runs its rows in parallel (threads on the CPU, blocks on the GPU); a full reduction --
a loss, a norm, `x.sum()` -- is one row, so it would run on one thread or one block. Reduced as
P rows of N/P first (the reshape is index math; a pointwise producer still fuses into that kernel)
and then once more over the P partials, it spreads over the machine. Inductor does the same.

Assumes: a graph before fusion. Only for backends that generate kernels (ctx.kernel_ops not None),
only sum/prod/amax/amin (associative, NaN propagates through both levels) of f32/f64 and integers:
f16/bf16 partials would round before the second level, where one level rounds once.
Guarantees: the result's type is unchanged; reductions of fewer than MIN_ELEMENTS elements, or whose
element count has no divisor in [MIN_PARTS, MAX_PARTS], are left alone.
"""
from __future__ import annotations

import math

from ...ir import Graph, Node, TensorType

OPS = ("sum", "prod", "amax", "amin")
DTYPES = ("f32", "f64", "i64", "i32", "i16", "i8", "u8")
MIN_ELEMENTS = 1 << 16
MAX_PARTS, MIN_PARTS = 256, 16


def parts(n: int):
    """The most rows (at most MAX_PARTS, at least MIN_PARTS) that split n elements evenly."""
    return next((p for p in range(MAX_PARTS, MIN_PARTS - 1, -1) if n % p == 0), None)


def run(graph: Graph, ctx) -> Graph:
    if ctx.kernel_ops is None:
        return graph
    nodes, replace = [], {}
    for n in graph.nodes:
        nodes.append(n)
        if n.op not in OPS or n.type.dtype not in DTYPES or math.prod(n.type.shape) != 1:
            continue
        x = n.args[0]
        numel = math.prod(x.type.shape)
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
