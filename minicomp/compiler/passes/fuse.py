"""Fusion: rewrite the graph into kernels (plus the ops that run in torch), in one stage.

Assumes: a simplified tensor-level graph; ctx.kernel_ops names the pointwise/reduction ops the
backend's code generator has (the pipeline runs this stage only for backends that have kernels).
Guarantees: every value is computed by exactly one `kernel` node or torch op; a value is written to
memory only if it is a graph output, a torch op's operand, used by a reduction of another row shape,
or shared by several kernels and not worth recomputing (rematerialize.py decides, at the backend's
flops-per-byte balance, when options.remat). The result is the fused graph and nothing else reads
what was decided on the way: ctx.fusion records it (the schedule, the bytes recomputation saved)
for the report, the dump's fusion report and explain()'s list of pairs not fused.
"""
from __future__ import annotations

from ...ir import OPS, Graph, Node, sym
from ...ir.kernel import walk
from ..buffers import required_buffers
from ..schedule import KernelStep, Schedule, schedule
from . import rematerialize


def shared_values(sch: Schedule) -> dict:
    """Values without a buffer that several kernels inline: node -> the kernel names."""
    where: dict = {}
    for step in sch.steps:
        if isinstance(step, KernelStep):
            for key in step.builder.values:
                node_id = key[0]
                where.setdefault(node_id, set()).add(step.builder.name)
    return {nid: ks for nid, ks in where.items() if len(ks) > 1}


def conservative_schedule(graph: Graph, kernel_ops) -> tuple[Schedule, set]:
    """Schedule where every value shared by two kernels is stored once (no recomputation).
    Returns the schedule and the set of values stored only because they are shared."""
    M, why, views = required_buffers(graph, kernel_ops)
    shared_only: set = set()
    by_id = {id(n): n for n in graph.nodes}
    while True:
        sch = schedule(graph, M, why, views, kernel_ops)
        new = [by_id[nid] for nid in shared_values(sch) if nid in by_id and by_id[nid] not in M
               and OPS[by_id[nid].op].category in ("pointwise", "data")]
        if not new:
            return sch, shared_only
        for n in new:
            M.add(n)
            why[n] = "shared by several kernels"
            shared_only.add(n)


def build_graph(graph: Graph, sch: Schedule) -> Graph:
    """The fused graph: torch ops as they were, each kernel one `kernel` node whose results are
    picked with getitem. node.meta['kernel'] holds the Kernel, meta['io'] maps its buffers."""
    remap: dict = {n: n for n in graph.inputs}
    nodes: list = []
    read = _read_from_memory(graph, sch)
    for n in graph.nodes:
        if n.op == "constant":
            remap[n] = n
            nodes.append(n)
    for step in sch.steps:
        if not isinstance(step, KernelStep):  # a copy: the source graph stays as it was (remat reuses it)
            copy = Node(step.op, tuple(remap[a] for a in step.args), step.attrs, step.type, step.name, step.meta)
            remap[step] = copy
            nodes.append(copy)
            continue
        b = step.builder
        # a value stored so that other kernels could read it, whose readers all ended up in the kernel
        # that computes it (which inlines it), is not written at all
        stored = [r for r in step.roots if r in sch.materialized and r in read]
        kernel = b.build(set(stored))
        kernel.comment = f"{' '.join(kernel.ops)} over {kernel.domain_str()}"
        written = {s.buf for s in kernel.inner_stores + kernel.outer_stores}
        args, io = [], []
        for i, buf in enumerate(kernel.buffers):
            if i in written:
                io.append(("out", stored.index(buf.node)))
            else:
                io.append(("arg", len(args)))
                args.append(remap[buf.node])
        _account(kernel, written)
        types = tuple(r.type for r in stored)
        attrs = {"name": kernel.name, "kind": kernel.kind, "domain": kernel.domain_str(),
                 "fused": " ".join(kernel.ops), "bytes": kernel.bytes_read + kernel.bytes_written}
        kn = Node("kernel", args, attrs, types, meta={"kernel": kernel, "io": io})
        nodes.append(kn)
        for j, r in enumerate(stored):
            g = Node("getitem", (kn,), {"index": j}, r.type)
            nodes.append(g)
            remap[r] = g
    outputs = [None if o is None else remap[o] for o in graph.outputs]
    return Graph(graph.name, graph.inputs, nodes, outputs, graph.constants, graph.sizes, graph.size_inputs)


def _read_from_memory(graph: Graph, sch: Schedule) -> set:
    """Values something reads from memory: a kernel's loads, a torch op's operands, graph outputs."""
    read = {o for o in graph.outputs if o is not None}
    for step in sch.steps:
        read.update(step.builder.buf_pos if isinstance(step, KernelStep) else step.args)
    return read


