"""Merge adjacent loop variables a, b into one when every index stays affine (no // or %).

After fusion a pointwise kernel over (64, 1024) that reads and writes contiguously is one loop of
65536 iterations: longer vector loops, and the outermost loop splits evenly across threads. The
test is direct: substitute a = m // size(b), b = m % size(b) into every index expression and keep
the merge only if the divisions and moduli simplify away. Both code generators use it.
"""
from __future__ import annotations

from ..ir.index import Expr, Var, map_data
from ..ir.kernel import Kernel, KExpr, Reduction, Store, map_attrs


class _Rewriter:
    def __init__(self, mapping: dict, merged: str):
        self.mapping, self.merged = mapping, merged
        self.memo: dict = {}
        self.ok = True

    def expr(self, e: Expr) -> Expr:
        out = map_data(e.substitute(self.mapping), self.kexpr)
        if not _affine_in(out, self.merged):
            self.ok = False
        return out

    def kexpr(self, e: KExpr) -> KExpr:
        hit = self.memo.get(id(e))
        if hit is not None:
            return hit
        attrs = map_attrs(e, self.expr, self.kexpr)
        if e.op == "acc":
            attrs["red"] = self.red(attrs["red"])
        out = KExpr(e.op, tuple(self.kexpr(a) for a in e.args), attrs, e.dtype)
        self.memo[id(e)] = out
        return out

    def red(self, r: Reduction) -> Reduction:
        hit = self.memo.get(id(r))
        if hit is None:
            hit = self.memo[id(r)] = Reduction(r.op, None, r.dtype, r.stage)
            hit.value = self.kexpr(r.value)
        return hit


def _affine_in(e: Expr, name: str) -> bool:
    for a, _ in e.terms:
        if not isinstance(a, Var) and (a.expr is not None and name in a.expr.vars()):
            return False
    return True


def _index_exprs(k: Kernel) -> list:
    """Every index expression of k: its stores' offsets, its loads' and index ops'."""
    out = [s.index for s in k.inner_stores + k.outer_stores]
    for e in k.exprs():
        for name in ("index", "expr"):
            v = e.attrs.get(name)
            if isinstance(v, Expr):
                out.append(v)
    return out


def _surely_not_affine(exprs: list, a: Var, b: Var) -> bool:
    """Whether merging a, b leaves a // or % for certain, told without rewriting the kernel (most
    pairs a kernel tries do not merge): an index holding a and b only as terms of their own (not
    inside a // or %) with integer coefficients ca, cb becomes ca*(m // size(b)) + cb*(m % size(b)),
    which is affine exactly when ca == cb * size(b). Indices with a or b inside a // or % (a
    reshape's) are left to the rewrite, which may simplify them away."""
    if not (isinstance(a.size, int) and isinstance(b.size, int) and a.size > 1 and b.size > 1):
        return False
    names = {a.name, b.name}
    for e in exprs:
        ca = cb = 0
        for atom, c in e.terms:
            if isinstance(atom, Var):
                if atom.name == a.name:
                    ca = c
                elif atom.name == b.name:
                    cb = c
            elif atom.expr is not None and names & atom.expr.vars():
                break
        else:
            # (a symbolic coefficient is not asked: its truth would become a guard of the program)
            if isinstance(ca, int) and isinstance(cb, int) and (ca or cb) and ca != cb * b.size:
                return True
    return False


def _try_merge(k: Kernel, level: str, i: int, exprs: list):
    vs = list(getattr(k, level))
    a, b = vs[i], vs[i + 1]
    if b.size == 0:  # an empty loop runs nothing whatever its neighbours; no m // 0 to build
        return None
    if _surely_not_affine(exprs, a, b):
        return None
    m = Var(f"{a.name}_{b.name}", a.size * b.size)
    rw = _Rewriter({a.name: Expr.of(m).floordiv(b.size), b.name: Expr.of(m).mod(b.size)}, m.name)
    stages = [[rw.red(r) for r in st] for st in k.stages]
    inner = [Store(s.buf, rw.expr(s.index), rw.kexpr(s.value)) for s in k.inner_stores]
    outer = [Store(s.buf, rw.expr(s.index), rw.kexpr(s.value)) for s in k.outer_stores]
    if not rw.ok:
        return None
    vs[i:i + 2] = [m]
    out = Kernel(**{**k.__dict__})
    setattr(out, level, tuple(vs))
    out.stages, out.inner_stores, out.outer_stores = stages, inner, outer
    return out


def collapse(k: Kernel, keep_first: bool = False) -> Kernel:
    """k with adjacent loops merged where every index stays affine; `keep_first` leaves the first
    outer loop as it is (the runtime splits its range across threads)."""
    exprs = _index_exprs(k)
    for level in ("outer", "inner"):
        i = 1 if keep_first and level == "outer" else 0
        while i < len(getattr(k, level)) - 1:
            merged = _try_merge(k, level, i, exprs)
            if merged is None:
                i += 1
            else:
                k = merged
                exprs = _index_exprs(k)
    return k
