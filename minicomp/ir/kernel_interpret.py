"""Run a Kernel with torch, all index points at once: the oracle for fusion and code generation.

Loop variables become broadcastable index grids; every expression, loads and reductions included,
runs through its row's torch reference in the scalar op table (ir/scalar.py): a load gathers at
the evaluated index expression, a reduction reduces its value over the inner axes. Stores scatter
into the output buffers. Slow and simple on purpose:
it checks that a kernel means what the graph meant, independently of any code generator.
"""
from __future__ import annotations

import torch

from . import index_values, sym, sym_values
from .index import Expr
from .kernel import Kernel, KExpr
from .scalar import SCALAR
from .types import DTYPES

_KEEPS_GUARD = ("load", "clamp_index")  # the kernel-level ops a cat part's guard applies to


class _Eval:
    def __init__(self, k: Kernel, bufs: list, device, sizes=None):
        self.k, self.bufs, self.device = k, [b.reshape(-1) for b in bufs], device
        self.sizes = sizes or {}  # symbol values: a kernel over symbolic extents runs at these
        vs = list(k.outer) + list(k.inner)
        self.ndim = len(vs)
        self.grid = {}
        self.extent = {v.name: self.n(v.size) for v in vs}
        for i, v in enumerate(vs):
            shape = [1] * self.ndim
            shape[i] = self.extent[v.name]
            self.grid[v.name] = torch.arange(self.extent[v.name], device=device).reshape(shape)
        self.memo: dict = {}
        self.accs: dict = {}

    def n(self, x) -> int:
        """An extent, coefficient or divisor at this run's sizes."""
        return sym.evaluate(x, self.sizes) if isinstance(x, sym.Sym) else x

    def index(self, e: Expr):
        return index_values.grid(e, self.grid, self.sizes, self.ndim, self.device,
                                 lambda c: self.value(c).to(torch.int64))

    # what the scalar table's references (ir/scalar.py) read from the evaluation
    def buf(self, i: int):
        return self.bufs[i]

    def acc(self, red):
        return self.accs[id(red)]

    def value(self, e: KExpr):
        hit = self.memo.get(id(e))
        if hit is not None:
            return hit
        attrs = e.attrs if e.op in _KEEPS_GUARD else {k: v for k, v in e.attrs.items() if k != "guard"}
        for name in ("size", "value"):  # a symbolic size (a clamp's bound, a count as a constant): at these sizes
            if isinstance(attrs.get(name), sym.Sym):
                attrs = dict(attrs, **{name: self.n(attrs[name])})
        out = SCALAR[e.op].ref([self.value(a) for a in e.args], attrs, self, e.dtype)
        self.memo[id(e)] = out
        return out

    def reduce(self, r) -> None:
        full = [self.extent[v.name] for v in self.k.outer + self.k.inner]
        x = self.value(r.value).expand(full) if full else self.value(r.value)
        self.accs[id(r)] = SCALAR[r.op].ref([x], {"outer": len(self.k.outer)}, self, r.dtype)

    def store(self, st, level: str) -> None:
        ext = self.extent
        full = [ext[v.name] for v in self.k.outer] + ([ext[v.name] for v in self.k.inner] if level == "inner"
                                                      else [1] * len(self.k.inner))
        idx = self.index(st.index).expand(full).reshape(-1)
        val = self.value(st.value).expand(full).reshape(-1)
        self.bufs[st.buf][idx] = val.to(self.bufs[st.buf].dtype)


def run_kernel(k: Kernel, bufs: list, device="cpu", sizes=None) -> None:
    """Execute `k` on `bufs` (one tensor per Kernel.buffers entry; outputs are written in place),
    a kernel over symbolic extents at `sizes` (symbol name -> int)."""
    ev = _Eval(k, bufs, device, sizes)
    for stage in k.stages:
        for r in stage:
            ev.reduce(r)
    for st in k.inner_stores:
        ev.store(st, "inner")
    for st in k.outer_stores:
        ev.store(st, "outer")


def kernel_node_ref(node, args: list, device, sizes=None):
    """Interpret a fused graph's `kernel` node: returns the tuple of its results."""
    k, io = node.meta["kernel"], node.meta["io"]
    results = [torch.empty(sym_values.concrete(t.shape, sizes or {}), dtype=DTYPES[t.dtype], device=device) for t in node.type]
    bufs = [args[j].contiguous() if kind == "arg" else results[j] for kind, j in io]
    run_kernel(k, bufs, device, sizes)
    return tuple(results)
