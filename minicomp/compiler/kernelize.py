"""Build one Kernel's expressions by inlining the IR graph into a loop nest's index space.

`value(node, idx)` returns the KExpr for `node` at the multi-index `idx` (a list of index Exprs):
a node with a buffer becomes a `load` at its row-major offset; a view becomes index math on its
operand (reshape -> floor-div/modulo, permute -> reorder, expand -> 0, slice -> affine); a pointwise
op recurses on its operands at broadcast indices; a reduction owned by this kernel becomes its
accumulator when indexed at this kernel's own outer index, and anything else raises NotFusable so
the fusion pass can materialize it or pick another kernel. Expressions are hash-consed: the same
value at the same index is built once (CSE inside a kernel for free).
"""
from __future__ import annotations

import math

from ..ir import OPS, Node, sym
from ..ir.index import Expr, Var, data, linear, unravel
from ..ir.kernel import Buffer, Kernel, KExpr, Reduction, Store, walk
from ..ir.scalar import COMPOSITES
from ..ir.types import FLOATS


INT_DIVISIONS = ("div_floor", "div_trunc", "remainder", "fmod")  # integer forms raise on a zero divisor


def _where(node: Node) -> str:
    """The op and the user's source line, for run-time errors a kernel reports."""
    return f"{node.op} at {node.meta['source']}" if node.meta.get("source") else node.op


def prefix_reshape(a, b) -> bool:
    """Whether shapes a and b are reshapes of each other that keep their trailing dims: a = A + T,
    b = B + T, prod(A) == prod(B), T holding at least the last dim. One loop nest then serves both
    with the innermost (vectorized) dims indexed alike; the division and modulo a reshape costs
    fall on the outer loops only."""
    a, b = tuple(a), tuple(b)
    if not a or not b or math.prod(a) != math.prod(b) or math.prod(a) == 0:
        return False
    t = 0
    while t < min(len(a), len(b)) and a[-1 - t] == b[-1 - t]:
        t += 1
    return t > 0 and math.prod(a[:len(a) - t]) == math.prod(b[:len(b) - t])


# Kernel expressions, their code generators and printers recurse along a chain of inlined ops; a
# model unrolling 500 sin()s hit Python's recursion limit in all of them. So a kernel inlines at most
# MAX_INLINE_DEPTH graph nodes along one chain (past that the value is stored and the rest of the
# chain reads it), and builds no expression deeper than MAX_EXPR_DEPTH (a value stored by this
# kernel that a newcomer would extend past it makes the newcomer start a kernel of its own, which
# loads the value instead).
MAX_INLINE_DEPTH = 96
MAX_EXPR_DEPTH = 192


class NotFusable(Exception):
    def __init__(self, node: Node, reason: str, materialize: bool = False):
        super().__init__(reason)
        self.node, self.reason, self.materialize = node, reason, materialize


def _vars(prefix, shape):
    """One loop variable per dim; size-1 dims index with the constant 0."""
    return [Var(f"{prefix}{k}", s) if s != 1 else None for k, s in enumerate(shape)]


def _idx(vs):
    return [Expr.of(v) if v is not None else Expr(0) for v in vs]


