"""Check a kernel node's body: what the code generators assume of a Kernel, stated once.

Guarantees on success: the node's attributes describe its kernel (name, kind, domain, fused ops,
bytes); its io map gives every buffer one operand or result of matching dtype and size, and each
result buffer is stored; every loop variable is distinct; every value's operands are computed in
the kernel (a DAG), pointwise ops follow the op table's dtype rules, loads and stores name existing
buffers of their own dtype (loads only read, stores only write) at indices over the kernel's loop
variables (an outer store's over the outer ones) that divide only by positive sizes, within the
buffer where unguarded (bounded over the loops where affine; exact at this compile's sizes, over
every point up to a size, else at the loops' corners); the stores of a result buffer write each of
its elements once (every point evaluated, up to a size); a loaded index is an integer; an
accumulator is read only after its reduction's stage.
An error names the kernel and quotes its line as printed (ir/kernel.py).
"""
from __future__ import annotations

import math

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import index_values, sym
from .index import Expr, Var, data_values
from .kernel import Kernel, KExpr, Reduction
from .kernel import KERNEL_LEVEL
from .ops import OPS
from .types import DTYPES, FLOATS, INTS, TensorType

_IGNORED_BY_INFER = ("guard", "where")  # a kernel's own notes on an op: its checks, not its meaning
COVER_POINTS = 1 << 20  # loop points past which an index is evaluated at corners, a cover not at all


def _size(x) -> bool:
    """An extent or element count: an int >= 0, or a symbolic size (ir/sym.py) not surely negative
    (the ranges alone cannot see the guards a slice was decided under: T - 1 after 1 <= T)."""
    return isinstance(x, (int, sym.Sym)) and not isinstance(x, bool) and not sym.known(x, "<", 0)


def _positive(d) -> bool:
    """A divisor that may be right: an int > 0, or a size not surely <= 0."""
    if isinstance(d, sym.Sym):
        return not sym.known(d, "<=", 0)
    return isinstance(d, int) and not isinstance(d, bool) and d > 0


