"""The sizes of a graph Dynamo traced with symbolic shapes: each symbol's range and hint, read from
Dynamo's ShapeEnv through the example inputs' SymInts, and the SymEnv (ir/sym.py) the compile of
that graph decides in. Shared by capture.py (every graph) and training.py (the joint graph's cut).
"""
from __future__ import annotations

import torch

from ..ir import sym


def symbolic(example_inputs) -> bool:
    return any(isinstance(x, torch.SymInt) or isinstance(x, torch.Tensor)
               and not all(isinstance(s, int) for s in x.shape) for x in example_inputs)


def size_env(example_inputs, report_guards: list):
    """The SymEnv a symbolic graph compiles in: each symbol's range and hint from Dynamo's ShapeEnv,
    and every guard minicomp's decisions make handed back to that ShapeEnv (evaluated on the inputs'
    SymInts), so Dynamo checks it before each call like its own. Returns (env, sizes for the Graph)."""
    from torch._guards import detect_fake_mode
    fake = detect_fake_mode(example_inputs)
    shape_env = getattr(fake, "shape_env", None)
    symints: dict = {}
    for x in example_inputs:
        dims = [x] if isinstance(x, torch.SymInt) else list(x.shape) if isinstance(x, torch.Tensor) else []
        for d in dims:
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                symints.setdefault(d.node.expr.name, d)
    sizes = {}
    hints = getattr(shape_env, "backed_var_to_val", None) or getattr(shape_env, "var_to_val", {})
    for name, d in symints.items():
        expr = d.node.expr
        vr = shape_env.var_to_range.get(expr) if shape_env is not None else None
        lo = int(vr.lower) if vr is not None and vr.lower.is_Integer else 0
        hi = int(vr.upper) if vr is not None and vr.upper.is_Integer else None  # int_oo: unbounded
        hint = hints.get(expr, d.node.hint)
        sizes[name] = (lo, hi, int(hint) if hint is not None else sym.DEFAULT_HINT)

    def on_guard(g):
        report_guards.append(str(g))
        if symints:
            lhs, rhs = sym.evaluate(g.lhs, symints), sym.evaluate(g.rhs, symints)
            bool(sym.OPS[g.op](lhs, rhs))  # recorded in the ShapeEnv as a guard Dynamo checks
    return sym.env_for(sizes, on_guard), sizes
