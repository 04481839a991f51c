"""An index's values at concrete loop positions, sizes at given values: at one point (`at`), or at
every point of a loop grid at once (`over`, a torch tensor). The kernel verifier uses them where
bounds over ranges would overstate (an index with divisions or moduli) and to see which elements
a kernel's stores write. Floor division and modulus, as the kernel interpreter computes them; a
divisor that is not positive at these sizes gives None, and a size without a value raises KeyError.
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


def over(e: Expr, loops: list, sizes: dict):
    """The index at every point of the grid of `loops` ([(name, extent)], the first outermost): an
    int64 tensor of the grid's shape."""
    shape = [n for _, n in loops]
    axes = {}
    for i, (name, n) in enumerate(loops):
        view = [1] * len(loops)
        view[i] = n
        axes[name] = torch.arange(n, dtype=torch.int64).reshape(view)

    def value(e: Expr):
        total = torch.full([1] * len(loops), sym.evaluate(e.const, sizes), dtype=torch.int64)
        for a, c in e.terms:
            if isinstance(a, Var):
                v = axes[a.name]
            else:
                inner, d = value(a.expr), sym.evaluate(a.c, sizes)
                if inner is None or d <= 0:
                    return None
                v = torch.div(inner, d, rounding_mode="floor") if a.kind == "div" else inner % d
            total = total + v * sym.evaluate(c, sizes)
        return total
    with unset_fake_temporarily():  # a compile runs inside AOTAutograd's fake mode: these are real ints
        got = value(e)
        return None if got is None else got.expand(shape)
