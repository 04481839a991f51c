"""Reductions down columns on the CPU: accumulators for a tile of columns, the reduction loops outside.

A reduction whose kept last variable c is contiguous in memory and whose reduced variables are
strided (a layer_norm weight gradient: sum over rows of x * g, per column) would, as a row kernel,
run one loop down each column, reading one element per row. Here c runs in tiles of COLUMN_TILE
columns with an accumulator each (a stack array: 4 KB of f32, in L1), and the reduction loops run
around the loop over the tile's columns, which reads along rows and vectorizes: a sum of (x*x) down
8192x1024 went from 36 to 2.2 ms. KernelCodegen (llvm.py) calls `emit_columns` for a kernel that
`columns` accepts.
"""
from __future__ import annotations

from ..ir.kernel import Kernel, walk
from .llvm_values import I1, I64, reg_type

COLUMN_TILE = 1024  # columns accumulated at once


def columns(k: Kernel) -> bool:
    """Whether k reduces down columns: one stage of sum, prod, amax or amin, and every load that
    depends on the last kept variable c contiguous along it (affine, stride 1) and not along the
    innermost reduced variable (such a load the row loop vectorizes). Loads without c (a per-row
    scale) are one value for the whole tile."""
    if len(k.stages) != 1 or not k.outer or not k.inner or not isinstance(k.outer[-1].size, int) \
            or k.outer[-1].size < 2:  # (a symbolic column count: the plain row loops)
        return False
    if any(r.op not in ("sum", "prod", "amax", "amin") for r in k.stages[0]):
        return False
    c, r = k.outer[-1], k.inner[-1]
    seen = False
    for e in walk([red.value for red in k.stages[0]] + [st.value for st in k.inner_stores]):
        if e.op != "load":
            continue
        idx = e.attrs["index"]
        if c.name not in idx.vars():
            continue
        if idx.coeff(c) != 1 or idx.coeff(r) == 1 or not idx.is_affine():
            return False
        seen = True
    return seen


def emit_columns(cg, first_range) -> None:
    """KernelCodegen cg's loop nest for a kernel `columns` accepts. `first_range`: the range of the
    first outer variable the runtime hands this call, None for all of it."""
    k, b = cg.k, cg.b
    c = k.outer[-1]
    reds = [(r, cg.entry_alloca(reg_type(r.value.dtype), COLUMN_TILE), cg.entry_alloca(I1, COLUMN_TILE))
            for r in k.stages[0]]

    def tiles(lo, hi):
        tile = f"{c.name}.tile"
        count = b.sdiv(b.add(b.sub(hi, lo), I64(COLUMN_TILE - 1)), I64(COLUMN_TILE))
        cg.loop(I64(0), count, tile, lambda: tile_body(b.add(lo, b.mul(cg.vars[tile], I64(COLUMN_TILE))), hi),
                max(1, c.size // COLUMN_TILE))

    def tile_body(base, hi):
        left = b.sub(hi, base)
        n = b.select(b.icmp_signed("<", left, I64(COLUMN_TILE)), left, I64(COLUMN_TILE))

        def lanes(body):
            lane = f"{c.name}.lane"

            def each():
                cg.vars[c.name] = b.add(base, cg.vars[lane])
                j = cg.vars[lane]
                body([b.gep(a, [j], source_etype=reg_type(r.value.dtype)) for r, a, _ in reds],
                     [b.gep(m, [j], source_etype=I1) for _, _, m in reds])
            cg.loop(I64(0), n, lane, each, COLUMN_TILE)

        def init(accs, nans):
            for (r, _, _), acc, nan in zip(reds, accs, nans):
                b.store(cg.init_value(r), acc)
                b.store(I1(0), nan)

        def accumulate(accs, nans):
            for (r, _, _), acc, nan in zip(reds, accs, nans):
                cg.combine(r, cg.value(r.value), acc, nan, None)

        def results(stores):
            def emit(accs, nans):
                cg.accs = {id(r): cg.result(r, acc, nan) for (r, _, _), acc, nan in zip(reds, accs, nans)}
                for st in stores:
                    cg.store(st)
            return emit
        lanes(init)
        cg.nest(list(k.inner), lambda: lanes(accumulate))
        if k.inner_stores:
            cg.nest(list(k.inner), lambda: lanes(results(k.inner_stores)))
        lanes(results(k.outer_stores))
    if len(k.outer) == 1:  # the runtime splits c itself
        lo, hi = first_range or (I64(0), I64(c.size))
        tiles(lo, hi)
    else:
        cg.nest(list(k.outer[:-1]), lambda: tiles(I64(0), I64(c.size)), first_range=first_range)

