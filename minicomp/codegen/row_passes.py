"""Row kernels on the CPU: which pass over a row stores what, and which values a later pass loads.

A row kernel (layer_norm, softmax, their backwards; a reduction down columns too, columns.py)
passes over its row once per stage of reductions, and once more for its inner stores, each pass
computing what it needs from the loads up. Two things made passes compute a value again:

- **Stores in a pass of their own.** A store that reads none of the last stage's results (the GELU
  a backward recomputes, stored beside the column sum of its gradient) waited for the stores' pass
  and computed its value there again. `store_passes` runs each store in the loop of the first stage
  that has every result it reads: the Mixer's backward GELU kernel (erf and exp, a bias-gradient
  sum down columns) went from 0.80 to 0.52 ms.
- **Values several passes need.** The NormStack's forward kernel (layer_norm -> GELU -> residual
  add -> layer_norm) evaluated the GELU's erf three times per element: for the second layer_norm's
  mean, its variance and the stores. `plan` picks, pass by pass, the values a later pass reaches that
  an earlier one computed, whose recomputation costs at least MIN_COST (the op table's per-element
  cost: a load 1, an add 1, an erf 8); the earlier pass stores each into a stack buffer of one row
  (the row is in L1), and the later passes load it (that kernel: 0.42 -> 0.22 ms). Cheaper values
  (x - mean: a load and two ops) are computed again, which costs about what a store and a load
  would. Only rows of a constant length keep values, at most MAX_BYTES of buffers per kernel (each
  thread running the kernel has its own, on its stack); reductions down columns keep none.
- **Prestores** (`prestores`): a store `v / s` or `v * s` whose v is what the last stage sums (a
  softmax's exp(x - max)) is written by that stage as it sums, and the stores' pass only scales
  the output in place: each exp computed once, and no row buffer for it.
"""
from __future__ import annotations

import math

from ..ir.kernel import Kernel, KExpr, walk
from ..ir.ops import OPS
from .llvm_values import I64

MIN_COST = 6.0
MAX_BYTES = 128 << 10
_FREE = ("const", "acc", "index")  # per row or positional: nothing to keep


def _varying(roots, names: set) -> set:
    """ids of the values under `roots` that change along the row: they read a loop variable in
    `names` (through a load's or an index's expression), or use a value that does."""
    out = set()
    for x in walk(roots):
        if (x.op == "load" and names & x.attrs["index"].vars() or x.op == "index" and names & x.attrs["expr"].vars()
                or any(id(a) in out for a in x.args)):
            out.add(id(x))
    return out


def _cost(e: KExpr, varying: set, kept: dict, memo: dict) -> float:
    """What evaluating e again per element costs: values already kept (`kept`) are loads, and what
    is fixed along the row (a mean, a reciprocal) is computed once per row."""
    if id(e) in kept or id(e) not in varying or e.op in _FREE:
        return 0.0
    if id(e) not in memo:
        own = 1.0 if e.op == "load" else OPS[e.op].cost if e.op in OPS else 1.0
        memo[id(e)] = own + sum(_cost(a, varying, kept, memo) for a in e.args)
    return memo[id(e)]


def elem_bytes(e: KExpr) -> int:
    """An element of e's row buffer: its register type (f16 and bf16 are held as f32, b8 as a byte)."""
    return {"f64": 8, "i64": 8, "i16": 2, "i8": 1, "u8": 1, "b8": 1}.get(e.dtype, 4)


def row_length(k: Kernel) -> int:
    return math.prod(v.size for v in k.inner)


def prestores(k: Kernel):
    """Inner stores `v op s` (op: div or mul, s fixed per row) whose v is what the last stage reduces:
    the stage writes v to the output as it goes, the store loop only scales it -- softmax computes
    each exp once. Returns ({id(reduction): [stores]}, {id(store)})."""
    if not k.stages or not k.inner_stores:
        return {}, set()
    inner = {v.name for v in k.inner}
    pre, finish = {}, set()
    for st in k.inner_stores:
        e = st.value
        if e.op not in ("div", "mul") or k.buffers[st.buf].dtype != e.dtype or e.args[0].dtype != e.dtype:
            continue
        r = next((r for r in k.stages[-1] if r.op == "sum" and r.value is e.args[0]), None)
        if r is not None and id(e.args[1]) not in _varying([e.args[1]], inner):
            pre.setdefault(id(r), []).append(st)
            finish.add(id(st))
    return pre, finish


