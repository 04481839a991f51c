"""Long float sums on the CPU, in blocks: each block adds from zero and its partial into the total.

One accumulator for a whole long row (LLVM's vector lanes split it a few dozen ways) loses digits as
the total outgrows what each element adds: summing 4M floats lost 2e-6 relative where ATen's cascade
sum loses 1e-7. A row stage whose reductions include a float sum runs its inner loop in blocks of
SUM_BLOCK iterations (cascade summation): 5e-7 on those 4M floats, and no slower (8x1M sums 0.29 ->
0.24 ms). KernelCodegen (llvm.py) asks `sum_blocking` and emits the loops with `blocked_nest`.

A sum of at most SUM_BLOCK elements over several loops keeps one accumulator. Partials per run of
the innermost loop were tried: over 33 x 17 strided floats they cut the error from 3.1x eager's to
0.97x (median of 30). They were left out because one element of the benchmark convnet's ReLU output
then lands on the other side of zero from float64, which moves a weight gradient by 3% (not a wrong
kernel: each kernel matched float64 alone, the batch-norm statistics more closely than before).
"""
from __future__ import annotations

from ..ir import sym
from ..ir.kernel import Kernel
from ..ir.types import FLOATS
from .llvm_ops import LOWER
from .llvm_values import I64

SUM_BLOCK = 4096  # iterations a float sum adds from zero before adding that partial into its total


def sum_blocking(k: Kernel, reds):
    """(j, block): run inner loop j in blocks of `block` iterations, each float sum in `reds`
    adding a block into a partial of its own and the partials into its total -- or None. The
    innermost loop is blocked when it may be longer than SUM_BLOCK (a symbolic one too); otherwise
    the outermost, in blocks that cover about SUM_BLOCK elements."""
    if not k.inner or not any(r.op == "sum" and r.value.dtype in FLOATS for r in reds):
        return None
    hints = [sym.hint(v.size) for v in k.inner]
    if not isinstance(k.inner[-1].size, int) or hints[-1] > SUM_BLOCK:
        return len(hints) - 1, SUM_BLOCK
    rest = 1
    for h in hints[1:]:
        rest *= h
    if len(hints) == 1 or hints[0] * rest <= SUM_BLOCK:
        return None
    return 0, max(1, SUM_BLOCK // rest)


def blocked_nest(gen, vs, j: int, block: int, body, partials) -> None:
    """nest(vs, body) with loop j run in blocks of `block` iterations: each float sum in
    `partials` (reduction, partial, total) adds a block from zero and its partial into the total
    after the block (cascade summation, sum_blocking)."""
    b = gen.b

    def blocks():
        v = vs[j]
        n = gen.size(v.size)
        lo = b.mul(gen.vars[v.name + ".blk"], I64(block))
        hi = b.add(lo, I64(block))
        hi = b.select(b.icmp_signed("<", hi, n), hi, n)
        for r, acc, _ in partials:
            b.store(gen.init_value(r), acc)
        gen.loop(lo, hi, v.name, lambda: gen.nest(vs[j + 1:], body), min(block, sym.hint(v.size)))
        for r, acc, total in partials:
            b.store(LOWER["sum"](gen.ops, [b.load(total), b.load(acc)], r.value.dtype, {}), total)

    def level(i):
        if i < j:
            gen.loop(I64(0), gen.size(vs[i].size), vs[i].name, lambda: level(i + 1), sym.hint(vs[i].size))
            return
        n = gen.size(vs[j].size)
        count = b.sdiv(b.add(n, I64(block - 1)), I64(block))
        gen.loop(I64(0), count, vs[j].name + ".blk", blocks, -(-sym.hint(vs[j].size) // block))
    level(0)
