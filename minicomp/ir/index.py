"""Index expressions: the small affine language kernels address memory with.

An Expr is  const + sum(coeff * atom)  where an atom is a loop variable, a floor-division or modulo of
an Expr by a positive constant (what a reshape turns into), or a loaded integer value (gather).
Every loop variable carries its range [0, size), which lets `//` and `%` simplify away:
(8*i + j) // 8 == i when 0 <= j < 8, and (8*i + j) % 8 == j. Simplification happens on
construction, so two equal indices print the same and compare equal.

Over symbolic sizes (ir/sym.py) a variable's range, a coefficient, the constant and a divisor may be
symbolic: (s0*i + j) // s0 == i still simplifies when j < s0. Simplification here only ever uses what
holds for every size (sym.known), never a guard: a rewrite it cannot prove is left as a division.
"""
from __future__ import annotations

from typing import Union

from . import sym


def _is0(c) -> bool:
    return isinstance(c, int) and c == 0


def _divides(d, c) -> bool:
    """d divides c for every size."""
    if isinstance(c, int) and isinstance(d, int):
        return c % d == 0
    return sym.exact_div(c, d) is not None


def _same(a, b) -> bool:
    """a and b are the same size expression (structurally: never a guard)."""
    return _is0(sym.add(a, sym.mul(b, -1)))


def _known_lt(x, d) -> bool:
    return x is not None and sym.known(x, "<", d)


def _known_ge0(x) -> bool:
    return x is not None and sym.known(x, ">=", 0)


class Var:
    __slots__ = ("name", "size", "_key", "_order")

    def __init__(self, name: str, size: int):
        # the size is part of the key: an Expr's key then says all that its simplification used (the
        # ranges of its variables), which the memo of linear/unravel relies on; terms still sort by name
        for k, v in (("name", name), ("size", size), ("_key", ("v", name, _ck(size))), ("_order", repr(("v", name)))):
            object.__setattr__(self, k, v)

    def __setattr__(self, k, v):
        raise AttributeError("a Var never changes: Exprs of several kernels share it (the memo of linear/unravel); "
                             "make a new one")

    def __reduce__(self):  # pickle and deepcopy build it anew (they would set its slots one by one)
        return Var, (self.name, self.size)

    def __repr__(self):
        return self.name

    def key(self):
        return self._key


class _Op:
    """floordiv / mod of an Expr by a positive constant; `data` is a loaded index value (gather)."""
    __slots__ = ("kind", "expr", "c", "_key", "_order")

    def __init__(self, kind: str, expr, c):
        self.kind, self.expr, self.c = kind, expr, c
        self._key = self._order = None

    def __repr__(self):
        if self.kind == "data":
            return f"data({self.c})"
        return f"(({self.expr}) {'//' if self.kind == 'div' else '%'} {_fmt(self.c)})"

    def key(self):
        if self._key is None:
            self._key = (self.kind, self.expr.key() if self.expr is not None else None,
                         _ck(self.c) if self.kind != "data" else id(self.c))
            self._order = repr(self._key)
        return self._key


