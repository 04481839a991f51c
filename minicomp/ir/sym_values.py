"""Values made of symbolic sizes (ir/sym.py): floats computed from sizes (SizeFloat), sizes bound from
a call's shapes (bind), attributes at a call's sizes (concrete) or at the hints (hinted)."""
from __future__ import annotations

import math
from typing import Optional

from .sym import OPS, Sym, evaluate, hint

class SizeFloat:
    """A float computed from sizes (batch norm's n / (n - 1), a mean's 1 / numel): `op` one of
    + - * / applied to two operands (numbers, Syms or SizeFloats). Kernels never hold one; an op
    given it runs in torch with its value at each call's sizes."""
    __slots__ = ("op", "a", "b")
    OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y, "/": lambda x, y: x / y}

    def __init__(self, op: str, a, b):
        self.op, self.a, self.b = op, a, b

    def __repr__(self):
        return f"({self.a} {self.op} {self.b})"

    def value(self, values: dict) -> float:
        def v(x):
            return x.value(values) if isinstance(x, SizeFloat) else float(evaluate(x, values)) if isinstance(x, Sym) else x
        a, b = v(self.a), v(self.b)
        if self.op == "/" and b == 0:  # n / (n - 1) at n = 1 (a variance of one element): IEEE, as torch
            return math.nan if a == 0 or a != a else math.copysign(math.inf, a) * math.copysign(1.0, b)
        return float(SizeFloat.OPS[self.op](a, b))


class SizeBool:
    """A comparison of sizes (`T > 1`) an inference graph returns: its value at each call's sizes."""
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a, b):
        self.op, self.a, self.b = op, a, b

    def __repr__(self):
        return f"({self.a} {self.op} {self.b})"

    def value(self, values: dict) -> bool:
        a, b = (evaluate(x, values) if isinstance(x, Sym) else x for x in (self.a, self.b))
        return bool(OPS[self.op](a, b))


def as_symbol(x) -> Optional[str]:
    """The name when x is a bare symbol (`s0`, not `2*s0`), else None."""
    if isinstance(x, Sym) and x.const == 0 and len(x.terms) == 1:
        (m, c), = x.terms
        if c == 1 and len(m) == 1 and isinstance(m[0], str):
            return m[0]
    return None


def bind_inputs(shapes, tensors, values: dict) -> dict:
    """bind() for a graph's inputs: each declared shape against its tensor's. An input passed as None
    (AOTAutograd's effect token for with_effects) has no shape and no symbol to give."""
    for dims, t in zip(shapes, tensors):
        if t is not None:
            bind(dims, tuple(t.shape), values)
    return values


def bind(dims, sizes, values: Optional[dict] = None) -> dict:
    """Symbol values from actual sizes: `dims` the declared dimensions (ints or Syms), `sizes` the
    actual ints, position by position. A bare symbol takes its size; a composite one (2*s0) and an int
    are checked against theirs. ValueError names a dimension that does not fit."""
    values = {} if values is None else values
    later = []
    for d, s in zip(dims, sizes):
        name = as_symbol(d)
        if name is not None:
            if values.setdefault(name, s) != s:
                raise ValueError(f"size {name} is {values[name]} in one place and {s} in another")
        elif isinstance(d, Sym):
            later.append((d, s))
        elif d != s:
            raise ValueError(f"a dimension of size {d} got size {s}")
    for d, s in later:
        try:
            got = evaluate(d, values)
        except KeyError as e:
            raise ValueError(f"size {e.args[0]} appears only inside {d}: cannot tell it from the inputs") from None
        if got != s:
            raise ValueError(f"a dimension of size {d} = {got} got size {s}")
    return values


def concrete(x, values: dict):
    """x (an attribute value: an int, Sym, SizeFloat, tuple, list or dict of them) at sizes `values`."""
    if isinstance(x, Sym):
        return evaluate(x, values)
    if isinstance(x, (SizeFloat, SizeBool)):
        return x.value(values)
    if isinstance(x, tuple):
        return tuple(concrete(v, values) for v in x)
    if isinstance(x, list):
        return [concrete(v, values) for v in x]
    if isinstance(x, dict):
        return {k: concrete(v, values) for k, v in x.items()}
    return x


def hinted(x):
    """x (an attribute value, a shape) at the hints: for decisions that only affect speed."""
    if isinstance(x, Sym):
        return hint(x)
    if isinstance(x, SizeFloat):
        return SizeFloat.OPS[x.op](hinted(x.a), hinted(x.b))
    if isinstance(x, tuple):
        return tuple(hinted(v) for v in x)
    if isinstance(x, list):
        return [hinted(v) for v in x]
    if isinstance(x, dict):
        return {k: hinted(v) for k, v in x.items()}
    return x


def has_sym(x) -> bool:
    if isinstance(x, (Sym, SizeFloat)):
        return True
    if isinstance(x, (tuple, list)):
        return any(has_sym(v) for v in x)
    if isinstance(x, dict):
        return any(has_sym(v) for v in x.values())
    return False
