"""Index-set splitting: one loop nest per range of a variable the stores compare with constants.

A cat kernel picks its value per element, `where(i >= 128 & i < 256, part1, where(..., part0, part2))`,
so a plain loop evaluates every part at every element: three guarded loads for one value, and index
math (the parts are views of heads, `(128*i1 + i - 128) // 8192 ...`) that cannot simplify because
`i` spans all parts. Split the loop over `i` at the constants it is compared with, and within each
piece

  - `i` becomes `lo + i'` with i' in [0, hi - lo): the comparisons are constants, the where chain folds
    to the one part, the other parts' loads are gone, and with i' 's range known the index math
    simplifies;
  - if the part's index divides i' by c (a reshape of heads: `i' // 32`, `i' % 32`), i' is tiled into
    (i' // c, i' % c) loops, so the innermost loop reads contiguously and vectorizes.

Pointwise kernels only (a cat, a pad). Only the CPU code generator splits: a GPU thread computes one
element, and only threads at a boundary diverge.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.index import Expr, Var, map_data
from ..ir.kernel import Kernel, KExpr, Store, map_attrs
from .collapse import collapse

MAX_PIECES = 64
_COMPARE = {"ge": lambda lo, hi, c: (lo >= c, hi < c), "gt": lambda lo, hi, c: (lo > c, hi <= c),
            "lt": lambda lo, hi, c: (hi < c, lo >= c), "le": lambda lo, hi, c: (hi <= c, lo > c)}


@dataclass
class Piece:
    kernel: Kernel  # the piece's loops and stores; its buffers are the kernel's
    pos: int        # which outer variable was split
    lo: int         # the piece covers [lo, hi) of that variable
    hi: int


def _compared_var(e: KExpr):
    """(variable name, constant) when e compares a loop variable with an integer constant."""
    if e.op not in _COMPARE or len(e.args) != 2:
        return None
    a, c = e.args
    if a.op != "index" or c.op != "const" or not isinstance(c.attrs["value"], int):
        return None
    x = a.attrs["expr"]
    if x.const != 0 or len(x.terms) != 1 or not isinstance(x.terms[0][0], Var) or x.terms[0][1] != 1:
        return None
    return x.terms[0][0].name, c.attrs["value"]


def split(k: Kernel) -> list[Piece] | None:
    """The pieces of pointwise kernel k (collapsed), or None when no split applies."""
    if k.inner or k.stages or not k.outer:
        return None
    cuts: dict = {}
    for e in k.exprs():
        hit = _compared_var(e)
        if hit is not None:
            cuts.setdefault(hit[0], set()).add(hit[1])
    names = [v.name for v in k.outer]
    best = None
    for name, cs in cuts.items():
        if name not in names:
            continue
        size = k.outer[names.index(name)].size
        if not isinstance(size, int):  # a symbolic extent: no split on it (one nest, the selects kept)
            continue
        inside = sorted(c for c in cs if 0 < c < size)
        if inside and (best is None or len(inside) > len(best[1])):
            best = (name, inside)
    if best is None or len(best[1]) + 1 > MAX_PIECES:
        return None
    pos = names.index(best[0])
    bounds = [0, *best[1], k.outer[pos].size]
    return [_piece(k, pos, lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def _piece(k: Kernel, pos: int, lo: int, hi: int) -> Piece:
    v = k.outer[pos]
    local = Var(f"{v.name}_{lo}", hi - lo)
    rw = _Rewriter({v.name: Expr.of(local) + lo})
    outer = list(k.outer)
    outer[pos] = local
    stores = [Store(s.buf, rw.expr(s.index), rw.kexpr(s.value)) for s in k.outer_stores]
    c = _tile(stores, local) if pos > 0 else None
    if c is not None:  # i' = c*a + b: i' // c == a, i' % c == b
        a, b = Var(local.name + "_a", local.size // c), Var(local.name + "_b", c)
        rw = _Rewriter({local.name: Expr.of(a) * c + b})
        stores = [Store(s.buf, rw.expr(s.index), rw.kexpr(s.value)) for s in stores]
        outer[pos:pos + 1] = [a, b]
    piece = Kernel(**{**k.__dict__, "outer": tuple(outer), "outer_stores": stores})
    return Piece(collapse(piece, keep_first=True), pos, lo, hi)


def _tile(stores, v: Var):
    """The largest c dividing v's size that v is divided or reduced by, as a whole, in the indices."""
    found = set()

    def visit(e: Expr):
        for atom, _ in e.terms:
            if isinstance(atom, Var):
                continue
            if atom.kind in ("div", "mod"):
                x = atom.expr
                if x == Expr.of(v):
                    found.add(atom.c)
                visit(atom.expr)
    seen = set()
    for s in stores:
        visit(s.index)
        for e in _walk(s.value, seen):
            if e.op == "load":
                visit(e.attrs["index"])
            elif e.op == "index":
                visit(e.attrs["expr"])
    ok = [c for c in found if isinstance(c, int) and isinstance(v.size, int) and 1 < c < v.size and v.size % c == 0]
    return max(ok) if ok else None


def _walk(e: KExpr, seen: set):
    stack = [e]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        stack.extend(x.args)
        if isinstance(x.attrs.get("guard"), KExpr):
            stack.append(x.attrs["guard"])


def _const_b8(value: bool) -> KExpr:
    return KExpr("const", (), {"value": value}, "b8")


def _truth(e: KExpr):
    return e.attrs["value"] if e.op == "const" and e.dtype == "b8" else None


class _Rewriter:
    """Substitute variables in every index, folding what becomes constant: comparisons of an index
    whose range is decided, logical and/or/not of constants, a where with a constant condition."""

    def __init__(self, mapping: dict):
        self.mapping = mapping
        self.memo: dict = {}

    def expr(self, e: Expr) -> Expr:
        return map_data(e.substitute(self.mapping), self.kexpr)

    def kexpr(self, e: KExpr) -> KExpr:
        hit = self.memo.get(id(e))
        if hit is None:
            hit = self.memo[id(e)] = self._fold(e)
        return hit

    def _fold(self, e: KExpr) -> KExpr:
        if e.op == "where":
            cond = self.kexpr(e.args[0])
            t = _truth(cond)
            if t is not None:
                return self.kexpr(e.args[1] if t else e.args[2])
        attrs = map_attrs(e, self.expr, self.kexpr)
        if isinstance(attrs.get("guard"), KExpr) and _truth(attrs["guard"]) is True:
            del attrs["guard"]
        args = tuple(self.kexpr(a) for a in e.args)
        if e.op in _COMPARE and args[0].op == "index" and args[1].op == "const" and isinstance(
                args[1].attrs["value"], int):
            lo, hi = args[0].attrs["expr"].range()
            if isinstance(lo, int) and isinstance(hi, int):  # (over symbolic sizes: left to run time)
                true, false = _COMPARE[e.op](lo, hi, args[1].attrs["value"])
                if true or false:
                    return _const_b8(true)
        truths = [_truth(a) for a in args]
        if e.op == "logical_and" and (False in truths or truths == [True, True]):
            return _const_b8(False not in truths)
        if e.op == "logical_and" and True in truths:
            return args[truths.index(None)]
        if e.op == "logical_or" and (True in truths or truths == [False, False]):
            return _const_b8(True in truths)
        if e.op == "logical_or" and False in truths:
            return args[truths.index(None)]
        if e.op == "logical_not" and truths[0] is not None:
            return _const_b8(not truths[0])
        return KExpr(e.op, args, attrs, e.dtype)