class Expr:
    # terms: tuple of (atom, coeff) sorted by the repr of the atom's key, no zero coeffs. An Expr
    # never changes once built, so its key is computed once (scheduling a model builds tens of
    # thousands of them; the keys and the sort were a third of a cold compile's fusion time).
    __slots__ = ("const", "terms", "_key")

    def __init__(self, const: int = 0, terms=()):
        self.const = const
        self._key = None
        if len(terms) < 2:  # nothing to merge or to undo: most Exprs (a variable, a constant)
            self.terms = tuple(terms) if not terms or not _is0(terms[0][1]) else ()
            return
        merged: dict = {}
        atoms: dict = {}
        for atom, c in terms:
            k = atom.key()
            merged[k] = merged.get(k, 0) + c
            atoms[k] = atom
        # c*(X // c) + X % c == X: undo a split that a later reshape merged back
        for k, atom in list(atoms.items()):
            if k in merged and isinstance(atom, _Op) and atom.kind == "mod":
                dk = ("div", atom.expr.key(), _ck(atom.c))
                if dk in merged and not _is0(merged[k]) and _same(merged[dk], sym.mul(merged[k], atom.c)):
                    coef = merged.pop(k)
                    merged.pop(dk)
                    for a2, c2 in atom.expr.terms:
                        k2 = a2.key()
                        merged[k2] = merged.get(k2, 0) + c2 * coef
                        atoms[k2] = a2
                    const = const + atom.expr.const * coef
        self.const = const
        order = sorted(merged, key=lambda k: atoms[k]._order) if len(merged) > 1 else merged
        self.terms = tuple((atoms[k], merged[k]) for k in order if not _is0(merged[k]))

    @staticmethod
    def of(x: Union[int, Var, "_Op", "Expr"]) -> "Expr":
        if isinstance(x, Expr):
            return x
        if isinstance(x, (int, sym.Sym)):
            return Expr(x)
        return Expr(0, ((x, 1),))

    def key(self):
        if self._key is None:
            self._key = (_ck(self.const), tuple((a.key(), _ck(c)) for a, c in self.terms))
        return self._key

    def __eq__(self, other):
        return isinstance(other, (Expr, int, sym.Sym)) and self.key() == Expr.of(other).key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        parts = [(repr(a) if isinstance(c, int) and c == 1 else f"{_fmt(c)}*{a}") for a, c in self.terms]
        if not _is0(self.const) or not parts:
            parts.append(_fmt(self.const))
        return " + ".join(parts)

    # -- arithmetic --------------------------------------------------------------------------------
    def __add__(self, other):
        o = Expr.of(other)
        return Expr(self.const + o.const, self.terms + o.terms)

    __radd__ = __add__

    def __mul__(self, k):
        assert isinstance(k, (int, sym.Sym)), "index expressions are affine: multiply by constants or sizes only"
        return Expr(sym.mul(self.const, k), tuple((a, sym.mul(c, k)) for a, c in self.terms))

    __rmul__ = __mul__

    def __sub__(self, other):
        return self + Expr.of(other) * -1

    def range(self) -> tuple:
        """Inclusive [lo, hi] bounds from the variables' ranges: ints, or size expressions over
        symbolic sizes; None where unbounded or of unknown sign (data atoms, a size of either sign)."""
        lo = hi = self.const
        for a, c in self.terms:
            alo, ahi = _atom_range(a)
            if isinstance(c, int) and c >= 0 or not isinstance(c, int) and sym.known(c, ">=", 0):
                tlo, thi = _times(c, alo), _times(c, ahi)
            elif isinstance(c, int) or sym.known(c, "<=", 0):
                tlo, thi = _times(c, ahi), _times(c, alo)
            else:
                tlo = thi = None
            lo = None if lo is None or tlo is None else sym.add(lo, tlo)
            hi = None if hi is None or thi is None else sym.add(hi, thi)
        return lo, hi

    def floordiv(self, d) -> "Expr":
        assert isinstance(d, sym.Sym) or d > 0
        if isinstance(d, int) and d == 1:
            return self
        # split terms into a part divisible by d and a remainder; if the remainder stays in [0, d)
        # after pulling out whole multiples from the constant, the division distributes exactly.
        q_terms = [(a, sym.exact_div(c, d)) for a, c in self.terms if _divides(d, c)]
        r_terms = [(a, c) for a, c in self.terms if not _divides(d, c)]
        q_const, r_const = _divmod(self.const, d)
        rest = Expr(r_const, tuple(r_terms))
        lo, hi = rest.range()
        if _known_ge0(lo) and _known_lt(hi, d):
            return Expr(q_const, tuple(q_terms))
        split = self._split(d)
        if split is not None:  # (c*X + r) // d == X // (d/c) when 0 <= r < c and c divides d
            c, x, _ = split
            return x.floordiv(sym.exact_div(d, c))
        return Expr(q_const, tuple(q_terms) + ((_Op("div", rest, d), 1),))

    def _split(self, d) -> "tuple | None":
        """Find c > 1 dividing d with self == c*X + r, 0 <= r < c; returns (c, X, r) or None."""
        cands = {}
        for _, c in self.terms:
            if isinstance(c, int) and c > 1 and isinstance(d, int) and d % c == 0 or \
                    isinstance(c, sym.Sym) and sym.known(c, ">", 1) and _divides(c, d):
                cands[repr(c)] = c
        for c in sorted(cands.values(), key=lambda c: (isinstance(c, int), c if isinstance(c, int) else 0), reverse=True):
            big = [(a, sym.exact_div(k, c)) for a, k in self.terms if _divides(c, k)]
            small = [(a, k) for a, k in self.terms if not _divides(c, k)]
            q, r0 = _divmod(self.const, c)
            r = Expr(r0, tuple(small))
            lo, hi = r.range()
            if _known_ge0(lo) and _known_lt(hi, c):
                return c, Expr(q, tuple(big)), r
        return None

    def mod(self, d) -> "Expr":
        assert isinstance(d, sym.Sym) or d > 0
        if isinstance(d, int) and d == 1:
            return Expr(0)
        r_terms = tuple((a, _rem(c, d)) for a, c in self.terms if not _divides(d, c))
        rest = Expr(_divmod(self.const, d)[1], r_terms)
        lo, hi = rest.range()
        if _known_ge0(lo) and _known_lt(hi, d):
            return rest
        split = rest._split(d)
        if split is not None:  # (c*X + r) % d == c*(X % (d/c)) + r
            c, x, r = split
            return x.mod(sym.exact_div(d, c)) * c + r
        return Expr(0, ((_Op("mod", rest, d), 1),))

    def is_affine(self) -> bool:
        return all(isinstance(a, Var) for a, _ in self.terms)

    def coeff(self, v: Var) -> int:
        return sum(c for a, c in self.terms if isinstance(a, Var) and a.name == v.name)

    def vars(self) -> set:
        out = set()
        for a, _ in self.terms:
            if isinstance(a, Var):
                out.add(a.name)
            elif a.expr is not None:
                out |= a.expr.vars()
        return out

    def substitute(self, mapping: dict) -> "Expr":
        """Replace variables (by name) with Exprs, re-simplifying divisions and moduli."""
        out = Expr(self.const)
        for a, c in self.terms:
            if isinstance(a, Var):
                out = out + (Expr.of(mapping[a.name]) if a.name in mapping else Expr.of(a)) * c
            elif a.kind == "div":
                out = out + a.expr.substitute(mapping).floordiv(a.c) * c
            elif a.kind == "mod":
                out = out + a.expr.substitute(mapping).mod(a.c) * c
            else:
                out = out + Expr.of(a) * c
        return out