class KernelBuilder:
    """Accumulates the stores and reductions of one kernel.

    has_buffer(node) -> bool says whether a node lives in memory outside this kernel (inputs,
    externs, materialized values); `own` are the nodes this kernel stores (inlined, not loaded)."""

    def __init__(self, name: str, shape: tuple, reduce_dims: tuple, has_buffer, order=None):
        self.name, self.shape, self.reduce_dims = name, tuple(shape), tuple(reduce_dims)
        self.has_buffer = has_buffer
        vs = _vars("i", shape)
        self.full_vars = vs
        self.outer = [v for k, v in enumerate(vs) if k not in reduce_dims and v is not None]
        self.inner = [v for k, v in enumerate(vs) if k in reduce_dims and v is not None]
        self.full_idx = _idx(vs)
        self.memo: dict = {}
        self.values: dict = {}
        self.depth = 0  # nodes being inlined, one inside the other (value -> _value -> value ...)
        self.buffers: list[Buffer] = []
        self.buf_pos: dict = {}
        self.reductions: dict[Node, Reduction] = {}
        self.stores: list[tuple[Node, str]] = []  # (node, "inner" | "outer")
        self.store_list: list[Store] = []
        self.own: set = set()
        self.ops: list = []      # the IR nodes computed inside (inlined or reduced)
        self.order = order or {}  # node -> position in the graph, to list fused ops in program order
        self.guard = None

    # -- index spaces ------------------------------------------------------------------------------
    def outer_idx(self, shape) -> list | None:
        """This kernel's outer index laid out in `shape` (a reduction's result, keepdim or not)."""
        nd = len(self.shape)
        keep = tuple(1 if k in self.reduce_dims else s for k, s in enumerate(self.shape))
        drop = tuple(s for k, s in enumerate(self.shape) if k not in self.reduce_dims)
        if tuple(shape) == keep:
            return [Expr(0) if k in self.reduce_dims else self.full_idx[k] for k in range(nd)]
        if tuple(shape) == drop:
            return [self.full_idx[k] for k in range(nd) if k not in self.reduce_dims]
        return None

    def level_of(self, node: Node) -> str | None:
        if node.type.shape == self.shape:
            return "inner" if self.reduce_dims else "outer"
        if self.reduce_dims and self.outer_idx(node.type.shape) is not None:
            return "outer"
        if self.reshaped_idx(node.type.shape) is not None:
            return "inner" if self.reduce_dims else "outer"
        return None

    def reshaped_idx(self, shape) -> list | None:
        """The kernel's full index laid out in another shape of as many elements: the domain read as
        a reshape (a Linear's [B*T, C] result and its [B, T, C] view are one loop nest; a column sum
        split into [P, R/P, C] partials and the [R, C] value it sums too)."""
        if tuple(shape) == self.shape or not prefix_reshape(shape, self.shape):
            return None
        return unravel(linear(self.full_idx, self.shape), shape)

    # -- expression building -----------------------------------------------------------------------
    def mk(self, op, args=(), dtype=None, /, **attrs) -> KExpr:
        # positional-only: a cast's own `dtype` attribute lands in attrs, not in the result dtype
        e = KExpr(op, args, attrs, dtype)
        return self.memo.setdefault(e.key(), e)

    def buffer(self, node: Node) -> int:
        if node not in self.buf_pos:
            self.buf_pos[node] = len(self.buffers)
            self.buffers.append(Buffer(node.name or node.op, node.type.dtype, node.type.numel, node))
        return self.buf_pos[node]

    def load(self, node: Node, idx) -> KExpr:
        attrs = {"buf": self.buffer(node), "index": linear(idx, node.type.shape)}
        if self.guard is not None:
            attrs["guard"] = self.guard
        return self.mk("load", (), node.type.dtype, **attrs)

    def value(self, node: Node, idx: list) -> KExpr:
        key = (id(node), tuple([e.key() for e in idx]), id(self.guard))
        hit = self.values.get(key)
        if hit is not None and node in self.own and self.depth + hit.depth > MAX_EXPR_DEPTH:
            raise NotFusable(node, f"it would extend {node.op}'s expression in this kernel past {MAX_EXPR_DEPTH} "
                                   "levels: read from memory in a kernel of its own")
        if hit is None:
            if self.depth >= MAX_INLINE_DEPTH and node.op in OPS and OPS[node.op].category == "pointwise" \
                    and node not in self.own and not self.has_buffer(node):
                raise NotFusable(node, f"a chain of more than {MAX_INLINE_DEPTH} inlined ops", materialize=True)
            self.depth += 1
            try:
                hit = self.values[key] = self._value(node, [Expr.of(e) for e in idx])
            finally:
                self.depth -= 1
        return hit

    def _value(self, node: Node, idx: list) -> KExpr:
        if node in self.reductions:
            want = self.outer_idx(node.type.shape)
            if want is None or [e.key() for e in want] != [e.key() for e in idx]:
                raise NotFusable(node, "reduction used at another row's index", materialize=True)
            return self.mk("acc", (), self.reductions[node].dtype, red=self.reductions[node])
        if node not in self.own and self.has_buffer(node):
            return self.load(node, idx)
        cat = OPS[node.op].category
        if cat == "reduction":
            raise NotFusable(node, "reduction computed in another kernel", materialize=True)
        if cat not in ("pointwise", "view", "creation", "data") or node.op == "constant":
            raise NotFusable(node, f"{node.op} has no buffer", materialize=True)
        for a in node.args:  # fail before inlining a long chain only to meet a foreign reduction
            if (a.op in OPS and OPS[a.op].category == "reduction" and a not in self.reductions and a not in self.own
                    and not self.has_buffer(a)):
                raise NotFusable(a, "reduction computed in another kernel", materialize=True)
        self.ops.append(node)
        shape = node.type.shape
        if cat == "pointwise":
            args = []
            for a in node.args:
                lead = len(shape) - a.type.ndim
                aidx = [idx[lead + k] if s != 1 else Expr(0) for k, s in enumerate(a.type.shape)]
                args.append(self.value(a, aidx))
            if node.op in COMPOSITES:  # built from the scalar table's primitives (ir/scalar.py)
                return COMPOSITES[node.op][0](self.mk, node.type.dtype, *args, **node.attrs)
            attrs = dict(node.attrs)
            if node.op in INT_DIVISIONS and node.args[1].type.dtype not in FLOATS:  # checked for 0
                attrs["where"] = _where(node)
                if self.guard is not None:  # a cat part divides where it is not selected too
                    attrs["guard"] = self.guard
            return self.mk(node.op, tuple(args), node.type.dtype, **attrs)
        src = node.args[0] if node.args else None
        if node.op == "reshape":
            return self.value(src, unravel(linear(idx, shape), src.type.shape))
        if node.op == "permute":
            sidx = [None] * len(shape)
            for k, d in enumerate(node.attrs["dims"]):
                sidx[d] = idx[k]
            return self.value(src, sidx)
        if node.op == "expand":
            lead = len(shape) - src.type.ndim
            return self.value(src, [idx[lead + k] if s != 1 else Expr(0) for k, s in enumerate(src.type.shape)])
        if node.op == "slice":
            d = node.attrs["dim"]
            sidx = list(idx)
            sidx[d] = idx[d] * node.attrs["step"] + node.attrs["start"]
            return self.value(src, sidx)
        if node.op == "full":
            return self.mk("const", (), node.type.dtype, value=node.attrs["value"])
        if node.op == "iota":
            e = idx[node.attrs["dim"]] * node.attrs["step"] + node.attrs["start"] if isinstance(
                node.attrs["step"], (int, sym.Sym)) and isinstance(node.attrs["start"], (int, sym.Sym)) else None
            if e is None:  # float start/step: start + step * i in f64, then the result dtype
                i = self.mk("index", (), "i64", expr=idx[node.attrs["dim"]])
                f = self.mk("cast", (i,), "f64", dtype="f64")
                f = self.mk("add", (self.mk("mul", (f, self.mk("const", (), "f64", value=float(node.attrs["step"]))), "f64"),
                                    self.mk("const", (), "f64", value=float(node.attrs["start"]))), "f64")
                return self.mk("cast", (f,), node.type.dtype, dtype=node.type.dtype)
            i = self.mk("index", (), "i64", expr=e)
            return i if node.type.dtype == "i64" else self.mk("cast", (i,), node.type.dtype, dtype=node.type.dtype)
        if node.op == "cat":
            return self._cat(node, idx)
        if node.op in ("gather", "index_select"):
            d = node.attrs["dim"]
            x, index = node.args
            i = self.value(index, idx if node.op == "gather" else [idx[d]])
            sidx = list(idx)
            # under a cat part's guard the index is only checked where the part is selected
            guard = {} if self.guard is None else {"guard": self.guard}
            sidx[d] = data(self.mk("clamp_index", (i,), "i64", size=x.type.shape[d], where=_where(node), **guard))
            return self.value(x, sidx)
        raise NotFusable(node, f"{node.op} cannot be inlined", materialize=True)

    def _cat(self, node: Node, idx: list) -> KExpr:
        """Piecewise select along the cat dim; each part's loads are guarded to stay in bounds."""
        d = node.attrs["dim"]
        pos = self.mk("index", (), "i64", expr=idx[d])
        parts, off = [], 0
        for a in node.args:
            n = a.type.shape[d]
            lo = self.mk("const", (), "i64", value=off)
            hi = self.mk("const", (), "i64", value=off + n)
            inside = self.mk("logical_and", (self.mk("ge", (pos, lo), "b8"), self.mk("lt", (pos, hi), "b8")), "b8")
            saved = self.guard
            self.guard = inside if saved is None else self.mk("logical_and", (saved, inside), "b8")
            sidx = list(idx)
            sidx[d] = idx[d] - off
            try:  # a part that cannot fuse must not leave its guard on what the kernel builds next
                parts.append((inside, self.value(a, sidx)))
            finally:
                self.guard = saved
            off += n
        out = parts[-1][1]
        for inside, v in reversed(parts[:-1]):
            out = self.mk("where", (inside, v, out), node.type.dtype)
        return out

    # -- adding stores and reductions (nothing changes if they raise) ---------------------------------
    def mark(self):
        return len(self.buffers), len(self.ops), len(self.values), self.guard

    def reset(self, mark) -> None:
        """Forget buffers and op names a failed add introduced (memoized expressions stay valid)."""
        nbuf, nops, nvals, self.guard = mark
        for b in self.buffers[nbuf:]:
            del self.buf_pos[b.node]
        del self.buffers[nbuf:]
        del self.ops[nops:]
        for k in list(self.values)[nvals:]:  # values made since the mark may load the dropped buffers
            del self.values[k]

    def add_reduction(self, node: Node) -> None:
        x = node.args[0]
        dims = node.attrs["dims"] if "dims" in node.attrs else (node.attrs["dim"],)
        assert x.type.shape == self.shape and tuple(dims) == self.reduce_dims
        value = self.value(x, self.full_idx)
        stage = 0
        for e in _reachable_accs(value):
            stage = max(stage, e.attrs["red"].stage + 1)
        self.reductions[node] = Reduction(node.op, value, node.type.dtype, stage)
        self.ops.append(node)

    def add_store(self, node: Node) -> None:
        level = self.level_of(node)
        if level is None:
            raise NotFusable(node, f"shape {node.type.shape} does not fit the kernel's {self.shape}")
        if node.type.shape == self.shape:
            idx = self.full_idx
        elif level == "inner" or not self.reduce_dims:
            idx = self.reshaped_idx(node.type.shape)
        else:
            idx = self.outer_idx(node.type.shape)
        self.own.add(node)
        try:
            value = self.value(node, idx)
        except NotFusable:
            self.own.discard(node)
            raise
        self.stores.append((node, level, idx, value))

    def build(self, store_nodes) -> Kernel:
        """The Kernel: reductions in stages, a store for each node in `store_nodes` it computes."""
        stages: list[list[Reduction]] = []
        for r in self.reductions.values():
            while len(stages) <= r.stage:
                stages.append([])
            stages[r.stage].append(r)
        fused = sorted(set(self.ops), key=lambda n: self.order.get(n, 0))
        ops = [n.op for n in fused if OPS[n.op].category in ("pointwise", "reduction", "data")]
        k = Kernel(self.name, tuple(self.outer), tuple(self.inner), self.buffers, stages, ops=ops)
        for node, level, idx, value in self.stores:
            if node in store_nodes:
                st = Store(self.buffer(node), linear(idx, node.type.shape), value)
                (k.inner_stores if level == "inner" and self.reduce_dims else k.outer_stores).append(st)
        for node, r in self.reductions.items():
            if node in store_nodes:
                acc = self.mk("acc", (), r.dtype, red=r)
                k.outer_stores.append(Store(self.buffer(node), linear(self.outer_idx(node.type.shape), node.type.shape), acc))
        return k


def _reachable_accs(e: KExpr):
    return [x for x in walk([e]) if x.op == "acc"]


