"""Kernel IR: what one fused loop nest computes, shared by the LLVM and CUDA code generators.

A Kernel has an iteration domain of `outer` loop variables and, for row kernels, `inner` (reduction)
variables. Its body is a DAG of scalar expressions (KExpr) over loads with index expressions
(ir/index.py), constants and loop indices. Execution order:

    for each outer index:
        for stage in stages:            # reductions; a stage may use results of earlier stages
            for each inner index: acc = combine(acc, value)
        for each inner index: inner_stores    # e.g. softmax's  exp(x - max) / sum
        outer_stores                          # e.g. a row sum, layer_norm's mean and rstd

A pointwise kernel has no inner variables and only outer stores. Views never appear here: they
became index math on the loads. Op names in KExprs are the op table's pointwise ops, plus the leaves
`load`, `const`, `index` (an index expression as a value: iota) and `acc` (a reduction's result).

A fused graph prints each kernel's body inline under its node (KernelPrinter, below); kernel_parse.py
reads that text back and kernel_verify.py checks a Kernel's invariants.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import sym
from .index import Expr, Var, _fmt, data_values
from .text import format_value


class KExpr:
    __slots__ = ("op", "args", "attrs", "dtype", "_key", "depth")

    def __init__(self, op: str, args: tuple, attrs: dict, dtype: str):
        self.op, self.args, self.attrs, self.dtype = op, tuple(args), attrs, dtype
        self._key = None
        self.depth = 1 + max((a.depth for a in self.args), default=0)  # the longest chain under it

    def key(self):
        if self._key is None:
            attrs = tuple(sorted((k, v.key() if isinstance(v, (Expr, KExpr, Reduction)) else v)
                                 for k, v in self.attrs.items()))
            self._key = (self.op, tuple(id(a) for a in self.args), attrs, self.dtype)
        return self._key

    def __repr__(self):
        return f"KExpr({self.op}:{self.dtype})"


@dataclass(eq=False)
class Reduction:
    op: str                 # sum | prod | amax | amin | argmax | argmin
    value: KExpr
    dtype: str              # result dtype (i64 for argmax/argmin)
    stage: int = 0

    def key(self):
        return ("acc", id(self))


@dataclass
class Store:
    buf: int                # index into Kernel.buffers
    index: Expr             # flat element offset
    value: KExpr


@dataclass
class Buffer:
    name: str               # the IR value it holds, e.g. %3 or an input name
    dtype: str
    numel: int
    node: object = None     # the IR node whose value the buffer holds


@dataclass
class Kernel:
    name: str
    outer: tuple            # of Var
    inner: tuple            # of Var (reduction loops); () for a pointwise kernel
    buffers: list           # of Buffer; loads and stores name them by position
    stages: list = field(default_factory=list)        # list[list[Reduction]]
    inner_stores: list = field(default_factory=list)  # list[Store]
    outer_stores: list = field(default_factory=list)  # list[Store]
    ops: list = field(default_factory=list)           # the IR ops fused in, for reports
    reads: list = field(default_factory=list)         # buffer positions read
    writes: list = field(default_factory=list)        # buffer positions written
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    comment: str = ""

    def exprs(self) -> list:
        """Every expression the kernel computes: a walk of its reductions' and stores' values."""
        return walk([r.value for st in self.stages for r in st] + [s.value for s in self.inner_stores + self.outer_stores])

    @property
    def kind(self) -> str:
        return "row" if self.inner else "pointwise"

    def domain_str(self) -> str:
        outer = "x".join(str(v.size) for v in self.outer) or "1"
        return outer + (" x [" + "x".join(str(v.size) for v in self.inner) + "]" if self.inner else "")


def map_attrs(e: KExpr, expr, kexpr) -> dict:
    """A copy of e's attrs with its index expressions (a load's `index`, an index op's `expr`) mapped
    by `expr` and its guard by `kexpr`: the part of every KExpr rewrite that is not the op."""
    attrs = dict(e.attrs)
    for name in ("index", "expr"):
        if name in attrs:
            attrs[name] = expr(attrs[name])
    if isinstance(attrs.get("guard"), KExpr):
        attrs["guard"] = kexpr(attrs["guard"])
    return attrs


def walk(roots) -> list:
    """Every KExpr reachable from `roots`, operands before users (each once)."""
    seen, order = set(), []

    def visit(e):
        stack = [(e, False)]
        while stack:
            x, done = stack.pop()
            if id(x) in seen and not done:
                continue
            if done:
                order.append(x)
                continue
            seen.add(id(x))
            stack.append((x, True))
            for a in x.args:
                if id(a) not in seen:
                    stack.append((a, False))
            g = x.attrs.get("guard")
            if isinstance(g, KExpr) and id(g) not in seen:
                stack.append((g, False))
            for name in ("index", "expr"):  # a load's address, an index op's value: both may read data
                for v in data_values(x.attrs[name]) if isinstance(x.attrs.get(name), Expr) else ():
                    if id(v) not in seen:
                        stack.append((v, False))
    for r in roots:
        visit(r)
    return order


LABEL_OPS = 4  # distinct ops a kernel's label names before "+N"


def kernel_symbols(k: Kernel) -> list:
    """The symbolic sizes kernel k reads at run time, sorted: its loop extents, index coefficients
    and divisors, the sizes its gathers check against or compute with, and its buffers' extents (cuda_emu checks
    every access against them). Both code generators take them in this order."""
    found: set = set()

    def expr(e: Expr):
        found.update(sym.free_symbols(e.const))
        for a, c in e.terms:
            found.update(sym.free_symbols(c))
            if not isinstance(a, Var) and a.kind != "data":
                found.update(sym.free_symbols(a.c))
                expr(a.expr)
            elif isinstance(a, Var):
                found.update(sym.free_symbols(a.size))
    for v in k.outer + k.inner:
        found.update(sym.free_symbols(v.size))
    for b in k.buffers:
        found.update(sym.free_symbols(b.numel))
    for e in k.exprs():
        for name in ("index", "expr"):
            if isinstance(e.attrs.get(name), Expr):
                expr(e.attrs[name])
        for name in ("size", "value"):  # a clamp's bound, a size as a constant (a mean's count)
            if isinstance(e.attrs.get(name), sym.Sym):
                found.update(sym.free_symbols(e.attrs[name]))
    for st in k.inner_stores + k.outer_stores:
        expr(st.index)
    return sorted(found)


def describe(k: Kernel) -> str:
    """What a kernel does, in a few words, for reports and profiler traces: its distinct fused ops
    in order ("add+gelu", "amax+sub+exp+sum+2"), or, for a kernel that computes nothing, how it
    moves data: "copy" (each store reads the same element), "broadcast" (an input is re-read
    along a dim), "transpose" (another order or stride) or "gather" (an index read from memory)."""
    if k.ops:
        names = list(dict.fromkeys(k.ops))
        more = len(names) - LABEL_OPS
        return "+".join(names[:LABEL_OPS]) + (f"+{more}" if more > 0 else "")
    kinds = set()
    for st in k.inner_stores + k.outer_stores:
        loads = [e for e in walk([st.value]) if e.op == "load"]
        for ld in loads:
            index = ld.attrs["index"]
            if data_values(index):
                kinds.add("gather")
            elif index == st.index:
                kinds.add("copy")
            elif index.vars() < st.index.vars():
                kinds.add("broadcast")
            else:
                kinds.add("transpose")
        if not loads:
            kinds.add("fill")
    for word in ("gather", "transpose", "broadcast", "fill", "copy"):
        if word in kinds:
            return word
    return "copy"


# ---- the kernel's text ------------------------------------------------------------------------------
# A kernel's body as text, printed inline under its `kernel` node (as a jaxpr prints a sub-jaxpr):
#
#     %0: (f32[8,16]) = kernel %x [bytes=1024, domain="8 x [16]", ..., name="k0"] {
#       domain (i0: 8) x [i1: 16]
#       flops 2816
#       b0: f32[128] = %x [name="x"]          a buffer the kernel reads: the node's operand it holds
#       b1: f32[128] = out 0 [name="div"]     one it writes: the node's result 0
#       stage 0:
#         t0: f32 = load b0[16*i0 + i1]
#         r0: f32 = amax t0                   a reduction over the inner loops
#       stage 1:
#         t1: f32 = acc r0
#         ...
#       inner stores:
#         b1[16*i0 + i1] = t5
#     }
#
# One typed SSA line per KExpr (loads, constants, loop indices and accumulators included), in the op
# table's names; attributes as in the graph text (`[guard=t3, where="..."]`); index expressions in
# ir/index.py's own notation, a loaded index written `data(t4)`. Each value is printed in the first
# section that uses it, its operands before it, so the text is stable across runs and reads top down.
# `kernel_parse.py` reads it back; the verifier quotes these lines in its errors.
KERNEL_LEVEL = ("load", "const", "index", "acc", "clamp_index")  # ops of kernels only, not of the op table


def _atom_has_data(a) -> bool:
    return not isinstance(a, Var) and (a.kind == "data" or data_values(a.expr))


def format_expr(e: Expr, names: dict) -> str:
    """An index expression as ir/index.py prints it, loaded values by their SSA names. Terms keep
    Expr's own order, except loaded values (ordered there by object id): first, by name."""
    terms = e.terms
    if any(_atom_has_data(a) for a, _ in terms):
        texts = [(_format_atom(a, names), c) for a, c in terms]
        order = sorted(range(len(terms)), key=lambda i: ("!" + texts[i][0]) if _atom_has_data(terms[i][0])
                       else repr(terms[i][0].key()))
        parts = [texts[i][0] if _one(texts[i][1]) else f"{_fmt(texts[i][1])}*{texts[i][0]}" for i in order]
    else:
        parts = [(_format_atom(a, names) if _one(c) else f"{_fmt(c)}*{_format_atom(a, names)}") for a, c in terms]
    if not (isinstance(e.const, int) and e.const == 0) or not parts:
        parts.append(_fmt(e.const))
    return " + ".join(parts)