class KernelChecker:
    def __init__(self, node, fail):
        """fail(msg, obj=None) raises, quoting obj's body line (a KExpr, Reduction, Buffer or Store)."""
        self.node, self.fail = node, fail
        self.k: Kernel = node.meta.get("kernel")
        self.seen: set = set()     # ids of KExprs checked
        self.done_red: dict = {}   # id(Reduction) -> stage, for reductions checked so far

    def run(self) -> None:
        n, k = self.node, self.k
        io = n.meta.get("io")
        if not isinstance(k, Kernel) or io is None:
            self.fail("a kernel node must carry its Kernel and io map (meta['kernel'], meta['io'])")
        self.check_attrs()
        names = [v.name for v in k.outer + k.inner]
        if len(set(names)) != len(names) or any(not isinstance(v, Var) or not _size(v.size)
                                                for v in k.outer + k.inner):
            self.fail(f"loop variables {names} must be distinct, each with a size >= 0")
        self.loops = {v.name: v.size for v in k.outer + k.inner}
        self.outer = {v.name for v in k.outer}
        self.check_buffers(io)
        for si, stage in enumerate(k.stages):
            for r in stage:
                self.check_reduction(r, si)
            for r in stage:
                self.done_red[id(r)] = si
        for level, stores in (("inner", k.inner_stores), ("outer", k.outer_stores)):
            for st in stores:
                self.check_store(st, level)
        stored = {st.buf for st in k.inner_stores + k.outer_stores}
        for i, (kind, _) in enumerate(io):
            if kind == "out" and i not in stored:
                self.fail(f"result buffer b{i} is never stored", k.buffers[i])
        for i in sorted(stored):
            self.check_cover(i)

    def check_cover(self, buf: int) -> None:
        """Every element of result buffer `buf` written exactly once by its stores, their indices
        evaluated over every point of their loops at the sizes' hints: a store that skips an element
        leaves whatever the memory held in the output, one that writes an element twice loses a
        value. Checked where the loops hold at most COVER_POINTS points and no index reads memory."""
        k, hints = self.k, sym.current().hints
        stores = [(st, k.outer + k.inner) for st in k.inner_stores if st.buf == buf] + [
            (st, k.outer) for st in k.outer_stores if st.buf == buf]
        try:
            numel = sym.evaluate(k.buffers[buf].numel, hints)
            grids = [[(v.name, sym.evaluate(v.size, hints)) for v in loops] for _, loops in stores]
        except KeyError:  # a size without a hint
            return
        if sum(math.prod(n for _, n in g) for g in grids) > COVER_POINTS or any(data_values(st.index) for st, _ in stores):
            return
        with unset_fake_temporarily():  # real counts, inside a compile's fake mode too
            self.count_writes(buf, numel, stores, grids, hints)

    def count_writes(self, buf: int, numel: int, stores: list, grids: list, hints: dict) -> None:
        counts = torch.zeros(numel, dtype=torch.int64)
        for (st, _), grid in zip(stores, grids):
            idx = index_values.over(st.index, grid, hints)
            if idx is None:
                return
            idx = idx.reshape(-1)
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= numel):
                self.fail(f"store index reaches [{int(idx.min())}, {int(idx.max())}], outside the buffer's "
                          f"{numel} elements", st)
            counts += torch.bincount(idx, minlength=numel)
        wrong = (counts != 1).nonzero()
        if wrong.numel():
            j = int(wrong[0])
            self.fail(f"element {j} of b{buf} is written {int(counts[j])} times by its stores "
                      "(each element exactly once)", stores[0][0])

    def check_attrs(self) -> None:
        k, a = self.k, self.node.attrs
        want = {"name": k.name, "kind": k.kind, "domain": k.domain_str(), "fused": " ".join(k.ops),
                "bytes": k.bytes_read + k.bytes_written}
        for key, v in want.items():
            if key in a and a[key] != v:
                self.fail(f"attribute {key}={a[key]!r}, but its kernel says {v!r}")

    def check_buffers(self, io) -> None:
        n, k = self.node, self.k
        if len(io) != len(k.buffers):
            self.fail(f"{len(k.buffers)} buffers but an io map of {len(io)}")
        results = n.type if isinstance(n.type, tuple) and not isinstance(n.type, TensorType) else ()
        args_used, outs_used = [], []
        for i, (b, (kind, j)) in enumerate(zip(k.buffers, io)):
            if b.dtype not in DTYPES or not _size(b.numel):
                self.fail(f"buffer b{i} has a bad type {b.dtype}[{b.numel}]", b)
            if kind == "arg" and isinstance(j, int) and 0 <= j < len(n.args):
                t, used = n.args[j].type, args_used
            elif kind == "out" and isinstance(j, int) and 0 <= j < len(results):
                t, used = results[j], outs_used
            else:
                self.fail(f"buffer b{i} holds {kind} {j}, which the node does not have", b)
            if j in used:
                self.fail(f"buffer b{i}: {kind} {j} is held by two buffers", b)
            used.append(j)
            if not isinstance(t, TensorType) or (t.dtype, t.numel) != (b.dtype, b.numel):
                self.fail(f"buffer b{i} is {b.dtype}[{b.numel}] but holds a value of type {t}", b)
        self.writes = {i for i, (kind, _) in enumerate(io) if kind == "out"}

    # -- expressions ---------------------------------------------------------------------------------
    def check_index(self, e: Expr, allowed, obj) -> None:
        if not isinstance(e, Expr):
            self.fail(f"index {e!r} is not an index expression", obj)
        for a in index_values.atoms(e):
            if isinstance(a, Var) and (a.name not in self.loops or self.loops[a.name] != a.size):
                self.fail(f"index uses {a.name} (size {a.size}), which is not a loop variable of the kernel", obj)
            if not isinstance(a, Var) and a.kind in ("div", "mod") and not _positive(a.c):
                self.fail(f"index {'divides' if a.kind == 'div' else 'takes a modulus'} by {a.c}", obj)
        bad = e.vars() - allowed
        if bad:
            where = "the outer loops" if allowed == self.outer else "the loops"
            self.fail(f"index uses {', '.join(sorted(bad))}, outside {where} at this level", obj)
        for v in data_values(e):
            self.value(v, allowed)
            if v.dtype not in INTS:
                self.fail(f"a loaded index must be an integer, got {v.dtype}", obj)

    def in_range(self, e: Expr, numel: int, what: str, obj) -> None:
        if data_values(e):
            return
        if not e.is_affine():
            self.at_points(e, numel, what, obj)
            return
        # sym.known, never a comparison: the verifier must not guard (a symbolic size may be 0 at some call)
        if sym.known(numel, ">", 0) and all(sym.known(self.loops[v], ">", 0) for v in e.vars()):
            lo, hi = e.range()  # over symbolic sizes: an error only where it is out of range for every size
            if lo is None or hi is None:
                return
            if sym.known(lo, "<", 0) or sym.known(hi, ">=", numel) or (
                    isinstance(lo, int) and isinstance(hi, int) and isinstance(numel, int) and (lo < 0 or hi >= numel)):
                self.fail(f"{what} reaches [{lo}, {hi}], outside the buffer's {numel} elements", obj)
        if not all(isinstance(x, int) for x in [numel, e.const] + [c for _, c in e.terms]):
            self.at_points(e, numel, what, obj)  # and exactly at the sizes this compile runs at

    def at_points(self, e: Expr, numel, what: str, obj) -> None:
        """The index evaluated exactly at the sizes' hints (what this compile runs at; skipped where
        a size has none): at every point of the loops it reads where they hold at most COVER_POINTS,
        else where every loop is 0, where each alone is at its last value and where all are. Bounds
        over ranges would overstate an index with divisions or moduli (3*(i//3) + i%3 is i), and
        its extremes need not lie at the corners (i % 5 over i < 8 peaks at 4). Each point runs,
        so one outside the buffer is an error."""
        hints = sym.current().hints
        try:
            last = {v: sym.evaluate(self.loops[v], hints) - 1 for v in sorted(e.vars())}
            n = sym.evaluate(numel, hints)
        except (KeyError, TypeError):
            return
        if n <= 0 or any(x < 0 for x in last.values()):
            return
        try:
            if math.prod(x + 1 for x in last.values()) <= COVER_POINTS:
                with unset_fake_temporarily():
                    self.every_point(e, last, n, hints, what, obj)
                return
            zero = dict.fromkeys(last, 0)
            for point in [zero, last] + [{**zero, v: x} for v, x in last.items()]:
                at = index_values.at(e, point, hints)
                if at is not None and not 0 <= at < n:
                    self.outside(what, at, point, n, obj)
        except KeyError:  # a size in a coefficient or divisor without a hint
            return

    def every_point(self, e: Expr, last: dict, n: int, hints: dict, what: str, obj) -> None:
        idx = index_values.over(e, [(v, x + 1) for v, x in last.items()], hints)
        if idx is None or idx.numel() == 0:
            return
        flat = idx.reshape(-1)
        pos = int(flat.argmax()) if int(flat.max()) >= n else int(flat.argmin()) if int(flat.min()) < 0 else None
        if pos is not None:
            point = dict(zip(last, torch.unravel_index(torch.tensor(pos), idx.shape)))
            self.outside(what, int(flat[pos]), {v: int(x) for v, x in point.items()}, n, obj)

    def outside(self, what: str, at: int, point: dict, n: int, obj) -> None:
        where = ", ".join(f"{v}={x}" for v, x in sorted(point.items()))
        self.fail(f"{what} is {at} at {where or 'every point'}, outside the buffer's {n} elements", obj)

    def value(self, root: KExpr, allowed) -> None:
        """Check root and every value it reads (operands first)."""
        stack, opened = [(root, False)], set()
        while stack:
            e, done = stack.pop()
            if id(e) in self.seen:
                continue
            if not isinstance(e, KExpr):
                self.fail(f"operand {e!r} is not a kernel value")
            if not done:
                if id(e) in opened:
                    self.fail("a value that depends on itself", e)
                opened.add(id(e))
                stack.append((e, True))
                deps = list(e.args) + [g for g in (e.attrs.get("guard"),) if isinstance(g, KExpr)]
                stack += [(d, False) for d in deps]
                continue
            self.seen.add(id(e))
            self.check_one(e, allowed)

    def check_one(self, e: KExpr, allowed) -> None:
        guard = e.attrs.get("guard")
        if guard is not None and (not isinstance(guard, KExpr) or guard.dtype != "b8"):
            self.fail("a guard must be a b8 value", e)
        if e.dtype not in DTYPES:
            self.fail(f"unknown dtype {e.dtype!r}", e)
        if e.op == "load":
            buf = e.attrs.get("buf")
            if not isinstance(buf, int) or not 0 <= buf < len(self.k.buffers):
                self.fail(f"load of b{buf}, which the kernel does not have", e)
            if buf in self.writes:
                self.fail(f"load of b{buf}, a buffer the kernel writes", e)
            b = self.k.buffers[buf]
            if e.dtype != b.dtype:
                self.fail(f"load of {b.dtype} buffer b{buf} typed {e.dtype}", e)
            self.check_index(e.attrs.get("index"), allowed, e)
            if guard is None:
                self.in_range(e.attrs["index"], b.numel, "load index", e)
        elif e.op == "const":
            v = e.attrs.get("value")
            if e.dtype == "b8":
                ok = isinstance(v, bool) or isinstance(v, int) and v in (0, 1)
            elif e.dtype in INTS:
                ok = isinstance(v, (int, sym.Sym))
            else:  # a symbolic size as a value (a mean's count) too
                ok = e.dtype in FLOATS and isinstance(v, (int, float, sym.Sym)) and not isinstance(v, bool)
            if not ok:
                self.fail(f"constant {v!r} does not fit dtype {e.dtype}", e)
        elif e.op == "index":
            self.check_index(e.attrs.get("expr"), allowed, e)
            if e.dtype not in INTS:
                self.fail(f"a loop index must be an integer, got {e.dtype}", e)
        elif e.op == "acc":
            r = e.attrs.get("red")
            if not isinstance(r, Reduction) or id(r) not in self.done_red:
                self.fail("accumulator of a reduction that is not finished by an earlier stage", e)
            if e.dtype != r.dtype:
                self.fail(f"accumulator typed {e.dtype} of a {r.dtype} reduction", e)
        elif e.op == "clamp_index":
            if (len(e.args) != 1 or e.args[0].dtype not in INTS or e.dtype != "i64"
                    or not _size(e.attrs.get("size"))):
                self.fail("clamp_index takes one integer value and a size, and gives i64", e)
        else:
            self.pointwise(e)
        if e.op in KERNEL_LEVEL and e.op != "clamp_index" and e.args:
            self.fail(f"{e.op} takes no operands", e)

    def pointwise(self, e: KExpr) -> None:
        opdef = OPS.get(e.op)
        if opdef is None or opdef.category != "pointwise":
            self.fail(f"{e.op!r} is not a pointwise op of the op table nor a kernel op ({', '.join(KERNEL_LEVEL)})", e)
        if opdef.arity is not None and len(e.args) != opdef.arity:
            self.fail(f"{e.op} takes {opdef.arity} operand(s), got {len(e.args)}", e)
        attrs = {k: v for k, v in e.attrs.items() if k not in _IGNORED_BY_INFER}
        missing = [k for k in opdef.attrs if k not in attrs]
        if missing:
            self.fail(f"missing attribute(s) {', '.join(missing)}", e)
        try:
            want = opdef.infer(tuple(TensorType((), a.dtype) for a in e.args), attrs)
        except (TypeError, ValueError, KeyError, IndexError) as err:
            self.fail(str(err), e)
        if want.dtype != e.dtype:
            self.fail(f"{e.op} of {', '.join(a.dtype for a in e.args)} gives {want.dtype}, not {e.dtype}", e)

    def check_reduction(self, r: Reduction, stage: int) -> None:
        if r.stage != stage:
            self.fail(f"reduction of stage {r.stage} listed in stage {stage}", r)
        if r.op not in OPS or OPS[r.op].category != "reduction":
            self.fail(f"{r.op!r} is not a reduction", r)
        if not isinstance(r.value, KExpr):
            self.fail("a reduction must reduce a kernel value", r)
        self.value(r.value, set(self.loops))
        want = "i64" if r.op in ("argmax", "argmin") else r.value.dtype
        if r.dtype != want:
            self.fail(f"{r.op} of {r.value.dtype} gives {want}, not {r.dtype}", r)

    def check_store(self, st, level: str) -> None:
        if not isinstance(st.buf, int) or st.buf not in self.writes:
            self.fail(f"store to b{st.buf}, which is not a result buffer of the kernel", st)
        self.check_index(st.index, set(self.loops) if level == "inner" else self.outer, st)
        self.value(st.value, set(self.loops))
        b = self.k.buffers[st.buf]
        if st.value.dtype != b.dtype:
            self.fail(f"store of a {st.value.dtype} value to {b.dtype} buffer b{st.buf}", st)
        self.in_range(st.index, b.numel, "store index", st)
        if level == "outer":
            self.outer_only(st.value, st)

    def outer_only(self, root: KExpr, st) -> None:
        """An outer store runs after the inner loops: its value may not read an inner index."""
        inner = {v.name for v in self.k.inner}
        if not inner:
            return
        stack, seen = [root], set()
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            for name in ("index", "expr"):
                x = e.attrs.get(name)
                if isinstance(x, Expr):
                    if x.vars() & inner:
                        names = ", ".join(sorted(x.vars() & inner))
                        self.fail(f"an outer store reads {e.op} at inner index {names}", e)
                    stack += data_values(x)
            stack += list(e.args) + [g for g in (e.attrs.get("guard"),) if isinstance(g, KExpr)]
