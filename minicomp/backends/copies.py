"""Kernels that only move data, run as torch's copy_ (or fill_) on strided views of their buffers.

A kernel whose one store writes a load of another buffer (a transpose, a permuted or sliced copy),
or a constant (a zero fill before an index_put), at indexes that are plain sums of its loop
variables, is a strided copy: `dst.as_strided(...).copy_(src.as_strided(...))` does it without
machine code of our own. Two reasons to hand it to torch when it is big (COPY_MIN_BYTES or more):
- LLVM spends 2-8 ms on each such kernel body, even the smallest (HF BERT's training step had five
  transposes and three fills among 33 bodies);
- torch's copy walks a transposed tensor in tiles, our loop nest along the output's rows: swapping
  the last two dimensions of 48x128x64 floats took 340 us in our kernel, 74 us in copy_ (a head
  permute, whose rows stay contiguous, 20 us either way).
A small copy keeps its kernel: torch's call costs a few microseconds, and an all-kernel program
runs as one native call (runtime/cpu.py PlanRun), which a torch step would split.
"""
from __future__ import annotations

import math

from ..ir.index import Var
from ..ir.kernel import Kernel, check_sites
from ..ir.types import itemsize

COPY_MIN_BYTES = 1 << 18  # below this, torch's per-call cost outweighs what the copy takes


class TensorCopy:
    """A program step (runtime/program.py) for a strided-copy kernel: `slots` are its buffers' env
    slots (Kernel.buffers order), `spec` what strided_copy found."""

    def __init__(self, slots: list, spec: tuple):
        self.slots = slots
        self.spec = spec

    def emit(self, k: int, v, ns: dict) -> list:
        size, dst, dst_view, src, src_view = self.spec
        d = v(self.slots[dst])
        target = f"{d}.as_strided({size!r}, {dst_view[0]!r}, {d}.storage_offset() + {dst_view[1]})"
        if src_view is not None:  # else a fill with the constant src
            s = v(self.slots[src])
            return [f"{target}.copy_({s}.as_strided({size!r}, {src_view[0]!r}, {s}.storage_offset() + {src_view[1]}))"]
        ns[f"F{k}"] = src  # inf and nan have no literal
        return [f"{target}.fill_(F{k})"]


def strided_copy(k: Kernel):
    """(size, dst buffer, (strides, offset), src buffer or the constant, (strides, offset) or None)
    when kernel k is a big strided copy or fill (module docstring), else None."""
    if k.inner or k.stages or k.inner_stores or len(k.outer_stores) != 1 or check_sites(k):
        return None
    if not all(isinstance(v.size, int) for v in k.outer):
        return None
    st = k.outer_stores[0]
    value, dst = st.value, st.buf
    if value.op == "const":
        src, index = value.attrs.get("value"), None
        if not isinstance(src, (int, float, bool)) or value.dtype != k.buffers[dst].dtype:
            return None
    elif value.op == "load" and value.attrs["buf"] != dst and k.buffers[value.attrs["buf"]].dtype == k.buffers[dst].dtype:
        src, index = value.attrs["buf"], value.attrs["index"]
    else:
        return None
    dims = _dims(k, [st.index] + ([index] if index is not None else []))
    if dims is None or math.prod(d[2] for d in dims) * itemsize(k.buffers[dst].dtype) < COPY_MIN_BYTES:
        return None
    dst_view = _view(dims, st.index)
    src_view = _view(dims, index) if index is not None else None
    if dst_view is None or (index is not None and src_view is None) or not _one_to_one([d[2] for d in dims], dst_view[0]):
        return None
    return tuple(d[2] for d in dims), dst, dst_view, src, src_view


def _dims(k: Kernel, indexes):
    """The copy's dimensions, (variable, part, size) each: the kernel's loop variables in order, one
    that the indexes divide by c (`v // c`, `v % c`: two dimensions merged into one loop) split into
    its quotient ("div", size/c) and remainder ("mod", c). None where the indexes use anything else
    (a gather, nested divisions, one variable divided by two constants)."""
    sizes = {v.name: v.size for v in k.outer}
    split: dict = {}
    for index in indexes:
        for atom, _ in index.terms:
            if isinstance(atom, Var):
                continue
            e = atom.expr
            if atom.kind not in ("div", "mod") or e.const != 0 or len(e.terms) != 1:
                return None
            v, one = e.terms[0]
            c = atom.c
            if (not isinstance(v, Var) or one != 1 or v.name not in sizes or not isinstance(c, int) or c <= 0
                    or sizes[v.name] % c or split.setdefault(v.name, c) != c):
                return None
    dims = []
    for v in k.outer:
        c = split.get(v.name)
        dims += [(v.name, None, v.size)] if c is None else [(v.name, "div", v.size // c), (v.name, "mod", c)]
    return dims


def _view(dims, index):
    """(strides per dimension, offset) of an index that is a sum of the dimensions with constant
    non-negative coefficients, else None."""
    if not isinstance(index.const, int) or index.const < 0:
        return None
    split = {name: size for name, part, size in dims if part == "mod"}
    coef = dict.fromkeys(((name, part) for name, part, _ in dims), 0)
    for atom, c in index.terms:
        if not isinstance(c, int) or c < 0:
            return None
        if isinstance(atom, Var):
            if atom.name in split:  # v = c*(v // c) + v % c
                coef[atom.name, "div"] += c * split[atom.name]
                coef[atom.name, "mod"] += c
            else:
                coef[atom.name, None] += c
        else:
            coef[atom.expr.terms[0][0].name, atom.kind] += c
    return tuple(coef[name, part] for name, part, _ in dims), index.const


def _one_to_one(size: list, strides: tuple) -> bool:
    """Whether a view of these sizes and strides reaches each element once (a written view must:
    torch refuses to copy into overlapping memory, and a kernel never writes an element twice)."""
    dims = sorted((st, sz) for sz, st in zip(size, strides) if sz > 1)
    reach = 1
    for st, sz in dims:
        if st < reach:
            return False
        reach = st * sz
    return True