def _one(c) -> bool:
    return isinstance(c, int) and c == 1


def _format_atom(a, names: dict) -> str:
    if isinstance(a, Var):
        return a.name
    if a.kind == "data":
        return f"data({names.get(id(a.c), '?')})"
    return f"(({format_expr(a.expr, names)}) {'//' if a.kind == 'div' else '%'} {_fmt(a.c)})"


def _deps(e: KExpr, memo: dict) -> list:
    """e's operands in print order: args, guard, then the values its index expression loads."""
    out = list(e.args)
    g = e.attrs.get("guard")
    if isinstance(g, KExpr):
        out.append(g)
    for name in ("index", "expr"):
        x = e.attrs.get(name)
        if isinstance(x, Expr):
            vals = data_values(x)
            if len(vals) > 1:  # Expr orders them by id; print by what they are
                vals = sorted(vals, key=lambda v: _signature(v, memo))
            out += vals
    return out


def _signature(e: KExpr, memo: dict) -> str:
    """A structural description of e (to order loaded index values stably across runs)."""
    if id(e) not in memo:
        memo[id(e)] = "?"  # a cycle guard; a KExpr graph is a DAG
        attrs = sorted((k, repr(v) if not isinstance(v, (KExpr, Reduction)) else "") for k, v in e.attrs.items()
                       if k != "red")
        memo[id(e)] = f"{e.op}:{e.dtype}{attrs}(" + ",".join(_signature(a, memo) for a in e.args) + ")"
    return memo[id(e)]


