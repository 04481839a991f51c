"""Symbolic sizes: integer polynomials over size symbols (s0, s1, ...) standing in for ints in shapes,
index math and loop bounds, so one program serves every size of a dimension.

A Sym is  const + sum(coeff * monomial)  where a monomial is a product of atoms: a size symbol, or an
opaque floor division or modulo (`(s0+1)//2`, what a size that does not divide evenly becomes).
Arithmetic is exact and normalizes on construction; a result without symbols is a plain int, so code
that only ever sees static shapes never meets a Sym.

Equality (`==`) is structural; the other comparisons decide. Each symbol has a range (Dynamo specializes sizes 0 and 1, so a size symbol is at least 2)
and, while a graph compiles, a hint: its size in the call being compiled. A comparison the ranges
settle is answered outright (`s0 == 1` is False, `768*s0 > 0` is True). One they leave open is answered
on the hints and recorded as a guard with the SymEnv in force: the program is then valid only where it
holds, and capture.py hands every guard to Dynamo's ShapeEnv, which checks it before each call (a
failed guard means one more program, so code that decides only for speed -- a cost model, an unroll
hint -- reads `hint(x)` instead, which records nothing). With no SymEnv, or no hint, an open comparison
raises SymbolicError naming it. A Sym used where Python needs a real int (range(), torch.Size) raises
TypeError naming it, and so does arithmetic with a float: such code takes the symbolic path
explicitly (a cost estimate reads `hint`; a float computed from sizes is a SizeFloat).

The polynomial, its arithmetic and the decisions are one unit (each operator calls the others) and
stay in this file; reading sizes back (text, Dynamo's sympy) is sym_read.py, values made of sizes
(SizeFloat, binding from shapes, attributes at a call's sizes) sym_values.py.
"""
from __future__ import annotations

import contextvars
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

Int = Union[int, "Sym"]
NAME = re.compile(r"[su]\d+")  # Dynamo's names: s0 for a size it saw, u0 for a data-dependent one
DEFAULT_HINT = 64  # a symbol's size for cost decisions when nothing says better (IR text without hints)


class SymbolicError(ValueError):
    """A decision about symbolic sizes that the ranges leave open and no hint can settle."""


# -- atoms -------------------------------------------------------------------------------------------
class Opaque:
    """`arg // d` or `arg % d` that does not simplify; a factor in monomials like a symbol."""
    __slots__ = ("kind", "arg", "d", "key")

    def __init__(self, kind: str, arg: Int, d: Int):
        self.kind, self.arg, self.d = kind, arg, d
        self.key = f"({_paren(arg)}{'//' if kind == 'div' else '%'}{_paren(d)})"

    def __repr__(self):
        return self.key


def _paren(x) -> str:
    s = str(x)
    return s if isinstance(x, int) or re.fullmatch(r"[A-Za-z0-9_]+|\(.*\)", s) and _balanced(s) else f"({s})"


def _balanced(s: str) -> bool:
    """`(a)+(b)` starts and ends with parentheses but is not one parenthesized group."""
    if not s.startswith("("):
        return True
    depth = 0
    for i, ch in enumerate(s):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(s) - 1:
            return False
    return True


def _akey(a) -> str:
    return a if isinstance(a, str) else a.key


