"""How a (collapsed) kernel runs on the GPU: its layout, index width, vector width and launch size.

Row kernels (reductions) get one of three layouts:
  thread  one thread per row -- short rows, or column reductions where neighbouring threads read
          neighbouring addresses (the reduced axis is strided, the row axis contiguous);
  warp    one warp per row, for rows up to WARP_ROW_MAX elements (32 a lane);
  block   one block per row for longer rows.
Pointwise kernels get a vector width V when some buffer is accessed contiguously in the innermost
variable at V-aligned offsets: V elements of the widest such buffer make 16 bytes. Index math is
32-bit when every index provably stays below 2^30 (room for grid-stride overshoot), else 64-bit.
Launches are at most one full wave (THREADS_PER_SM on every SM); loops are grid-stride beyond that.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import OPS
from ..ir.index import Expr, Var
from ..ir.kernel import Kernel, walk
from ..ir.types import itemsize

WARP_ROW_MAX = 1024     # longest row a single warp reduces
THREAD_ROW_MAX = 32     # rows this short get a thread each
COLUMN_MIN_ROWS = 2048  # column reductions get a thread a row when that makes enough threads
THREADS_PER_SM = 2048   # resident threads per SM on sm_80/sm_90
MAX_BLOCK = 1024        # threads a block can have (and what a block reduction's 32 partials cover)
VECTOR_MAX_COST = 64    # per-element op cost (op table weights) above which a kernel is compute-bound:
                        # wide accesses would not help, and V unrolled copies of the body cost compile time
LIMIT32 = 1 << 30


@dataclass
class Plan:
    strategy: str           # pointwise | thread | warp | block
    idx_t: str              # C type of index math: int | long long
    rows: int               # outer iterations (pointwise: elements)
    length: int             # inner iterations a row (pointwise: 1)
    vector: tuple | None    # pointwise: (V, ids of loads read V-wide, positions of outer stores written V-wide)

    @property
    def label(self) -> str:
        return f"pointwise-vec{self.vector[0]}" if self.vector else self.strategy

    def launch(self, sm_count: int) -> tuple[int, int]:
        """(grid, block): blocks of 256 threads (a block-row layout widens them for long rows)."""
        wave = sm_count * THREADS_PER_SM
        if self.strategy == "pointwise":
            work = self.rows // (self.vector[0] if self.vector else 1)
        elif self.strategy == "thread":
            work = self.rows
        elif self.strategy == "warp":
            work = self.rows * 32
        else:
            block = 256 if self.length <= 4096 else 512 if self.length <= 16384 else 1024
            return min(self.rows, wave // block), block
        return min(-(-work // 256), wave // 256), 256


def prod(vs) -> int:
    n = 1
    for v in vs:
        n *= v.size
    return n


def plan(k: Kernel, exprs: list, warp_row_max: int = WARP_ROW_MAX) -> Plan:
    """`exprs`: every expression of the kernel (kernel.walk of its roots)."""
    rows, length = prod(k.outer), prod(k.inner)
    idx_t = "int" if _fits32(k, exprs) else "long long"
    if not k.inner and not k.stages and not k.inner_stores:  # reductions over no dims or size-1 dims
        return Plan("pointwise", idx_t, rows, 1, _vector(k, exprs))
    if length <= THREAD_ROW_MAX or (_column(k) and rows >= COLUMN_MIN_ROWS):
        strategy = "thread"
    else:
        strategy = "warp" if length <= warp_row_max else "block"
    return Plan(strategy, idx_t, rows, length, None)


def _bound(e: Expr) -> int:
    """Largest |value| any partial sum of `e` can take (data atoms are clamped gather indices)."""
    total = abs(e.const)
    for a, c in e.terms:
        if isinstance(a, Var):
            b = max(a.size - 1, 0)
        elif a.kind == "div":
            b = _bound(a.expr) // a.c
        elif a.kind == "mod":
            b = a.c - 1
        else:
            b = a.c.attrs["size"] if a.c.op == "clamp_index" else 1 << 62
        total += abs(c) * b
    return total


def _fits32(k: Kernel, exprs) -> bool:
    indices = [e.attrs["index"] for e in exprs if e.op == "load"] + [e.attrs["expr"] for e in exprs if e.op == "index"]
    indices += [s.index for s in k.inner_stores + k.outer_stores]
    sizes = [b.numel for b in k.buffers] + [prod(k.outer) * prod(k.inner)]
    return max(sizes) < LIMIT32 and all(_bound(e) < LIMIT32 for e in indices)


def _column(k: Kernel) -> bool:
    """A column reduction: loads stride the reduced axis and walk the row axis contiguously."""
    loads = [e.attrs["index"] for e in walk([r.value for st in k.stages for r in st]) if e.op == "load"]
    vi, vo = k.inner[-1], k.outer[-1] if k.outer else None
    return vo is not None and not any(i.coeff(vi) == 1 for i in loads) and any(i.coeff(vo) == 1 for i in loads)


def _vector(k: Kernel, exprs):
    """(V, vector loads, vector stores) or None. A V-wide access is affine with coefficient 1 on the
    innermost variable v and V-aligned wherever v is; groups of V must stay within one row of v."""
    if not k.outer or sum(OPS[e.op].cost for e in exprs if e.op in OPS) > VECTOR_MAX_COST:
        return None
    v = k.outer[-1]
    accesses = [(e.attrs["buf"], e.attrs["index"], ("load", id(e))) for e in exprs
                if e.op == "load" and e.attrs.get("guard") is None]  # a cat part's guarded loads stay scalar
    accesses += [(s.buf, s.index, ("store", j)) for j, s in enumerate(k.outer_stores)]
    contiguous = [a for a in accesses if a[1].is_affine() and a[1].coeff(v) == 1]
    if not contiguous:
        return None
    width = min(8, 16 // max(itemsize(k.buffers[b].dtype) for b, _, _ in contiguous))
    if width < 2 or prod(k.outer) < width or (len(k.outer) > 1 and v.size % width):
        return None
    chosen = [key for _, idx, key in contiguous
              if idx.const % width == 0 and all(c % width == 0 for a, c in idx.terms if a.name != v.name)]
    if not chosen:
        return None
    return (width, {i for kind, i in chosen if kind == "load"}, {j for kind, j in chosen if kind == "store"})