class KernelPrinter:
    """Names a kernel's values and prints its body; `where[id(obj)]` is the body line of each KExpr,
    Reduction, Buffer and Store (for the verifier's messages)."""

    def __init__(self, k: Kernel):
        self.k = k
        self.names: dict = {}   # id(KExpr) -> "tN", id(Reduction) -> "rN"
        self.lines: list = []
        self.where: dict = {}
        self.sig: dict = {}
        self.n_values = 0

    def name(self, x) -> str:
        return self.names.get(id(x), "?")

    def emit(self, obj, text: str, indent: str = "  ") -> None:
        self.where[id(obj)] = len(self.lines)
        self.lines.append(indent + text)

    def values(self, roots) -> None:
        """Lines for every value `roots` need that has none yet, operands first."""
        stack = [(r, False) for r in reversed(roots)]
        opened = set()
        while stack:
            e, done = stack.pop()
            if id(e) in self.names:
                continue
            if done:
                self.names[id(e)] = f"t{self.n_values}"
                self.n_values += 1
                self.emit(e, self.format_value(e))
                continue
            if id(e) in opened:
                continue
            opened.add(id(e))
            stack.append((e, True))
            stack += [(d, False) for d in reversed(_deps(e, self.sig)) if id(d) not in self.names]

    def format_value(self, e: KExpr) -> str:
        head = f"{self.names[id(e)]}: {e.dtype} = {e.op}"
        attrs = dict(e.attrs)
        if e.op == "load" and isinstance(attrs.get("index"), Expr):
            head += f" b{attrs.pop('buf')}[{format_expr(attrs.pop('index'), self.names)}]"
        elif e.op == "const" and "value" in attrs:
            head += " " + _format_attr(attrs.pop("value"), self.names)
        elif e.op == "index" and isinstance(attrs.get("expr"), Expr):
            head += " " + format_expr(attrs.pop("expr"), self.names)
        elif e.op == "acc" and isinstance(attrs.get("red"), Reduction):
            head += " " + self.name(attrs.pop("red"))
        head += "".join(" " + self.name(a) for a in e.args)
        if attrs:
            head += " [" + ", ".join(f"{k}={_format_attr(attrs[k], self.names)}" for k in sorted(attrs)) + "]"
        return head

    def stores(self, title: str, stores) -> None:
        if not stores:
            return
        self.lines.append(f"{title}:")
        self.values([s.value for s in stores] + [v for s in stores for v in data_values(s.index)])
        for s in stores:
            self.emit(s, f"b{s.buf}[{format_expr(s.index, self.names)}] = {self.name(s.value)}")

    def body(self, buffer_sources=None, head: bool = True) -> list:
        """The body lines (unindented). buffer_sources[i]: what buffer i holds (`%x`, `out 0`), or None
        for a kernel printed on its own; head=False leaves out the domain, flops and buffers."""
        k = self.k
        outer = ", ".join(f"{v.name}: {v.size}" for v in k.outer)
        inner = ", ".join(f"{v.name}: {v.size}" for v in k.inner)
        if head:
            self.lines.append(f"domain ({outer})" + (f" x [{inner}]" if k.inner else ""))
            self.lines.append(f"flops {k.flops}")
        for i, b in enumerate(k.buffers if head else ()):
            src = f" = {buffer_sources[i]}" if buffer_sources is not None else ""
            self.emit(b, f"b{i}: {b.dtype}[{b.numel}]{src} [name={_format_attr(b.name, self.names)}]", "")
        reductions = [r for stage in k.stages for r in stage]
        for i, r in enumerate(reductions):  # named first: a broken body may read one before its line
            self.names[id(r)] = f"r{i}"
        for si, stage in enumerate(k.stages):
            self.lines.append(f"stage {si}:")
            self.values([r.value for r in stage])
            for r in stage:
                self.emit(r, f"{self.names[id(r)]}: {r.dtype} = {r.op} {self.name(r.value)}")
        self.stores("inner stores", k.inner_stores)
        self.stores("outer stores", k.outer_stores)
        return self.lines


