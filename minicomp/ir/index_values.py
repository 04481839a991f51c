"""An index's values at concrete loop positions, sizes at given values: at one point (`at`), or at
every point of a loop grid at once (`grid`, a torch tensor; `over` builds the grid). The kernel
interpreter evaluates every index with `grid`; the kernel verifier uses `at` and `over` where bounds
over ranges would overstate (an index with divisions or moduli) and to see which elements a
kernel's stores write. Floor division and modulus; in `at` and `over` a divisor that is not
positive at these sizes gives None, and a size without a value raises KeyError.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import sym
from .index import Expr, Var


def at(e: Expr, point: dict, sizes: dict):
    """The index at `point` (loop variable -> int)."""
    total = sym.evaluate(e.const, sizes)
    for a, c in e.terms:
        if isinstance(a, Var):
            v = point[a.name]
        else:
            inner, d = at(a.expr, point, sizes), sym.evaluate(a.c, sizes)
            if inner is None or d <= 0:
                return None
            v = inner // d if a.kind == "div" else inner % d
        total += v * sym.evaluate(c, sizes)
    return total


def atoms(e: Expr):
    """Every atom of an index, those inside its divisions and moduli too."""
    for a, _ in e.terms:
        yield a
        if not isinstance(a, Var) and a.kind in ("div", "mod"):
            yield from atoms(a.expr)


def grid(e: Expr, axes: dict, sizes: dict, ndim: int, device=None, data=None):
    """The index at every point of a loop grid: `axes` maps each loop variable to its arange shaped
    to broadcast over `ndim` dims; `data(kexpr)` gives a loaded index's values (the interpreter's)."""
    total = torch.full([1] * ndim, sym.evaluate(e.const, sizes), dtype=torch.int64, device=device)
    for a, c in e.terms:
        if isinstance(a, Var):
            v = axes[a.name]
        elif a.kind == "data":
            v = data(a.c)
        else:
            inner, d = grid(a.expr, axes, sizes, ndim, device, data), sym.evaluate(a.c, sizes)
            v = torch.div(inner, d, rounding_mode="floor") if a.kind == "div" else inner % d
        total = total + v * sym.evaluate(c, sizes)
    return total


def over(e: Expr, loops: list, sizes: dict):
    """The index (no loaded values in it) at every point of the grid of `loops` ([(name, extent)],
    the first outermost): an int64 tensor of the grid's shape."""
    if any(not isinstance(a, Var) and a.kind in ("div", "mod") and sym.evaluate(a.c, sizes) <= 0 for a in atoms(e)):
        return None
    shape = [n for _, n in loops]
    with unset_fake_temporarily():  # a compile runs inside AOTAutograd's fake mode: these are real ints
        axes = {name: torch.arange(n, dtype=torch.int64).reshape([n if j == i else 1 for j in range(len(loops))])
                for i, (name, n) in enumerate(loops)}
        return grid(e, axes, sizes, len(loops)).expand(shape)
