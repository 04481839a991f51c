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
Over symbolic sizes the layout, block and vector width are chosen at the hints (sym.hint: no guard;
every layout is correct at every size), a vector width only where V provably divides what must stay
V-aligned, 32-bit indices only where the ranges prove them, and the grid at each call's sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import OPS, sym
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
    rows: object            # outer iterations (pointwise: elements); an int or a symbolic size
    length: object          # inner iterations a row (pointwise: 1)
    vector: tuple | None    # pointwise: (V, ids of loads read V-wide, positions of outer stores written V-wide)

    @property
    def label(self) -> str:
        return f"pointwise-vec{self.vector[0]}" if self.vector else self.strategy

    @property
    def block(self) -> int:
        """Threads a block: 256 (a block-row layout widens them for long rows, at the hints when the
        length is symbolic: any length runs correctly at any block, lanes stride the row)."""
        if self.strategy != "block":
            return 256
        length = sym.hint(self.length)
        return 256 if length <= 4096 else 512 if length <= 16384 else 1024

    def launch(self, sm_count: int, values: dict | None = None) -> tuple[int, int]:
        """(grid, block) at sizes `values` (symbol -> int; the hints when None): at most one wave."""
        rows = sym.hint(self.rows) if values is None else sym.evaluate(self.rows, values)
        wave, block = sm_count * THREADS_PER_SM, self.block
        if self.strategy == "pointwise":
            work = rows // (self.vector[0] if self.vector else 1)
        elif self.strategy == "thread":
            work = rows
        elif self.strategy == "warp":
            work = rows * 32
        else:
            return min(rows, wave // block), block
        return min(-(-work // block), wave // block), block


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
    hint_len = sym.hint(length)  # a symbolic row length or row count picks its layout at the hints
    if hint_len <= THREAD_ROW_MAX or (_column(k) and sym.hint(rows) >= COLUMN_MIN_ROWS):
        strategy = "thread"
    else:
        strategy = "warp" if hint_len <= warp_row_max else "block"
    return Plan(strategy, idx_t, rows, length, None)


def _bound(e: Expr):
    """Largest |value| any partial sum of `e` can take (data atoms are clamped gather indices); a
    symbolic size when the extents are (raises SymbolicError when a sign is unknown)."""
    total = abs(e.const)
    for a, c in e.terms:
        if isinstance(a, Var):
            b = a.size if sym.is_sym(a.size) else max(a.size - 1, 0)
        elif a.kind == "div":
            b = _bound(a.expr) // a.c
        elif a.kind == "mod":
            b = a.c - 1
        else:
            b = a.c.attrs["size"] if a.c.op == "clamp_index" else 1 << 62
        total += abs(c) * b
    return total


def _fits32(k: Kernel, exprs) -> bool:
    """Every index provably (for every size, ir/sym.py `known`) below LIMIT32."""
    indices = [e.attrs["index"] for e in exprs if e.op == "load"] + [e.attrs["expr"] for e in exprs if e.op == "index"]
    indices += [s.index for s in k.inner_stores + k.outer_stores]
    sizes = [b.numel for b in k.buffers] + [prod(k.outer) * prod(k.inner)]
    try:
        return all(sym.known(x, "<", LIMIT32) for x in sizes + [_bound(e) for e in indices])
    except sym.SymbolicError:
        return False


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
    # fewer elements than V (at the hints) skip the vector loop; the scalar tail does them
    if width < 2 or sym.hint(prod(k.outer)) < width or (len(k.outer) > 1 and not _divides(width, v.size)):
        return None
    chosen = [key for _, idx, key in contiguous
              if _divides(width, idx.const) and all(_divides(width, c) for a, c in idx.terms if a.name != v.name)]
    if not chosen:
        return None
    return (width, {i for kind, i in chosen if kind == "load"}, {j for kind, j in chosen if kind == "store"})


def _divides(width: int, x) -> bool:
    """width divides x for every size (a symbolic x: when its remainder simplifies to 0)."""
    r = sym.mod(x, width)
    return isinstance(r, int) and r == 0