def _format_attr(v, names: dict) -> str:
    if isinstance(v, (KExpr, Reduction)):
        return names.get(id(v), "?")
    if isinstance(v, Expr):
        return "<" + format_expr(v, names) + ">"
    return format_value(v)


def buffer_sources(node, names: dict) -> list | None:
    """What each of a kernel node's buffers holds, as its body prints it: the operand (`%x`, or `$j`
    where that operand appears twice) or `out j`; None when the node carries no io map."""
    io = node.meta.get("io")
    if io is None:
        return None
    out = []
    for kind, j in io:
        if kind == "out":
            out.append(f"out {j}")
        elif 0 <= j < len(node.args) and node.args.index(node.args[j]) == j:
            out.append(names.get(node.args[j], "%?"))
        else:
            out.append(f"${j}")
    return out


def kernel_body(node, names: dict) -> list:
    """A kernel node's body lines, unindented (the printer indents them under the node)."""
    k = node.meta.get("kernel")
    if k is None:
        return []
    return KernelPrinter(k).body(buffer_sources(node, names))


def format_kernel(k: Kernel) -> str:
    """A kernel on its own (reports, kernel dumps): four lines of summary, then its stages and stores
    as in the graph text."""
    lines = [f"kernel {k.name} ({describe(k)}) [{k.kind} {k.domain_str()}] outer=({', '.join(v.name for v in k.outer)})"
             f" inner=({', '.join(v.name for v in k.inner)})",
             "  buffers: " + ", ".join(f"b{i}={b.name}:{b.dtype}[{b.numel}]" for i, b in enumerate(k.buffers)),
             f"  fused: {' '.join(k.ops)}",
             f"  read {k.bytes_read:,} B, wrote {k.bytes_written:,} B, {k.flops:,} flops"]
    lines += ["  " + ln for ln in KernelPrinter(k).body(None, head=False)]
    return "\n".join(lines) + "\n"


def site(op: str, attrs: dict):
    """(exception, message) when an op is checked at run time: a gather's index, an integer division."""
    if op == "clamp_index":
        return "IndexError", f"index out of range in {attrs['where']} (a dimension of size {attrs['size']})"
    if "where" in attrs:
        return "ZeroDivisionError", f"integer division by zero in {attrs['where']}"
    return None


def check_sites(k: Kernel) -> list:
    """Kernel k's run-time checks, (exception, message) each, in the order of its flag bits."""
    return sorted({s for s in (site(e.op, e.attrs) for e in k.exprs()) if s is not None})[:32]


def outer_extent(k: Kernel):
    """Iterations of the first outer loop: the range the runtime splits across threads (an int, or
    a symbolic size)."""
    return k.outer[0].size if k.outer else 1