# -- the polynomial ----------------------------------------------------------------------------------
class Sym:
    """Build with `symbol(name)` and arithmetic; never construct directly (results normalize to int)."""
    __slots__ = ("const", "terms", "key", "_hash")

    def __init__(self, const: int, terms: tuple):
        self.const, self.terms = const, terms  # terms: ((monomial: tuple of atoms, coeff), ...) sorted
        self.key = (const, tuple((tuple(_akey(a) for a in m), c) for m, c in terms))
        self._hash = hash(self.key)

    # -- printing --------------------------------------------------------------------------------------
    def __repr__(self):
        parts = []
        for m, c in self.terms:
            mono = "*".join(_akey(a) for a in m)
            parts.append(mono if c == 1 else f"-{mono}" if c == -1 else f"{c}*{mono}")
        if self.const:
            parts.append(str(self.const))
        out = parts[0]
        for p in parts[1:]:
            out += p if p.startswith("-") else "+" + p
        return out

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        """As its expression: reports format sizes and byte counts with `:,` or a width."""
        return format(repr(self), spec.replace(",", "").replace("_", ""))

    def __hash__(self):
        return self._hash

    # -- arithmetic ------------------------------------------------------------------------------------
    def __add__(self, o):
        return add(self, o)

    __radd__ = __add__

    def __sub__(self, o):
        return add(self, mul(o, -1))

    def __rsub__(self, o):
        return add(o, mul(self, -1))

    def __neg__(self):
        return mul(self, -1)

    def __pos__(self):
        return self

    def __mul__(self, o):
        return mul(self, o)

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return floordiv(self, o)

    def __rfloordiv__(self, o):
        return floordiv(o, self)

    def __mod__(self, o):
        return mod(self, o)

    def __rmod__(self, o):
        return mod(o, self)

    def __pow__(self, k: int):
        if not isinstance(k, int) or k < 0:
            raise TypeError(f"symbolic size {self} raised to {k!r}: only non-negative integer powers")
        out = 1
        for _ in range(k):
            out = mul(out, self)
        return out

    # -- comparisons: settled by the ranges, or decided on the hints and guarded ---------------------------
    def __eq__(self, o):
        """Structural: the same expression. Two sizes that differ in form may still be equal at some
        call (s0 == 128 when s0 is 128); code that asks `==` takes the general path then, which is
        also right for the equal case (Dynamo has already merged the sizes it proved equal). Use
        decide(a, "==", b) for an equality the program must be specialized on."""
        if isinstance(o, Sym):
            return o.key == self.key
        return False

    def __ne__(self, o):
        r = self.__eq__(o)
        return r if r is NotImplemented else not r

    def __lt__(self, o):
        return decide(self, "<", o)

    def __le__(self, o):
        return decide(self, "<=", o)

    def __gt__(self, o):
        return decide(self, ">", o)

    def __ge__(self, o):
        return decide(self, ">=", o)

    def __bool__(self):
        return decide(self, "!=", 0)

    def __index__(self):
        raise TypeError(f"symbolic size {self} used where a concrete integer is needed")

    __int__ = __index__

    def __float__(self):
        raise TypeError(f"symbolic size {self} used where a concrete number is needed (a cost estimate "
                        "reads sym.hint)")

    def __abs__(self):
        return self if known(self, ">=", 0) else -self if known(self, "<=", 0) else _opaque_abs(self)


def _opaque_abs(x):
    raise SymbolicError(f"abs({x}): its sign depends on the sizes")


def is_sym(x) -> bool:
    return isinstance(x, Sym)


def symbol(name: str) -> Sym:
    return Sym(0, (((name,), 1),))


def _terms_of(x):
    if isinstance(x, Sym):
        return x.const, x.terms
    return x, ()


def _make(const: int, pairs) -> Int:
    merged: dict = {}
    monos: dict = {}
    for m, c in pairs:
        k = tuple(_akey(a) for a in m)
        merged[k] = merged.get(k, 0) + c
        monos[k] = m
    const += merged.pop((), 0)  # an empty monomial is a constant
    terms = tuple((monos[k], merged[k]) for k in sorted(merged) if merged[k] != 0)
    return Sym(const, terms) if terms else const


def add(a: Int, b: Int) -> Int:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, float) or isinstance(b, float):
        raise TypeError(f"{a} + {b}: a symbolic size mixed with a float (a cost estimate reads sym.hint)")
    ca, ta = _terms_of(a)
    cb, tb = _terms_of(b)
    return _make(ca + cb, ta + tb)


def mul(a: Int, b: Int) -> Int:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, float) or isinstance(b, float):
        raise TypeError(f"{a} * {b}: a symbolic size mixed with a float (a cost estimate reads sym.hint)")
    if isinstance(b, int):
        a, b = b, a
    if isinstance(a, int):  # a constant times b
        if a == 0:
            return 0
        return _make(b.const * a, tuple((m, c * a) for m, c in b.terms))
    ca, ta = _terms_of(a)
    cb, tb = _terms_of(b)
    pairs = [(m, c * cb) for m, c in ta] + [(m, c * ca) for m, c in tb]
    pairs += [(tuple(sorted(m1 + m2, key=_akey)), c1 * c2) for m1, c1 in ta for m2, c2 in tb]
    return _make(ca * cb, pairs)