def _account(kernel, written) -> None:
    """Bytes each buffer moves once, and flops per loop level, for the cost model and the report."""
    from ...ir.types import itemsize
    for i, buf in enumerate(kernel.buffers):
        nbytes = buf.numel * itemsize(buf.dtype)
        if i in written:
            kernel.bytes_written += nbytes
            kernel.writes.append(i)
        else:
            kernel.bytes_read += nbytes
            kernel.reads.append(i)
    outer = 1
    for v in kernel.outer:
        outer *= v.size
    inner = 1
    for v in kernel.inner:
        inner *= v.size
    # each stage (a pass over the row) and the inner stores evaluate their own expressions, so a value
    # two passes use is computed, and counted, twice; a part that reads no inner index (rsqrt of a
    # finished mean) is loop-invariant: once per row
    positional, invariant = {}, {}
    per_inner = float(sum(len(st) for st in kernel.stages))  # each reduction's combine (add, max...)
    per_row = 0.0
    for group in [[r.value for r in st] for st in kernel.stages] + [[s.value for s in kernel.inner_stores]]:
        for e in walk(group):
            if sym.hint(inner) > 1 and _invariant(e, invariant):
                per_row += _cost(e, positional)
            else:
                per_inner += _cost(e, positional)
    per_outer = sum(_cost(e, positional) for e in walk([s.value for s in kernel.outer_stores]))
    kernel.flops = int(sym.hint(outer) * (sym.hint(inner) * per_inner + per_row + per_outer))  # at the hints


def _invariant(e, memo: dict) -> bool:
    """An expression of finished reductions and constants only: the same at every inner index."""
    if id(e) not in memo:
        memo[id(e)] = e.op in ("acc", "const") or (e.op not in ("load", "index") and bool(e.args)
                                                   and all(_invariant(a, memo) for a in e.args))
    return memo[id(e)]


def _positional(e, memo: dict) -> bool:
    """An expression of loop indices and constants only (a cat part's bounds test): index math,
    which the code generators fold into loop bounds, not arithmetic per element."""
    if id(e) not in memo:
        memo[id(e)] = e.op in ("index", "const") or (e.op not in ("load", "acc") and bool(e.args)
                                                     and all(_positional(a, memo) for a in e.args))
    return memo[id(e)]


def _cost(e, memo: dict) -> float:
    """The op table's flops for one evaluation of e; positional tests and the selects they drive
    (a cat choosing its part) cost nothing: they are index math."""
    if e.op not in OPS or _positional(e, memo) or (e.op == "where" and _positional(e.args[0], memo)):
        return 0.0
    return OPS[e.op].cost


def refusals(graph: Graph, sch: Schedule) -> list:
    """Every producer -> consumer pair the schedule did not fuse: (producer step, consumer step,
    producer op, consumer op, why); a step is a kernel name or torch:<op>."""
    where = {}
    for step in sch.steps:
        for r in (step.roots if isinstance(step, KernelStep) else [step]):
            where[r] = step.builder.name if isinstance(step, KernelStep) else f"torch:{step.op}"
    out = []
    for n in graph.nodes:
        if n not in where:
            continue
        for a in n.args:
            if a not in where or where[a] == where[n]:
                continue
            if where[a].startswith("torch:") or where[n].startswith("torch:"):
                why = "runs in torch (extern / matmul)"
            else:
                why = sch.refusals.get((n, where[a])) or sch.why_materialized.get(a, "scheduled earlier")
            out.append((where[a], where[n], a.op, n.op, why))
    return out


def fusion_report(graph: Graph, fused: Graph, sch: Schedule) -> str:
    lines = ["kernels:"]
    for n in fused.nodes:
        if n.op == "kernel":
            k = n.meta["kernel"]
            lines.append(f"  {k.name} [{k.kind} {k.domain_str()}] fused: {' '.join(k.ops)}; "
                         f"read {k.bytes_read:,} B, wrote {k.bytes_written:,} B")
    lines.append("not fused (producer -> consumer: why):")
    lines += [f"  {p} -> {c}: {pop} -> {cop}: {why}" for p, c, pop, cop, why in refusals(graph, sch)]
    return "\n".join(lines) + "\n"


class Fusion:
    """What the fusion stage decided, for reports and tests (no later pass reads it)."""

    def __init__(self, schedule: Schedule, recomputed: set, remat_bytes_saved: int):
        self.schedule, self.recomputed, self.remat_bytes_saved = schedule, recomputed, remat_bytes_saved


def run(graph: Graph, ctx) -> Graph:
    sch, shared_only = conservative_schedule(graph, ctx.kernel_ops)
    chosen, saved, order = set(), 0, {n: i for i, n in enumerate(graph.nodes)}
    if shared_only and ctx.options.remat:
        chosen, saved = rematerialize.choose(sch, shared_only, ctx.flops_per_byte, order)
    new = chosen
    for round_ in range(rematerialize.ROUNDS):  # schedule again, the chosen values inlined where read
        if not new:
            break
        M, why, views = required_buffers(graph, ctx.kernel_ops)
        M |= sch.materialized - chosen
        why.update({n: r for n, r in sch.why_materialized.items() if n in M})
        sch = schedule(graph, M, why, views, ctx.kernel_ops)
        if round_ + 1 == rematerialize.ROUNDS:
            break
        # the kernels that recompute a value now read what it is computed from: a value stored for
        # its own kernel alone until then (x - mean, under x_hat's recomputation) may be worth it now
        new, more_saved = rematerialize.choose(sch, shared_only - chosen, ctx.flops_per_byte, order)
        chosen, saved = chosen | new, saved + more_saved
    ctx.fusion = Fusion(sch, chosen, saved)
    ctx.remat_bytes_saved = saved
    fused = build_graph(graph, sch)
    ctx.dump.stage("fusion_report", lambda: fusion_report(graph, fused, sch))
    if ctx.options.profile:  # explain() lists what did not fuse
        ctx.report.refusals += [f"{ctx.name}: {p} -> {c}: {pop} -> {cop}: {why}"
                                for p, c, pop, cop, why in refusals(graph, sch)]
    return fused