def map_data(e: Expr, fn) -> Expr:
    """Rebuild `e` with every loaded index value v replaced by fn(v) (rewriting a kernel's exprs)."""
    out = Expr(e.const)
    for a, c in e.terms:
        if isinstance(a, Var):
            out = out + Expr.of(a) * c
        elif a.kind == "data":
            out = out + data(fn(a.c)) * c
        else:
            inner = map_data(a.expr, fn)
            out = out + (inner.floordiv(a.c) if a.kind == "div" else inner.mod(a.c)) * c
    return out


def data_values(e: Expr) -> list:
    """The loaded index values (kernel expressions) inside `e`."""
    out = []
    for a, _ in e.terms:
        if isinstance(a, _Op):
            if a.kind == "data":
                out.append(a.c)
            else:
                out += data_values(a.expr)
    return out


def data(value) -> Expr:
    """An index read from memory (gather, index_select): `value` is a kernel expression of int type."""
    return Expr(0, ((_Op("data", None, value), 1),))


def _atom_range(a):
    if isinstance(a, Var):
        return 0, sym.add(a.size, -1)
    if a.kind == "div":
        lo, hi = a.expr.range()
        return (None if lo is None else sym.floordiv(lo, a.c)), (None if hi is None else sym.floordiv(hi, a.c))
    if a.kind == "mod":
        return 0, sym.add(a.c, -1)
    return None, None  # a loaded value: unbounded


