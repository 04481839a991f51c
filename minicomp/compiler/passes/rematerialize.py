"""Rematerialization for inference: which cheap shared values to recompute instead of storing.

Not a pass of its own: the fusion stage (fuse.py) asks `choose` about the values its conservative
schedule stored only because several kernels use them, then schedules once more, and asks again:
a value recomputed inside its consumers makes them read what it is computed from, so a value no
other kernel read before (a layer_norm backward's x - mean, once its x_hat = (x - mean) * rstd is
recomputed in the kernel summing the weight gradient down the columns) may be worth recomputing
now (at most ROUNDS schedules; the NormStack's backward writes 2.5 MB less a step). A value is
recomputed inside every kernel that uses it when the flops that adds cost less time than the bytes
it saves (a write and one read per consumer, less any new inputs the consumers must then load), at
the backend's flops-per-byte balance point. (Training's forward/backward cut is partition.py.)
"""
from __future__ import annotations

from ...ir import OPS, sym
from ...ir.types import itemsize
from ..schedule import KernelStep


MAX_RECOMPUTE = 24  # op-table cost per element a recomputed value may inline (bounds chains of them)
ROUNDS = 3  # schedules with recomputed values: after each, `choose` again (the readers changed)


def _subtree(node, stored):
    """Ops and leaf buffers `node` inlines when it is not stored itself."""
    ops, leaves, seen, stack = [], set(), set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n is not node and (n in stored or n.op in ("input", "constant") or OPS[n.op].category in
                              ("matmul", "extern", "tuple", "reduction")):
            leaves.add(n)
            continue
        ops.append(n)
        stack.extend(n.args)
    return ops, leaves


def _nbytes(n) -> int:
    """At the hints for a symbolic size: what to recompute only decides speed."""
    return sym.hint(n.type.numel) * itemsize(n.type.dtype)


def choose(sch, shared_only, flops_per_byte: float, order: dict):
    """The shared values worth recomputing, and the bytes that saves. Decided in program order
    against the values still stored, so a chain of cheap values is judged by its whole cost (each
    value recomputed inlines the ones before it that were chosen too)."""
    readers: dict = {}
    for step in sch.steps:
        if isinstance(step, KernelStep):
            for n in step.builder.buf_pos:
                readers.setdefault(n, []).append(step.builder)
    stored = set(sch.materialized)
    chosen, saved = set(), 0
    for n in sorted(shared_only, key=order.get):
        consumers = [b for b in readers.get(n, []) if n not in b.own]
        k = len(consumers)
        if k == 0:
            continue
        ops, leaves = _subtree(n, stored - {n})
        per_element = sum(OPS[o.op].cost for o in ops if OPS[o.op].category == "pointwise")
        if per_element > MAX_RECOMPUTE:
            continue
        extra_flops = k * sym.hint(n.type.numel) * per_element
        new_loads = sum(_nbytes(leaf) for b in consumers for leaf in leaves if leaf not in b.buf_pos)
        benefit = _nbytes(n) * (1 + k) - new_loads
        if benefit > 0 and extra_flops <= flops_per_byte * benefit:
            chosen.add(n)
            stored.discard(n)
            saved += benefit
    return chosen, saved
