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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from .index import Expr, data_values


class KExpr:
    __slots__ = ("op", "args", "attrs", "dtype", "_key")

    def __init__(self, op: str, args: tuple, attrs: dict, dtype: str):
        self.op, self.args, self.attrs, self.dtype = op, tuple(args), attrs, dtype
        self._key = None

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


def format_kernel(k: Kernel) -> str:
    """Readable text of a kernel (debug dumps), one line per expression."""
    names: dict = {}
    lines = [f"kernel {k.name} ({describe(k)}) [{k.kind} {k.domain_str()}] outer=({', '.join(v.name for v in k.outer)})"
             f" inner=({', '.join(v.name for v in k.inner)})",
             "  buffers: " + ", ".join(f"b{i}={b.name}:{b.dtype}[{b.numel}]" for i, b in enumerate(k.buffers)),
             f"  fused: {' '.join(k.ops)}",
             f"  read {k.bytes_read:,} B, wrote {k.bytes_written:,} B, {k.flops:,} flops"]
    accs: dict = {}

    def fmt(e: KExpr) -> str:
        if id(e) in names:
            return names[id(e)]
        if e.op == "load":
            s = f"b{e.attrs['buf']}[{e.attrs['index']}]"
        elif e.op == "const":
            s = repr(e.attrs["value"])
        elif e.op == "index":
            s = f"idx({e.attrs['expr']})"
        elif e.op == "acc":
            s = accs.get(id(e.attrs["red"]), "acc?")
        else:
            extra = "".join(f" {k2}={v}" for k2, v in e.attrs.items() if k2 != "guard")
            s = f"{e.op}({', '.join(fmt(a) for a in e.args)}{extra})"
        return s

    def emit_all(roots, indent):
        for e in walk(roots):
            if e.op in ("load", "const", "index", "acc") or id(e) in names:
                continue
            name = f"t{len(names)}"
            lines.append(f"{indent}{name}: {e.dtype} = {fmt(e)}")
            names[id(e)] = name
    for si, stage in enumerate(k.stages):
        lines.append(f"  stage {si}:")
        emit_all([r.value for r in stage], "    ")
        for r in stage:
            accs[id(r)] = f"acc{len(accs)}"
            lines.append(f"    {accs[id(r)]}: {r.dtype} = {r.op} over inner of {fmt(r.value)}")
    for title, stores in (("inner stores", k.inner_stores), ("outer stores", k.outer_stores)):
        if stores:
            lines.append(f"  {title}:")
            emit_all([s.value for s in stores], "    ")
            for s in stores:
                lines.append(f"    b{s.buf}[{s.index}] = {fmt(s.value)}")
    return "\n".join(lines) + "\n"