def _times(c, x):
    return None if x is None else sym.mul(c, x)


def _fmt(c) -> str:
    """A coefficient, constant or divisor as printed: a size expression in braces (`{768*s0}*i0`)."""
    return f"{{{c}}}" if isinstance(c, sym.Sym) else str(c)


def _ck(c):
    """A coefficient's part of an Expr key (a Sym by its own key)."""
    return c.key if isinstance(c, sym.Sym) else c


def _divmod(c, d):
    """(q, r) with c == q*d + r, splitting off whole multiples of d where it is certain."""
    if isinstance(c, int) and isinstance(d, int):
        return divmod(c, d)
    q = sym.exact_div(c, d)
    return (q, 0) if q is not None else (0, c)


def _rem(c, d):
    """A coefficient reduced modulo d when both are ints (sizes stay as they are)."""
    return c % d if isinstance(c, int) and isinstance(d, int) else c


def strides_of(shape) -> tuple[int, ...]:
    """Contiguous (row-major) strides."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc = sym.mul(acc, s)
    return tuple(reversed(out))


# linear() and unravel() results by their arguments' keys (with the variables' sizes in them) and
# the SymEnv in force (whose ranges decide the simplifications over symbolic sizes). Scheduling a
# model builds the same indices again and again: each kernel it tries, each schedule it makes
# (fusion makes two or three, a training cut one per round), each identical layer. The entries keep
# their arguments alive, so a loaded index value's identity in a key is never reused; the memo is
# emptied when full. Exprs never change once built, so sharing them is safe.
_memo: dict = {}
MEMO_ENTRIES = 1 << 14


def _memoized(key, make):
    env = sym.current()
    key = (key, id(env))
    hit = _memo.get(key)
    if hit is None:
        if len(_memo) >= MEMO_ENTRIES:
            _memo.clear()
        hit = _memo[key] = (*make(), env)  # (arguments, result, env): all kept alive, their ids not reused
    return hit[1]


def _shape_key(shape) -> tuple:
    return tuple(_ck(s) for s in shape)


def linear(idx, shape) -> Expr:
    """Flat row-major offset of a multi-index into a contiguous tensor of `shape` (memoized)."""
    exprs = [Expr.of(e) for e in idx]
    return _memoized(("linear", tuple(e.key() for e in exprs), _shape_key(shape)),
                     lambda: (exprs, _linear(exprs, shape)))


def _linear(exprs: list, shape) -> Expr:
    """Built as one Expr: adding the dimensions one at a time built one per dimension, a fifth of a
    training cut's scheduling. With a modulo among the terms it adds them one at a time as before:
    Expr's rule that undoes a split (c*(X // c) + X % c) may then apply at any step."""
    strides = strides_of(shape)
    if any(type(a) is _Op and a.kind == "mod" for e in exprs for a, _ in e.terms):
        total = Expr(0)
        for e, st in zip(exprs, strides):
            total = total + e * st
        return total
    const, terms = 0, []
    for e, st in zip(exprs, strides):
        const = const + sym.mul(e.const, st)
        terms.extend((a, sym.mul(c, st)) for a, c in e.terms)
    return Expr(const, terms)


def unravel(flat: Expr, shape) -> list[Expr]:
    """The multi-index of a flat row-major offset (a reshape's source index; memoized)."""
    return list(_memoized(("unravel", flat.key(), _shape_key(shape)), lambda: (flat, tuple(
        Expr(0) if isinstance(s, int) and s <= 1 else flat.floordiv(st).mod(s)
        for st, s in zip(strides_of(shape), shape)))))
