"""What the layout of a value will be at run time, known when compiling.

The IR carries no strides (ir/types.py): layout is the backends' decision. Program makes the inputs
kernels read and the constants contiguous, kernels write contiguous buffers, and mm and bmm return
new contiguous tensors. From those roots a chain of views is index arithmetic known now: computed
once on meta tensors here, it runs as one `as_strided` instead of a dispatcher call per view. Other
tensors (an input only torch ops read, a torch result) are contiguous in almost every call: their
views take the same path behind a contiguity check, and the torch ops when it fails. The
scheduler (compiler/buffers.py) asks the same question to see which reshapes torch would copy.

Compiles run inside AOTAutograd's FakeTensorMode, which would turn these meta tensors into fake
ones: every view then goes through the fake tensor's dispatch (about 1 ms a reshape when cold,
0.12 s of an HF GPT-2 compile). The layout arithmetic runs with that mode set aside (`real_meta`).
"""
from __future__ import annotations

import contextlib

import torch

try:  # private, stable since torch 2.1: the one way to leave a fake mode for a moment
    from torch._subclasses.fake_tensor import unset_fake_temporarily as real_meta
except ImportError:  # a torch without it: the tensors stay fake, only slower
    real_meta = contextlib.nullcontext

from ..ir import DTYPES, OPS, Node, TensorType, sym_values

CONTIGUOUS_TORCH_OPS = ("mm", "bmm", "conv_cl")  # torch ops whose result is always a new contiguous tensor
# torch ops whose first n operands must be buffers in their own type's order, not views of another
# layout (conv_cl's [N,H,W,C] input and weight, conv_backward_cl's grad_output and input: a kernel
# writes them so)
ORDERED_OPERANDS = {"conv_cl": 2, "conv_backward_cl": 2}


def meta_of(node: Node):
    """A meta tensor of node's type, contiguous: the stand-in for views' layout arithmetic (over
    symbolic sizes at the hints: what the scheduler asks of it only decides speed)."""
    return torch.empty(sym_values.hinted(node.type.shape), dtype=DTYPES[node.type.dtype], device="meta")


def free_layout_inputs(graph) -> set:
    """Inputs no kernel reads, directly or through views: torch ops take them in the layout they come
    in (a transposed weight AOTAutograd saved for the backward goes to mm as it is, not copied)."""
    users = graph.users()
    free = set()
    for x in graph.inputs:
        stack, ok = [x], True
        while stack and ok:
            for u in users.get(stack.pop(), ()):
                if u.op == "kernel":
                    ok = False
                    break
                if u.op in OPS and OPS[u.op].category == "view":
                    stack.append(u)
        if ok:
            free.add(x)
    return free


def static_views(graph, kernel_inputs, free=frozenset()) -> dict:
    """{view node: (root node, size, stride, offset, guarded)} for the views whose layout is known
    when compiling, or known whenever their root is contiguous (`guarded`).

    Roots have a known contiguous layout at run time: inputs and constants (Program makes them
    contiguous), kernel results, mm and bmm results, and torch results that kernels read (made
    contiguous). A chain of views (reshape, permute, expand, slice) from a root is then one
    `as_strided` of the root, computed here by running the ops on meta tensors -- a gpt block has
    twenty of them between its matmuls, each a few microseconds through the dispatcher. A reshape
    that must copy ends the chain (it stays a torch op), and so does a view a kernel reads that is
    not contiguous. The other roots -- `free` inputs (taken in whatever layout they come in) and
    torch results no kernel reads -- are contiguous in almost every call (a saved activation, a
    column sum) but not always (a transposed weight): their views are `guarded`, one as_strided
    while the root is contiguous, the torch ops otherwise (Program checks at each call)."""
    with real_meta():
        return _static_views(graph, kernel_inputs, free)


def _static_views(graph, kernel_inputs, free) -> dict:
    meta: dict = {}   # node -> (root node, meta tensor of the node, meta tensor of the root)
    guarded: set = set()  # roots whose layout is only checked at run time
    out = {}

    def root(n, unsure=False):
        t = meta_of(n)
        meta[n] = (n, t, t)
        if unsure:
            guarded.add(n)
    for n in graph.inputs:
        root(n, n in free)
    for n in graph.nodes:
        if n.op == "constant" or (n.op == "getitem" and n.args[0].op == "kernel"):
            root(n)
        elif OPS[n.op].category == "view" and n.args and n.args[0] in meta:
            r, base_meta, root_meta = meta[n.args[0]]
            t = OPS[n.op].ref([base_meta], n.attrs, "meta")
            if t._is_view() and t._base is root_meta and (n not in kernel_inputs or t.is_contiguous()):
                meta[n] = (r, t, root_meta)
                out[n] = (r, tuple(t.shape), t.stride(), t.storage_offset(), r in guarded)
            elif n in kernel_inputs:  # made contiguous
                root(n)
            elif t.is_contiguous() and not t._is_view():  # copied: contiguous, unless a guarded root was not
                root(n, r in guarded)
        elif isinstance(n.type, TensorType) and (n in kernel_inputs or n.op in CONTIGUOUS_TORCH_OPS):
            root(n)  # a torch result made contiguous, or a new matmul result (always contiguous)
        elif isinstance(n.type, TensorType):
            root(n, True)  # a torch result in the layout torch gives it
    return out