def store_passes(k: Kernel) -> list:
    """The pass each inner store runs in: the first stage after every stage whose result it reads
    (a store that reads none of the last stage's results runs in a stage's loop, not in a pass of
    its own after the last stage), else len(k.stages), the stores' own pass."""
    stage_of = {id(r): q for q, reds in enumerate(k.stages) for r in reds}
    out = []
    for st in k.inner_stores:
        q = max((stage_of.get(id(e.attrs["red"]), len(k.stages)) + 1 for e in walk([st.value]) if e.op == "acc"),
                default=0)
        out.append(min(q, len(k.stages)))
    return out


def stores_by_pass(k: Kernel) -> dict:
    """{pass: the inner stores it makes} (store_passes)."""
    out: dict = {}
    for st, q in zip(k.inner_stores, store_passes(k)):
        out.setdefault(q, []).append(st)
    return out


def passes(k: Kernel, finish=frozenset()) -> list:
    """The roots each pass over a row evaluates: each stage's reduced values and the inner stores
    that run in it, then the inner stores left for a pass of their own (a store in `finish` only
    scales what its stage wrote: prestores)."""
    out = [[r.value for r in stage] for stage in k.stages]
    rest = []
    for st, q in zip(k.inner_stores, store_passes(k)):
        (out[q] if q < len(k.stages) else rest).append(st.value.args[1] if id(st) in finish else st.value)
    if rest:
        out.append(rest)
    return out


def _reach(roots) -> set:
    seen, stack = set(), list(roots)
    while stack:
        x = stack.pop()
        if id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.args)
    return seen


def plan(k: Kernel, size_of, finish=frozenset()) -> dict:
    """{id(value): (value, the pass that stores it, the later passes that load it)} for the values
    kept in a row buffer; `size_of(value)` is what one element of its buffer takes (elem_bytes)."""
    if len(k.stages) + bool(k.inner_stores) < 2 or not k.inner or not all(isinstance(v.size, int) for v in k.inner):
        return {}
    row = row_length(k)
    roots = passes(k, finish)
    varying = _varying([e for r in roots for e in r], {v.name for v in k.inner})
    reach = [_reach(r) for r in roots]
    kept: dict = {}
    used, memo = 0, {}
    for q in range(1, len(roots)):
        seen: set = set()
        stack = list(roots[q])
        while stack:
            e = stack.pop()
            if id(e) in seen or id(e) in kept or e.op in _FREE or e.op == "load":
                continue
            seen.add(id(e))
            source = next((p for p in range(q) if id(e) in reach[p]), None)
            if source is not None and _cost(e, varying, kept, memo) >= MIN_COST:
                size = row * size_of(e)
                if used + size <= MAX_BYTES:
                    kept[id(e)] = (e, source, {p for p in range(source + 1, len(roots)) if id(e) in reach[p]})
                    used += size
                    memo.clear()  # costs above it change: it is a load now
                    continue
            stack.extend(e.args)
    return kept


class RowBuffers:
    """A row kernel's kept values in code (llvm.py KernelCodegen `cg`): `keep` stores what pass q
    computed for later passes into their row buffers (allocas of one row each, made at the first
    store), `load` gives pass q those values from the buffers, in place of computing them."""

    def __init__(self, kept: dict | None = None):
        self.kept, self.bufs = kept or {}, {}

    @staticmethod
    def _index(cg):
        """The element's position in a row buffer: the inner loops' variables, row-major."""
        idx = None
        for v in cg.k.inner:
            i = cg.vars[v.name]
            idx = i if idx is None else cg.b.add(cg.b.mul(idx, I64(v.size)), i)
        return idx

    def keep(self, cg, q: int) -> None:
        for key, (e, source, _) in self.kept.items():
            if source == q:
                v = cg.value(e)
                if key not in self.bufs:
                    self.bufs[key] = cg.entry_alloca(v.type, row_length(cg.k))
                cg.b.store(v, cg.b.gep(self.bufs[key], [self._index(cg)], source_etype=v.type))

    def load(self, cg, q: int) -> None:
        for key, (_, _, users) in self.kept.items():
            if q in users:
                buf = self.bufs[key]
                ty = buf.allocated_type
                cg.scopes[-1][key] = cg.b.load(cg.b.gep(buf, [self._index(cg)], source_etype=ty), typ=ty)
