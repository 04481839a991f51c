"""Run a Kernel with torch, all index points at once: the oracle for fusion and code generation.

Loop variables become broadcastable index grids, loads become gathers at the evaluated index
expression, pointwise ops run through the op table's torch references, a reduction reduces its
value over the inner axes, and stores scatter into the output buffers. Slow and simple on purpose:
it checks that a kernel means what the graph meant, independently of any code generator.
"""
from __future__ import annotations

import torch

from ..errors import KernelIndexError

from .index import Expr, Var
from .kernel import Kernel, KExpr
from .ops import OPS
from .types import DTYPES

_REDUCE = {"sum": torch.sum, "prod": torch.prod, "amax": torch.amax, "amin": torch.amin}


class _Eval:
    def __init__(self, k: Kernel, bufs: list, device):
        self.k, self.bufs, self.device = k, [b.reshape(-1) for b in bufs], device
        vs = list(k.outer) + list(k.inner)
        self.ndim = len(vs)
        self.grid = {}
        for i, v in enumerate(vs):
            shape = [1] * self.ndim
            shape[i] = v.size
            self.grid[v.name] = torch.arange(v.size, device=device).reshape(shape)
        self.memo: dict = {}
        self.accs: dict = {}

    def index(self, e: Expr):
        total = torch.full([1] * self.ndim, e.const, dtype=torch.int64, device=self.device)
        for atom, c in e.terms:
            if isinstance(atom, Var):
                v = self.grid[atom.name]
            elif atom.kind == "data":
                v = self.value(atom.c).to(torch.int64)
            else:
                inner = self.index(atom.expr)
                v = torch.div(inner, atom.c, rounding_mode="floor") if atom.kind == "div" else inner % atom.c
            total = total + v * c
        return total

    def value(self, e: KExpr):
        hit = self.memo.get(id(e))
        if hit is not None:
            return hit
        if e.op == "load":
            idx = self.index(e.attrs["index"])
            guard = e.attrs.get("guard")
            if guard is not None:
                idx = torch.where(self.value(guard), idx, torch.zeros_like(idx))
            out = self.bufs[e.attrs["buf"]][idx]
        elif e.op == "const":
            out = torch.full([1] * self.ndim, e.attrs["value"], dtype=DTYPES[e.dtype], device=self.device)
        elif e.op == "index":
            out = self.index(e.attrs["expr"]).to(DTYPES[e.dtype])
        elif e.op == "acc":
            out = self.accs[id(e.attrs["red"])]
        elif e.op == "clamp_index":
            i = self.value(e.args[0]).to(torch.int64)
            size = e.attrs["size"]
            bad = (i < 0) | (i >= size)
            if e.attrs.get("guard") is not None:  # a cat part read where it is not selected
                bad = bad & self.value(e.attrs["guard"])
            if bool(bad.any()):  # as eager, and as the CPU kernels report
                raise KernelIndexError(f"minicomp: index out of range in {e.attrs['where']} (a dimension of size {size})")
            out = i.clamp(0, size - 1)  # where a guard discards the read, it still stays in memory
        else:
            attrs = {k: v for k, v in e.attrs.items() if k != "guard"}
            out = OPS[e.op].ref([self.value(a) for a in e.args], attrs, self.device)
        self.memo[id(e)] = out
        return out

    def reduce(self, r) -> None:
        n_outer = len(self.k.outer)
        full = [v.size for v in self.k.outer + self.k.inner]
        x = self.value(r.value).expand(full) if full else self.value(r.value)
        dims = tuple(range(n_outer, self.ndim))
        if r.op in ("argmax", "argmin"):
            flat = x.reshape(*x.shape[:n_outer], -1)
            out = (torch.argmax if r.op == "argmax" else torch.argmin)(flat, dim=-1)
        elif not dims:
            out = x
        elif r.op == "prod":
            out = x
            for d in reversed(dims):
                out = torch.prod(out, d)
        else:
            out = _REDUCE[r.op](x, dims)
        self.accs[id(r)] = out.reshape(list(out.shape) + [1] * len(dims))

    def store(self, st, level: str) -> None:
        full = [v.size for v in self.k.outer] + ([v.size for v in self.k.inner] if level == "inner" else [1] * len(self.k.inner))
        idx = self.index(st.index).expand(full).reshape(-1)
        val = self.value(st.value).expand(full).reshape(-1)
        self.bufs[st.buf][idx] = val.to(self.bufs[st.buf].dtype)


def run_kernel(k: Kernel, bufs: list, device="cpu") -> None:
    """Execute `k` on `bufs` (one tensor per Kernel.buffers entry; outputs are written in place)."""
    ev = _Eval(k, bufs, device)
    for stage in k.stages:
        for r in stage:
            ev.reduce(r)
    for st in k.inner_stores:
        ev.store(st, "inner")
    for st in k.outer_stores:
        ev.store(st, "outer")


def kernel_node_ref(node, args: list, device):
    """Interpret a fused graph's `kernel` node: returns the tuple of its results."""
    k, io = node.meta["kernel"], node.meta["io"]
    results = [torch.empty(t.shape, dtype=DTYPES[t.dtype], device=device) for t in node.type]
    bufs = [args[j].contiguous() if kind == "arg" else results[j] for kind, j in io]
    run_kernel(k, bufs, device)
    return tuple(results)