def _mono_div(m: tuple, by: tuple):
    """m / by for monomials (tuples of atoms), or None when `by` does not divide m."""
    rest = list(m)
    keys = [_akey(a) for a in rest]
    for a in by:
        k = _akey(a)
        if k not in keys:
            return None
        i = keys.index(k)
        del rest[i], keys[i]
    return tuple(rest)


def exact_div(a: Int, b: Int):
    """a / b when b divides a for every size (structurally), else None."""
    if isinstance(b, int):
        if b == 0:
            return None
        ca, ta = _terms_of(a)
        if ca % b or any(c % b for _, c in ta):
            return None
        return _make(ca // b, tuple((m, c // b) for m, c in ta))
    if b.const == 0 and len(b.terms) == 1:  # a monomial divisor
        (bm, bc), = b.terms
        ca, ta = _terms_of(a)
        if ca:
            return None
        out = []
        for m, c in ta:
            q = _mono_div(m, bm)
            if q is None or c % bc:
                return None
            out.append((q, c // bc))
        return _make(0, out)
    if isinstance(a, Sym):  # a == k*b for an integer k
        m0, c0 = b.terms[0]
        k0 = tuple(map(_akey, m0))
        for m, c in a.terms:
            if tuple(map(_akey, m)) == k0:
                r = add(a, mul(b, -(c // c0))) if c % c0 == 0 else None
                if isinstance(r, int) and r == 0:
                    return c // c0
                break
    return None


def _nonzero(d: Int) -> None:
    if isinstance(d, int) and d == 0:
        raise SymbolicError("a size expression divides by zero")


def floordiv(a: Int, d: Int) -> Int:
    _nonzero(d)
    if isinstance(a, int) and isinstance(d, int):
        return a // d
    if isinstance(d, int) and d == 1:
        return a
    q = exact_div(a, d)
    if q is not None:
        return q
    if isinstance(d, int) and d > 0:  # pull out the terms d divides: (d*Q + R)//d == Q + R//d
        ca, ta = _terms_of(a)
        qs = [(m, c // d) for m, c in ta if c % d == 0]
        rs = tuple((m, c) for m, c in ta if c % d)
        qc, rc = divmod(ca, d)
        rest = _make(rc, rs)
        if isinstance(rest, int):
            return _make(qc, qs)
        if known(rest, ">=", 0) and known(rest, "<", d):
            return _make(qc, qs)
        return add(_make(qc, qs), Sym(0, (((Opaque("div", rest, d),), 1),)))
    return Sym(0, (((Opaque("div", a, d),), 1),))


def mod(a: Int, d: Int) -> Int:
    _nonzero(d)
    if isinstance(a, int) and isinstance(d, int):
        return a % d
    if isinstance(d, int) and d == 1:
        return 0
    if exact_div(a, d) is not None:
        return 0
    if isinstance(d, int) and d > 0:
        ca, ta = _terms_of(a)
        rest = _make(ca % d, tuple((m, c % d) for m, c in ta if c % d))
        if isinstance(rest, int):
            return rest
        if known(rest, ">=", 0) and known(rest, "<", d):
            return rest
        return Sym(0, (((Opaque("mod", rest, d),), 1),))
    return Sym(0, (((Opaque("mod", a, d),), 1),))


def smin(a: Int, b: Int) -> Int:
    return a if a <= b else b


def smax(a: Int, b: Int) -> Int:
    return a if a >= b else b


# -- the environment: ranges, hints, guards ----------------------------------------------------------
@dataclass
class Guard:
    lhs: Int
    op: str
    rhs: Int
    holds: bool     # what the hints said; the program is valid where `lhs op rhs` is `holds`

    def __str__(self):
        return f"{self.lhs} {self.op} {self.rhs}" if self.holds else f"not ({self.lhs} {self.op} {self.rhs})"

    def check(self, values: dict) -> bool:
        return OPS[self.op](evaluate(self.lhs, values), evaluate(self.rhs, values)) == self.holds


@dataclass
class SymEnv:
    """What a compile knows of its symbols: ranges (hi None: unbounded), hints, and the guards it made."""
    ranges: dict = field(default_factory=dict)
    hints: dict = field(default_factory=dict)
    guards: list = field(default_factory=list)
    on_guard: Optional[Callable] = None  # called with each new Guard (capture: Dynamo's ShapeEnv)

    def range(self, name: str) -> tuple:
        if name in self.ranges:
            return self.ranges[name]
        return (0, None) if name.startswith("u") else (2, None)  # unbacked symbols may be 0 or 1

    def guard(self, lhs: Int, op: str, rhs: Int) -> bool:
        for g in self.guards:
            if g.op == op and repr(g.lhs) == repr(lhs) and repr(g.rhs) == repr(rhs):
                return g.holds
        try:
            holds = OPS[op](evaluate(lhs, self.hints), evaluate(rhs, self.hints))
        except KeyError as e:
            raise SymbolicError(f"cannot decide {lhs} {op} {rhs}: no size hint for {e.args[0]}") from None
        g = Guard(lhs, op, rhs, holds)
        self.guards.append(g)
        if self.on_guard is not None:
            self.on_guard(g)
        return holds


_ENV: contextvars.ContextVar = contextvars.ContextVar("minicomp_symenv", default=None)
_DEFAULT = SymEnv()


def current() -> SymEnv:
    env = _ENV.get()
    return env if env is not None else _DEFAULT


def current_default() -> SymEnv:
    """The SymEnv in force when no compile set one (ranges from the names, no hints)."""
    return _DEFAULT


def env_for(sizes: dict, on_guard=None) -> SymEnv:
    """A SymEnv from a Graph's `sizes` ({name: (lo, hi, hint)})."""
    return SymEnv({s: (lo, hi) for s, (lo, hi, _) in sizes.items()}, {s: h for s, (_, _, h) in sizes.items()},
                  on_guard=on_guard)


def scope(sizes: dict):
    """`with scope(graph.sizes):` -- the graph's own SymEnv when no compile has set one (a graph read
    from IR text compiled directly), else the one in force."""
    env = current()
    return using(env_for(sizes) if sizes and env is _DEFAULT else env)


class using:
    """`with using(env):` -- the SymEnv decisions consult while a graph compiles (per thread and task)."""

    def __init__(self, env: SymEnv):
        self.env = env

    def __enter__(self):
        self.token = _ENV.set(self.env)
        return self.env

    def __exit__(self, *exc):
        _ENV.reset(self.token)


OPS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def bounds(x: Int, env: Optional[SymEnv] = None) -> tuple:
    """(lo, hi) for every size in the symbols' ranges; lo None: unbounded below, hi None: above.
    Each atom a in [alo, ahi] becomes alo + t with 0 <= t <= ahi - alo; the polynomial expanded in the
    t's (terms merged, so s0*s1 - s0 = 2 + t0 + 2*t1 + t0*t1 is seen to be >= 2) is bounded term by term."""
    if isinstance(x, int):
        return x, x
    env = env or current()
    spans, expanded = {}, {(): x.const}
    for m, c in x.terms:
        parts = {(): c}  # t-monomial (sorted atom keys) -> coefficient, for this term
        for a in m:
            alo, ahi = _atom_bounds(a, env)
            if alo is None:
                return None, None
            k = _akey(a)
            spans[k] = None if ahi is None else ahi - alo
            nxt: dict = {}
            for tm, tc in parts.items():
                nxt[tm] = nxt.get(tm, 0) + tc * alo
                t2 = tuple(sorted(tm + (k,)))
                nxt[t2] = nxt.get(t2, 0) + tc
            parts = nxt
        for tm, tc in parts.items():
            expanded[tm] = expanded.get(tm, 0) + tc
    lo = hi = expanded.pop((), 0)
    for tm, tc in expanded.items():
        top = 1
        for k in tm:
            top = None if top is None or spans[k] is None else top * spans[k]
        if tc > 0:
            hi = None if hi is None or top is None else hi + tc * top
        elif tc < 0:
            lo = None if lo is None or top is None else lo + tc * top
    return lo, hi


def _atom_bounds(a, env: SymEnv) -> tuple:
    if isinstance(a, str):
        return env.range(a)
    alo, ahi = bounds(a.arg, env)
    dlo, dhi = bounds(a.d, env)
    if alo is None or alo < 0 or dlo is None or dlo <= 0:
        return None, None
    if a.kind == "mod":
        hi = None if dhi is None else dhi - 1
        if ahi is not None:
            hi = ahi if hi is None else min(hi, ahi)
        return 0, hi
    return (0 if dhi is None else alo // dhi), (None if ahi is None else ahi // dlo)


def known(a: Int, op: str, b: Int) -> Optional[bool]:
    """True when `a op b` holds for every size in the ranges (never a guard); False otherwise."""
    return _settle(a, op, b) is True


def _floor_relaxed(x: Sym) -> tuple:
    """(lo, hi) of D*x, D > 0, with each term c*M*(a//d) (d an int > 0, M the term's other factors,
    M >= 0) read as c*M*(a - r)/d, 0 <= r < d: n - n//2 is then n/2 plus a bounded part, >= 0, which
    term-by-term bounds cannot see (they bound n and n//2 apart). (None, None) without such a term."""
    def split(m):
        divs = [a for a in m if isinstance(a, Opaque) and a.kind == "div" and isinstance(a.d, int) and a.d > 0]
        if len(divs) != 1:
            return None
        others = tuple(a for a in m if a is not divs[0])
        rest = _make(0, ((others, 1),)) if others else 1
        lo = bounds(rest)[0]
        return (divs[0], rest) if lo is not None and lo >= 0 else None
    parts = [(split(m), m, c) for m, c in x.terms]
    if not any(p for p, _, _ in parts):
        return None, None
    big = 1
    for p, _, _ in parts:
        if p:
            big = big * p[0].d // math.gcd(big, p[0].d)
    low = high = x.const * big
    for p, m, c in parts:
        if not p:
            term = mul(Sym(0, ((m, 1),)), c * big)
            low, high = add(low, term), add(high, term)
            continue
        (a, rest), k = p, big // p[0].d * c
        term = mul(mul(a.arg, rest), k)  # (big/d) * c * M * a; the remainder's share below
        slack = mul(rest, -k * (a.d - 1))
        low, high = add(low, term), add(high, term)
        if k > 0:
            low = add(low, slack)
        else:
            high = add(high, slack)
    return bounds(low)[0], bounds(high)[1]


def _settle(a: Int, op: str, b: Int) -> Optional[bool]:
    diff = add(a, mul(b, -1))
    if isinstance(diff, int):
        return OPS[op](diff, 0)
    lo, hi = bounds(diff)
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):  # the signs are open: try the floor relaxation
        rlo, rhi = _floor_relaxed(diff)  # bounds of D*diff, D > 0: only their signs carry over
        if rlo is not None and rlo >= 0:
            lo = max(lo if lo is not None else 0, int(rlo > 0))
        if rhi is not None and rhi <= 0:
            hi = min(hi if hi is not None else 0, -int(rhi < 0))
    pos = lo is not None and lo > 0
    neg = hi is not None and hi < 0
    nonneg = lo is not None and lo >= 0
    nonpos = hi is not None and hi <= 0
    if op in ("==", "!="):
        if pos or neg:
            return op == "!="
        return None
    if op == "<":
        return True if neg else False if nonneg else None
    if op == "<=":
        return True if nonpos else False if pos else None
    if op == ">":
        return True if pos else False if nonpos else None
    return True if nonneg else False if neg else None  # >=


def decide(a: Int, op: str, b: Int) -> bool:
    """`a op b`: settled by the ranges, or decided on the hints and recorded as a guard."""
    settled = _settle(a, op, b)
    if settled is not None:
        return settled
    return current().guard(a, op, b)


# -- values ------------------------------------------------------------------------------------------
def free_symbols(x) -> set:
    if isinstance(x, int):
        return set()
    out = set()
    for m, _ in x.terms:
        for a in m:
            if isinstance(a, str):
                out.add(a)
            else:
                out |= free_symbols(a.arg) | free_symbols(a.d)
    return out


def evaluate(x: Int, values: dict) -> int:
    """x at sizes `values` (symbol name -> int); KeyError names a missing symbol."""
    if isinstance(x, int):
        return x
    total = x.const
    for m, c in x.terms:
        p = c
        for a in m:
            if isinstance(a, str):
                p *= values[a]
            else:
                num, d = evaluate(a.arg, values), evaluate(a.d, values)
                p *= num // d if a.kind == "div" else num % d
        total += p
    return total


def hint(x: Int) -> int:
    """x at the hints (DEFAULT_HINT for a symbol without one): for cost decisions, never a guard."""
    if not isinstance(x, Sym):
        return x
    env = current()
    return evaluate(x, {s: env.hints.get(s, DEFAULT_HINT) for s in free_symbols(x)})
