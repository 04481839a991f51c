"""Outputs in eager's layout: a result eager returns in a dense order other than row-major is
written in that order and handed out as a permuted view of it.

A pointwise op on a channels-last or transposed tensor keeps its input's layout in eager, and a
transposed result ((x * 2).t()) is a view there. Returned row-major, such an output has other
strides than eager's (`.view()` of it works where eager's raises, and the reverse) and costs a
kernel that gathers or scatters across rows. So the front end lowers output v, whose fx value has
strides that are dense in the order `order` (outermost dim first), as

    permute(copy(permute(v, order)), inverse(order))

The copy is a buffer the kernel computing v writes along its rows (reading a channels-last input
along its rows too); the scheduler (buffers.required_buffers) hands the outer permute out as a
view of that buffer rather than writing it again. Outputs with strides that are not a dense
permutation (a slice's, an expand's) and values that are inputs or constants keep the contiguous
result of before. Symbolic strides count when they are dense as expressions, in the order their
hints give. A training forward's saved values keep the layout the backward reads, except one that
an output of the user's is a view of (input_views.view_bases).

Channels-last saved values (CPU training): a value the forward's convolution reads, or a
convolution's result, saved for the backward, crosses in [N,H,W,C] order, as oneDNN wants it on
both sides. The partition (training.py) names those values in both graphs' meta (NHWC_SAVED). The
forward lays such an output out like an eager channels-last output (the permuted view of a copy
its kernel writes; passes/channels_last.py hands a convolution's own [N,H,W,C] result out instead
of copying it); the backward takes that input as an [N,H,W,C] input viewed back (`nhwc_input`;
the caller permutes the tensor it passes: `nhwc_positions`), so its convolution backward reads
the saved buffer as it is. Were the tensor laid out otherwise, the program's input check copies it.
"""
from __future__ import annotations

import torch

from ..ir import Node

USER_OUTPUTS = "minicomp_user_outputs"  # GraphModule.meta key: how many of a training forward's
                                        # outputs AOTAutograd hands back (the rest are saved values)
NHWC_SAVED = "minicomp_nhwc_saved"      # GraphModule.meta key: fx names of the saved values that cross
                                        # in [N,H,W,C] order (forward outputs, backward inputs)
NHWC, NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def laid_out(kind: str, gm) -> int | None:
    """How many of the first outputs of a graph of `kind` take eager's layout (None: all): an
    inference graph's all, a training forward's own (what our partition saves for the backward stays
    as the backward reads it), a backward's none (gradients are accumulated contiguous)."""
    return None if kind == "inference" else gm.meta.get(USER_OUTPUTS, 0) if kind == "forward" else 0


def dense_order(shape, stride):
    """The dims from outermost to innermost when `stride` is dense (no gaps, no overlaps) in an
    order other than row-major; None when it is row-major, not dense or empty. Size-1 dims go first:
    their stride means nothing. Symbolic sizes and strides (SymInts) are ordered by their hints and
    must be dense as expressions (eager's attention output, (B, T, H, D) in memory for every T)."""
    if len(shape) < 2:
        return None
    hints = [_hint(v) for v in (*shape, *stride)]
    if None in hints or 0 in hints[:len(shape)]:
        return None
    size, step = hints[:len(shape)], hints[len(shape):]
    ones = [d for d in range(len(shape)) if size[d] == 1]
    big = sorted((d for d in range(len(shape)) if size[d] != 1), key=lambda d: (-step[d], d))
    if big == sorted(big):
        return None  # row-major (up to size-1 dims)
    expect = 1
    for d in reversed(big):
        if not _same(stride[d], expect):
            return None
        expect = expect * _expr(shape[d])
    return tuple(ones + big)


def _hint(v):
    """An int, or a SymInt's value at the sizes being compiled (None: it has none)."""
    return v if type(v) is int else getattr(getattr(v, "node", None), "hint", None)


def _expr(v):
    return v if type(v) is int else v.node.expr


def _same(a, b) -> bool:
    """Whether size expressions a and b are equal for every value of their symbols (no guard)."""
    import sympy
    if type(a) is int and type(b) is int:
        return a == b
    return sympy.simplify(sympy.sympify(_expr(a)) - sympy.sympify(b)) == 0


def is_layout_view(node: Node) -> bool:
    """Whether graph output `node` is the permuted view of a copy that this module made (or a user's
    x.clone().permute(...)), or of a channels-last convolution's new [N,H,W,C] result: handed out
    as a view of that buffer."""
    return node.op == "permute" and node.args[0].op in ("copy", "conv_cl")


def permuted(t, dims):
    """TensorType t with its dims in the order `dims`."""
    return type(t)(tuple(t.shape[d] for d in dims), t.dtype)


def nhwc_saved(gm) -> frozenset:
    """The fx names of the saved values a training graph takes or gives in [N,H,W,C] order."""
    return gm.meta.get(NHWC_SAVED, frozenset())


def nhwc_input(b, node: Node) -> Node:
    """A backward's [N,H,W,C] input `node` (its type already in that order) as the [N,C,H,W] value
    the graph computes with."""
    return b.emit("permute", node, dims=NCHW)


def in_nhwc(b, value):
    """A saved output handed to the backward in [N,H,W,C] order: [N,C,H,W] in type, a permuted
    view of the buffer a kernel writes in that order."""
    if not isinstance(value, Node) or value.op in ("input", "constant") or is_layout_view(value):
        return value
    return b.emit("permute", b.emit("copy", b.emit("permute", value, dims=NHWC)), dims=NCHW)


def nhwc_positions(gm) -> dict:
    """{placeholder position: NHWC} for the inputs a backward takes in [N,H,W,C] order."""
    names = nhwc_saved(gm)
    return {i: NHWC for i, n in enumerate(gm.graph.find_nodes(op="placeholder")) if n.name in names} if names else {}


def in_eager_layout(b, fx_out, value):
    """Output `value` (lowered from fx node `fx_out`) laid out as eager lays it out, through
    Builder b."""
    val = fx_out.meta.get("val")
    if not isinstance(value, Node) or value.op in ("input", "constant") or is_layout_view(value) \
            or not isinstance(val, torch.Tensor) or val.layout != torch.strided:
        return value
    order = dense_order(tuple(val.shape), tuple(val.stride()))
    if order is None:
        return value
    inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return b.emit("permute", b.emit("copy", b.emit("permute", value, dims=order)), dims=inverse)
