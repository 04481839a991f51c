"""Symbolic sizes read back: the printed form (`768*s0+1`, `((s0+1)//2)`) and Dynamo's sympy
expressions of its SymInts and SymFloats (`FloorDiv(s0, 2)`, `FloatTrueDiv(1.0, s0)`), as ir/sym.py's
Sym (and sym_values.py's SizeFloat)."""
from __future__ import annotations

import re

from .sym import NAME, Int, Sym, SymbolicError, add, current, decide, evaluate, floordiv, mod, mul, smax, smin, symbol
from .sym_values import SizeFloat

_SYM_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*%()]))")


def parse(text: str) -> Int:
    """`768*s0+1`, `(s0+1)//2`, `s0*s1` -> the Sym (or int) printed so."""
    toks, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _SYM_TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read symbolic size {text!r}")
        toks.append(m.group(1) and int(m.group(1)) if m.group(1) else m.group(2) or m.group(3))
        pos = m.end()
    toks = [t for t in toks if t != ""]
    i = 0

    def peek():
        return toks[i] if i < len(toks) else None

    def atom():
        nonlocal i
        t = peek()
        i += 1
        if t == "(":
            v = expr()
            if peek() != ")":
                raise ValueError(f"unbalanced parentheses in {text!r}")
            i += 1
            return v
        if t == "-":
            return mul(atom(), -1)
        if isinstance(t, int):
            return t
        if isinstance(t, str) and NAME.fullmatch(t):
            return symbol(t)
        raise ValueError(f"cannot read symbolic size {text!r}")

    def term():
        nonlocal i
        v = atom()
        while peek() in ("*", "//", "%"):
            op = peek()
            i += 1
            r = atom()
            v = mul(v, r) if op == "*" else floordiv(v, r) if op == "//" else mod(v, r)
        return v

    def expr():
        nonlocal i
        v = term()
        while peek() in ("+", "-"):
            op = peek()
            i += 1
            r = term()
            v = add(v, r) if op == "+" else add(v, mul(r, -1))
        return v
    out = expr()
    if i != len(toks):
        raise ValueError(f"trailing text in symbolic size {text!r}")
    return out


def from_sympy(e) -> Int:
    """A Sym from a sympy expression of Dynamo's ShapeEnv (`s0`, `768*s0`, `FloorDiv(s0, 2)`)."""
    import sympy
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return symbol(e.name)
    args = [from_sympy(a) for a in e.args]
    name = type(e).__name__
    if isinstance(e, sympy.Add):
        out = 0
        for a in args:
            out = add(out, a)
        return out
    if isinstance(e, sympy.Mul):
        out = 1
        for a in args:
            out = mul(out, a)
        return out
    if isinstance(e, sympy.Pow) and isinstance(args[1], int) and args[1] >= 0:
        return args[0] ** args[1] if isinstance(args[0], Sym) else args[0] ** args[1]
    if name in ("FloorDiv", "CleanDiv") and len(args) == 2:
        return floordiv(*args)
    if name in ("Mod", "PythonMod") and len(args) == 2:
        return mod(*args)
    if name in ("Min", "Max"):
        return _min_max(args, name == "Min")
    raise SymbolicError(f"symbolic size {e} ({name}) has no counterpart in minicomp's sizes")


def _min_max(args: list, least: bool) -> Int:
    """Min/Max of sizes (a slice `causal[:T]` of a 128-row buffer is Min(128, T) when Dynamo does not
    specialize): the argument the hints pick, with guards `picked <= each other` (>= for Max), the
    same guard Dynamo makes when it decides the slice itself; ties keep the pick."""
    values = current().hints
    try:
        at = [evaluate(a, values) for a in args]
    except KeyError:
        at = None
    if at is None:
        out = args[0]
        for a in args[1:]:
            out = smin(out, a) if least else smax(out, a)
        return out
    picked = args[at.index(min(at) if least else max(at))]
    for a in args:
        if a is not picked:
            decide(picked, "<=" if least else ">=", a)  # a guard when either side is symbolic
    return picked


def float_from_sympy(e):
    """A SizeFloat (or number, or Sym) from a sympy expression of Dynamo's for a SymFloat
    (`FloatTrueDiv(1.0, IntTrueDiv(512*s0, 8))`)."""
    import sympy
    if e.is_Float:
        return float(e)
    name = type(e).__name__
    if e.is_Integer or e.is_Symbol or name in ("FloorDiv", "CleanDiv", "Mod", "PythonMod"):
        return from_sympy(e)
    args = [float_from_sympy(a) for a in e.args]
    if name in ("FloatTrueDiv", "IntTrueDiv") and len(args) == 2:
        return SizeFloat("/", *args)
    if name == "ToFloat" and len(args) == 1:
        return SizeFloat("*", args[0], 1.0)
    if isinstance(e, (sympy.Add, sympy.Mul)):
        op = "+" if isinstance(e, sympy.Add) else "*"
        out = args[0]
        for a in args[1:]:
            out = (add(out, a) if op == "+" else mul(out, a)) if isinstance(out, (int, Sym)) and isinstance(
                a, (int, Sym)) else SizeFloat(op, out, a)
        return out
    raise SymbolicError(f"symbolic float {e} ({name}) has no counterpart in minicomp's sizes")
