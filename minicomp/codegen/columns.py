"""Reductions down columns on the CPU: accumulators for a tile of columns, the reduction loops outside.

A reduction whose kept last variable c is contiguous in memory and whose reduced variables are
strided (a layer_norm weight gradient: sum over rows of x * g, per column) would, as a row kernel,
run one loop down each column, reading one element per row. Here c runs in tiles of COLUMN_TILE
columns with an accumulator each (a stack array: 4 KB of f32, in L1), and the reduction loops run
around the loop over the tile's columns, which reads along rows and vectorizes: a sum of (x*x) down
8192x1024 went from 36 to 2.2 ms. KernelCodegen (llvm.py) calls `emit_columns` for a kernel that
`columns` accepts.

A column's sum has one accumulator (no vector lanes split it, as they split a row's), so an f32 sum
adds in f64, as ATen's CPU batch norm does: summing 8192 rows in f32 lost 1000x the digits eager's
batch-norm statistics lose (a convnet's weight gradients 3.5e-5 from float64's, eager's 2.6e-8).
"""
from __future__ import annotations

from ..ir.kernel import Kernel, walk
from .llvm_ops import LOWER
from .llvm_values import F32, F64, I1, I64, reg_type

COLUMN_TILE = 1024  # columns accumulated at once


def columns(k: Kernel) -> bool:
    """Whether k reduces down columns: stages of sum, prod, amax or amin (a mean, then a variance
    around it: a batch norm over channels-last data), and every load that depends on the last kept
    variable c contiguous along it (affine, stride 1) and not along the innermost reduced variable
    (such a load the row loop vectorizes). Loads without c (a per-row scale) are one value for the
    whole tile."""
    if not k.stages or not k.outer or not k.inner or not isinstance(k.outer[-1].size, int) \
            or k.outer[-1].size < 2:  # (a symbolic column count: the plain row loops)
        return False
    if any(r.op not in ("sum", "prod", "amax", "amin") for reds in k.stages for r in reds):
        return False
    c, r = k.outer[-1], k.inner[-1]
    seen = False
    # (an inner store's own loads may go along the rows: it runs a column at a time, as the rows do)
    for e in walk([red.value for reds in k.stages for red in reds]):
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
    first outer variable the runtime hands this call, None for all of it. Each stage runs its
    reduction loops around the tile's lanes; a later stage (and the stores) reads the earlier
    stages' results of its own column from their accumulator arrays."""
    k, b = cg.k, cg.b
    c = k.outer[-1]
    stages = [[(r, cg.entry_alloca(_acc_type(r), COLUMN_TILE), cg.entry_alloca(I1, COLUMN_TILE))
               for r in reds] for reds in k.stages]

    def tiles(lo, hi):
        tile = f"{c.name}.tile"
        count = b.sdiv(b.add(b.sub(hi, lo), I64(COLUMN_TILE - 1)), I64(COLUMN_TILE))
        cg.loop(I64(0), count, tile, lambda: tile_body(b.add(lo, b.mul(cg.vars[tile], I64(COLUMN_TILE))), hi),
                max(1, c.size // COLUMN_TILE))

    def tile_body(base, hi):
        left = b.sub(hi, base)
        n = b.select(b.icmp_signed("<", left, I64(COLUMN_TILE)), left, I64(COLUMN_TILE))

        def lanes(done, body):
            """body(slots) for each column of the tile, the results of the first `done` stages known."""
            lane = f"{c.name}.lane"

            def each():
                cg.vars[c.name] = b.add(base, cg.vars[lane])
                j = cg.vars[lane]

                def at(r, a, m):
                    return b.gep(a, [j], source_etype=_acc_type(r)), b.gep(m, [j], source_etype=I1)
                for reds in stages[:done]:
                    for r, a, m in reds:
                        v = cg.result(r, *at(r, a, m))
                        cg.accs[id(r)] = b.fptrunc(v, F32) if _wide(r) else v
                body([(r, *at(r, a, m)) for r, a, m in (stages[done] if done < len(stages) else ())])
            cg.loop(I64(0), n, lane, each, COLUMN_TILE)

        def init(slots):
            for r, acc, nan in slots:
                v = cg.init_value(r)
                b.store(b.fpext(v, F64) if _wide(r) else v, acc)
                b.store(I1(0), nan)

        def accumulate(s):
            def run(slots):
                for r, acc, nan in slots:
                    x = cg.value(r.value)
                    if _wide(r):
                        b.store(LOWER["sum"](cg.ops, [b.load(acc), b.fpext(x, F64)], "f64", {}), acc)
                    else:
                        cg.combine(r, x, acc, nan, None)
                for st in cg.early.get(s, ()):  # stores the stage's loop can make (row_passes.store_passes)
                    cg.store(st)
            return run

        def results(stores):
            return lambda _: [cg.store(st) for st in stores]
        for s in range(len(stages)):
            lanes(s, init)
            cg.nest(list(k.inner), lambda s=s: lanes(s, accumulate(s)))
        if cg.early.get(len(stages)):
            cg.nest(list(k.inner), lambda: lanes(len(stages), results(cg.early[len(stages)])))
        lanes(len(stages), results(k.outer_stores))
    cg.accs = {}
    if len(k.outer) == 1:  # the runtime splits c itself
        lo, hi = first_range or (I64(0), I64(c.size))
        tiles(lo, hi)
    else:
        cg.nest(list(k.outer[:-1]), lambda: tiles(I64(0), I64(c.size)), first_range=first_range)


def _wide(r) -> bool:
    """An f32 sum: accumulated in f64 (module note)."""
    return r.op == "sum" and r.value.dtype == "f32"


def _acc_type(r):
    return F64 if _wide(r) else reg_type(r.value.dtype)
