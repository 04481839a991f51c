"""Matmul operands: a transpose of the last two dims moved to where the matmul takes it for free.

mm and bmm read an operand that is transposed in its last two dims as it is (BLAS's transpose
flag). An operand torch would copy to view -- a reshape of permuted heads, as attention's k^T
is -- is written by a kernel (compiler/buffers.py required_buffers) in the operand's own order.
For k^T = reshape(permute(k_heads, (0, 2, 3, 1))) that order walks the tokens innermost, a stride of
a whole row in k's buffer, so the kernel gathers every element. This pass rewrites such an operand
as permute(reshape(permute(k_heads, (0, 2, 1, 3))), (0, 2, 1)): the same values, with the transpose
outside the reshape, where the scheduler writes the reshape along k's rows (a plain copy) and hands
the matmul the transposed view (buffers.py _write_untransposed).

Assumes: views are index math, chains of views already collapsed (simplify_views). Guarantees: the
values and types of the graph's nodes are unchanged; only matmul operands are rewritten, and only
where the new order reads along the dim that is contiguous in memory.
"""
from __future__ import annotations

from ...ir import Graph, Node, TensorType
from ..buffers import TRANSPOSED_OPERANDS, VIEW_OPS, last_two_strides, swapped_last_two, view_copies
from . import dce


def _swap(shape) -> tuple:
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


def _reoriented(x: Node, kernel_ops) -> list | None:
    """[new permute, new reshape, transposed view] computing x, or None where x stays as it is."""
    if x.op != "reshape" or x.args[0].op != "permute":
        return None
    p = x.args[0]
    chain, base = [], x
    while base.op in VIEW_OPS:
        chain.append(base)
        base = base.args[0]
    if not view_copies(chain, base, kernel_ops):
        return None  # torch views x as it is
    strides = last_two_strides(x, chain[1:], base, kernel_ops)
    if strides is None or strides[0] <= strides[1]:
        return None  # x's own order already reads along the contiguous dim (or the question is moot)
    dims = tuple(p.attrs["dims"])
    p2 = Node("permute", (p.args[0],), {"dims": dims[:-2] + (dims[-1], dims[-2])},
              TensorType(_swap(p.type.shape), p.type.dtype), meta=dict(p.meta))
    r2 = Node("reshape", (p2,), {"shape": _swap(x.type.shape)}, TensorType(_swap(x.type.shape), x.type.dtype),
              meta=dict(x.meta))
    return [p2, r2, Node("permute", (r2,), {"dims": swapped_last_two(x.type.ndim)}, x.type, meta=dict(x.meta))]


def run(graph: Graph, ctx) -> Graph:
    kernel_ops = ctx.kernel_ops
    nodes, changed = [], False
    for n in graph.nodes:
        if n.op in TRANSPOSED_OPERANDS:
            args = list(n.args)
            for i, a in enumerate(args):
                new = _reoriented(a, kernel_ops)
                if new is not None:
                    nodes += new
                    args[i] = new[-1]
                    changed = True
            n.args = tuple(args)
        nodes.append(n)
    graph.nodes = nodes
    return dce.run(graph) if changed else graph
