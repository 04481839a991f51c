"""Training: which forward values the backward reads from memory, and which it computes again.

AOTAutograd hands over one joint graph, forward and backward. Every forward value the backward
uses is either *saved* (the forward writes it and it stays alive until the backward reads it) or
*recomputed* by the backward from values that are saved. Saved activations are most of a training
step's memory; recomputing costs flops, nearly free when the recomputation lands inside a backward
kernel that reads its inputs anyway (a fused pointwise op moves no extra bytes).

Why a minimum cut: put every value on a flow graph, the source behind the forward's inputs and the
sink behind what the backward computes, each value an edge whose capacity is the bytes that saving
it costs. A set of values whose edges separate source from sink is a valid saved set (the backward
recomputes everything past it), and the minimum cut (flow.py, on networkx) is the one that saves fewest bytes.
The flow runs Boykov-Kolmogorov: on these graphs (a long chain of layers, few paths per value) it is
2-3x faster than networkx's default preflow-push, which also had 10x outliers (0.35 s on one of an
HF GPT-2 compile's three cuts); the cut it gives is the same (the source side of the residual graph
of a maximum flow does not depend on which algorithm found the flow).
Graph inputs cost nothing to save (they are alive anyway); ties go to the later value (less to
recompute) and to values that are not views (a view's base is what is in memory).

Never recomputed (an infinite edge from the source): inputs; matmul/conv results (compute, not
memory); externs, which includes every random op (a torch call: not repeatable, not fusible);
reductions; ops the backend's kernels lack; values marked must-save (activation checkpointing's
MUST_SAVE); and values whose recomputation would not fuse into a backward kernel by our own fusion
rules -- found by scheduling the backward the cut produces (compiler/schedule.py, in the order
fusion_order.py gives) and refusing the values that would get a kernel of their own there, the
last of a recomputed chain first. Recompute chains are bounded by op-table cost
per element (MAX_RECOMPUTE_COST): past the bound a value becomes a checkpoint the cut may save, so
a long chain cannot blow up the backward's flops. `budget` (remat_budget) relaxes these rules step
by step until the saved bytes fit, and says why when they cannot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import networkx as nx

from ...errors import MinicompError
from ...ir import OPS, Graph, Node, TensorType, sym
from ..buffers import runs_in_torch
from ..schedule import KernelStep
from . import flow
from .fusion_order import fusion_order
from .rematerialize import MAX_RECOMPUTE

MAX_RECOMPUTE_COST = 2 * MAX_RECOMPUTE  # op-table cost per element one recomputed value may inline
FUSION_CHECKS = 4                       # rounds refusing only the last lone kernels of a chain
INLINED = ("pointwise", "view", "creation", "data")  # what kernelize.py inlines into a kernel
# remat_budget: each level recomputes more than the one before (never inputs, matmuls, externs)
LEVELS = (("fused", MAX_RECOMPUTE_COST, True, False), ("longer chains", 4 * MAX_RECOMPUTE_COST, True, False),
          ("any chain", math.inf, True, False), ("own kernels", math.inf, False, False),
          ("reductions too", math.inf, False, True))


class Sides(NamedTuple):
    tangents: set    # the tangent inputs
    bw: set          # what depends on a tangent: computed in the backward
    forward: set     # what the forward outputs need (inputs included): computed in the forward
    must_have: set   # values that do not depend on a tangent but are gradients (a constant zero)


@dataclass
class Cut:
    saved: list                 # forward values the backward reads, in graph order
    recomputed: list            # forward values the backward computes again, in graph order
    moved: list                 # values only the backward uses, computed there (not in the forward)
    saved_bytes: int            # see saved_bytes()
    banned: dict = field(default_factory=dict)  # forward value -> why it may not be recomputed
    level: str = "fused"        # the rules that made it (remat_budget may relax them)

    @property
    def in_backward(self) -> list:
        """Every value the backward computes that does not depend on a tangent."""
        return self.recomputed + self.moved

    def describe(self, names: Callable = lambda n: n.op) -> str:
        lines = [f"saved ({self.saved_bytes:,} B, rules: {self.level}):"]
        lines += [f"  {names(n)}: {n.type} {nbytes(n):,} B" for n in self.saved]
        lines.append("recomputed in backward:")
        lines += [f"  {names(n)}: {n.type} {n.op}" for n in self.recomputed]
        lines.append("not recomputable (where the backward needs them):")
        lines += [f"  {names(n)}: {why}" for n, why in self.banned.items() if n in self.saved]
        return "\n".join(lines) + "\n"


def nbytes(n: Node) -> int:
    """At the hints for a symbolic size: the cut is decided for the sizes being compiled."""
    return sym.hint(n.type.nbytes) if isinstance(n.type, TensorType) else 0


def _root(n: Node) -> Node:
    while n.op in OPS and OPS[n.op].category == "view" and n.args:
        n = n.args[0]
    return n


def saved_bytes(values) -> int:
    """Bytes the saved values keep alive: graph inputs and constants are free (alive anyway), and so
    are views of them or of another saved value (they share its memory)."""
    values = list(dict.fromkeys(values))
    kept = {v for v in values if _root(v) is v}
    total = 0
    for v in values:
        r = _root(v)
        if r.op in ("input", "constant") or (r is not v and r in kept):
            continue
        total += nbytes(v)
    return total


def classify(graph: Graph, n_fwd: int) -> Sides:
    """The backward is what depends on a tangent input (inputs named tangents*, as AOTAutograd
    names them); the forward is what its n_fwd outputs need; the rest is used only by the backward."""
    tangents = {x for x in graph.inputs if x.name.startswith("tangents")}
    bw = set(tangents)
    for n in graph.nodes:
        if any(a in bw for a in n.args):
            bw.add(n)
    users = graph.users()
    for n in graph.nodes:  # a constant made only for the backward (a scalar operand) is the backward's
        if not n.args and n.op != "constant" and users[n] and all(u in bw for u in users[n]):
            bw.add(n)
    must_have = {o for o in graph.outputs[n_fwd:] if o is not None and o not in bw}
    forward = {x for x in graph.inputs if x not in tangents} | {o for o in graph.outputs[:n_fwd] if o is not None}
    for n in reversed(graph.nodes):
        if n in forward:
            forward.update(n.args)
    return Sides(tangents, bw, forward - bw, must_have)


def _inlinable(n: Node, kernel_ops) -> bool:
    return n.op in OPS and OPS[n.op].category in INLINED and n.op != "constant" and not runs_in_torch(n, kernel_ops)


def _bans(graph: Graph, forward: set, kernel_ops, max_cost: float, reductions: bool, must_save, group) -> dict:
    """{forward value: why it may not be recomputed}, chains past max_cost included (topological
    order: a value past the bound becomes a checkpoint, and the cost after it starts again). Values
    only the backward uses are not banned: they are computed once, where the cut puts them."""
    banned, cost = {}, {}
    for n in graph.inputs:
        if n in forward:
            banned[n] = "graph input"
    for n in graph.nodes:
        if n not in forward:
            continue
        cat = OPS[n.op].category if n.op in OPS else "extern"
        if must_save(n):
            banned[n] = "marked must-save"
        elif n.op == "constant":
            banned[n] = "constant"
        elif cat in ("matmul", "extern", "tuple", "kernel"):
            banned[n] = {"matmul": f"{n.op} (compute-bound: BLAS)", "extern": "runs in torch (extern)"}.get(
                cat, f"{n.op} of a torch call")
        elif cat == "reduction" and not (reductions and not runs_in_torch(n, kernel_ops)):
            banned[n] = "reduction (its result is small: saved instead)"
        elif cat != "reduction" and not _inlinable(n, kernel_ops):
            banned[n] = f"{n.op} has no kernel on this backend"
        if n in banned:
            cost[n] = 0.0
            continue
        own = OPS[n.op].cost if cat in ("pointwise", "reduction") else 0.0
        cost[n] = own + sum(cost.get(a, 0.0) for a in n.args if a not in banned)
        if cost[n] > max_cost:
            banned[n], cost[n] = f"recompute chain costs {cost[n]:g} ops per element (bound {max_cost:g})", 0.0
    by_group: dict = {}
    for n in graph.nodes:  # one torch op lowered to several IR nodes is recomputed whole or not at all
        if group(n) is not None:
            by_group.setdefault(group(n), []).append(n)
    for members in by_group.values():
        why = next((banned[m] for m in members if m in banned), None)
        if why is not None:
            for m in members:
                if m in forward:
                    banned.setdefault(m, why)
    return banned


def min_cut(graph: Graph, n_fwd: int, banned: dict, saveable, must_recompute) -> tuple[list, list]:
    """(saved values, values the backward computes without a tangent), by a minimum s-t cut."""
    _, bw, forward, must_have = classify(graph, n_fwd)
    everything = graph.inputs + graph.nodes
    pos = {n: i for i, n in enumerate(everything)}
    n_all = len(everything)
    scale = 4 * n_all * n_all + 1  # bytes first, then the tie-breaks (summed over a cut: below scale)
    users = graph.users()
    edges = []  # (u, v, capacity); None: infinite
    for n in everything:
        i = pos[n]
        if n in bw:  # joined to the sink: an edge into it is an edge into the sink (half the vertices)
            continue
        if saveable(n) and isinstance(n.type, TensorType):
            free = n.op in ("input", "constant")
            view = n.op in OPS and OPS[n.op].category == "view"
            tie = (n_all - i) + (n_all if view else 0) + (0 if n in forward else 2 * n_all)
            edges.append(((i, "in"), (i, "out"), (0 if free else nbytes(n)) * scale + tie))
        else:
            edges.append(((i, "in"), (i, "out"), None))
        if n in banned:
            edges.append(("source", (i, "in"), None))
        elif must_recompute(n):
            edges.append(((i, "in"), "sink", None))
        if n in must_have:
            edges.append(((i, "out"), "sink", None))
        for u in users.get(n, ()):
            edges.append(((i, "out"), "sink" if u in bw else (pos[u], "in"), None))
    try:
        side = flow.sink_side(edges, "source", "sink")
    except nx.NetworkXUnbounded:
        stuck = [everything[v[0]] for v in flow.infinite_path(edges, "source", "sink")
                 if isinstance(v, tuple) and v[1] == "in"]
        raise MinicompError("minicomp: partition: a value the backward needs can neither be saved nor recomputed: "
                            + " -> ".join(f"{n.op}:{n.type}" for n in stuck)) from None
    saved = [n for n in everything if n not in bw and (pos[n], "in") not in side and (pos[n], "out") in side]
    # the rest of the backward: values on the sink side that some backward node reaches through them
    needed = {m for m in must_have if (pos[m], "in") in side}  # a gradient that is a constant
    stack = [n for n in everything if n in bw] + list(needed)
    while stack:
        for a in stack.pop().args:
            if a not in bw and a not in needed and (pos[a], "in") in side:
                needed.add(a)
                stack.append(a)
    recomputed = [n for n in everything if n in needed]
    return saved, recomputed


def backward_order(graph: Graph, bw: set, saved, recomputed: set, kernel_ops) -> list:
    """The backward's nodes and recomputed values in the order fusion_order.py gives: each
    recomputed value just before its first user, a torch op reading one after the backward nodes
    that read what it is recomputed from (the scheduler then fuses it with their kernel)."""
    keep = set(saved) | bw | recomputed
    nodes = [n for n in graph.inputs + graph.nodes if n in keep]
    order = fusion_order(nodes, lambda n: n.args if n in bw or n in recomputed else (), recomputed,
                         lambda n: n.op in OPS and runs_in_torch(n, kernel_ops), lambda n: n.op != "input")
    return [n for n in order if n in bw or n in recomputed]


def _backward(graph: Graph, n_fwd: int, saved: list, recomputed: list, kernel_ops) -> tuple[Graph, dict]:
    """The backward graph (inputs: the saved values, then the tangents; outputs: the gradients) and
    {its node: the joint graph's node it copies}."""
    tangents, bw = classify(graph, n_fwd)[:2]
    rec = set(recomputed) - set(saved)
    copies, inputs = {}, []
    for v in list(saved) + [t for t in graph.inputs if t in tangents]:
        name = v.name if v.op == "input" else f"saved_{len(inputs)}"
        copies[v] = Node("input", (), type=v.type, name=name, meta=v.meta)
        inputs.append(copies[v])
    nodes, origin = [], {}
    for n in backward_order(graph, bw, saved, rec, kernel_ops):
        if n in copies:
            continue
        copies[n] = c = Node(n.op, tuple(copies[a] for a in n.args), n.attrs, n.type, n.name, n.meta)
        origin[c] = n
        nodes.append(c)
    outs = [None if o is None else copies[o] for o in graph.outputs[n_fwd:]]
    return Graph(f"{graph.name}_backward", inputs, nodes, outs, graph.constants, graph.sizes, graph.size_inputs), origin


def split(graph: Graph, n_fwd: int, saved: list, recomputed: list, kernel_ops) -> tuple[Graph, Graph]:
    """The forward graph (its outputs, then the saved values) and the backward graph (inputs: the
    saved values, then the tangents; outputs: the gradients). The forward shares the joint graph's
    nodes; the backward is a copy."""
    tangents = classify(graph, n_fwd)[0]
    fw_out = list(graph.outputs[:n_fwd]) + list(saved)
    live = {o for o in fw_out if o is not None}
    for n in reversed(graph.nodes):
        if n in live:
            live.update(n.args)
    fw = Graph(f"{graph.name}_forward", [x for x in graph.inputs if x not in tangents],
               [n for n in graph.nodes if n in live], fw_out, graph.constants, graph.sizes, graph.size_inputs)
    return fw, _backward(graph, n_fwd, saved, recomputed, kernel_ops)[0]


def _lone_kernels(graph: Graph, n_fwd: int, saved, in_backward, kernel_ops, recomputed: set) -> set:
    """Recomputed values that the backward's schedule stores in a kernel of their own (a kernel
    storing nothing but recomputed values): their recomputation did not fuse into the backward."""
    from .fuse import conservative_schedule
    bw_graph, origin = _backward(graph, n_fwd, saved, in_backward, kernel_ops)
    sch, _ = conservative_schedule(bw_graph, kernel_ops)
    lone = set()
    for step in sch.steps:
        if isinstance(step, KernelStep):
            roots = [origin.get(r) for r in step.roots]
            if roots and all(r in recomputed for r in roots):
                lone.update(roots)
    return lone


def _last(lone: set, recomputed: set) -> set:
    """The lone values that feed no other lone value through recomputed values. An earlier one may
    be lone only because a later lone one shares it (an embedding lookup under a norm whose output
    got a kernel): once the later one is saved it may fuse, so it is judged again next round."""
    fed = set()
    for n in lone:
        stack = [a for a in n.args if a in recomputed]
        while stack:
            a = stack.pop()
            if a not in fed:
                fed.add(a)
                stack.extend(b for b in a.args if b in recomputed)
    return {n for n in lone if n not in fed}


def cut(graph: Graph, n_fwd: int, kernel_ops, *, remat: bool = True, budget: Optional[float] = None,
        saveable=lambda n: True, must_save=lambda n: False, must_recompute=lambda n: False,
        group=lambda n: None, names: Callable = lambda n: n.op) -> Cut:
    """The saved set of a joint graph (inputs: primals..., tangents...; outputs: the n_fwd forward
    outputs, then the gradients). `saveable(n)`: n is a value the forward may output (the fx glue
    passes False for nodes inside one torch op's lowering); `group(n)`: nodes recomputed together.
    remat=False saves every forward value the backward uses (views are still taken from their
    base). `budget`: at most that fraction of remat=False's saved bytes."""
    if budget is not None and not 0 < budget <= 1:
        raise ValueError(f"minicomp: remat_budget={budget!r}: want a fraction in (0, 1]")
    sides = classify(graph, n_fwd)

    def make(banned, level, fused):
        saved, rest = min_cut(graph, n_fwd, banned, saveable, must_recompute)
        rounds = 0
        while fused:  # each round bans at least one more value: it ends
            rec = [n for n in rest if n in sides.forward]
            lone = _lone_kernels(graph, n_fwd, saved, rest, kernel_ops, set(rec)) if rec else set()
            if not lone:
                break
            rounds += 1
            if rounds <= FUSION_CHECKS:  # after that, every lone value at once
                lone = _last(lone, set(rec))
            lone_groups = {group(x) for x in lone} - {None}
            more = dict(banned)
            for n in list(lone) + [m for m in graph.nodes if group(m) in lone_groups and m in sides.forward]:
                more.setdefault(n, "its recomputation would need a backward kernel of its own")
            try:
                saved, rest = min_cut(graph, n_fwd, more, saveable, must_recompute)
            except MinicompError:  # a lone value that cannot be saved either: keep the cut before
                break
            banned = more
        return Cut(saved, [n for n in rest if n in sides.forward], [n for n in rest if n not in sides.forward],
                   saved_bytes(saved), banned, level)

    if not remat or budget is not None:
        everything = {n: "remat=False" for n in sides.forward if not (n.op in OPS and OPS[n.op].category == "view")}
        baseline = make(everything, "remat=False", False)
        if not remat:
            return baseline
    best = None
    for level, max_cost, fused, reductions in LEVELS:
        result = make(_bans(graph, sides.forward, kernel_ops, max_cost, reductions, must_save, group), level, fused)
        if best is None or result.saved_bytes < best.saved_bytes:
            best = result
        if budget is None or result.saved_bytes <= budget * baseline.saved_bytes:
            return result
    limit = budget * baseline.saved_bytes
    stuck = sorted((n for n in best.saved if n in best.banned and n.op != "input"),  # inputs cost nothing here
                   key=nbytes, reverse=True)[:4]
    raise MinicompError(
        f"minicomp: remat_budget={budget:g} asks for at most {limit:,.0f} bytes of saved activations "
        f"({budget:.0%} of the {baseline.saved_bytes:,} bytes remat=False saves), but the fewest minicomp can "
        f"save is {best.saved_bytes:,} bytes ({best.saved_bytes / max(1, baseline.saved_bytes):.0%}): "
        "matmul/conv results, extern and random ops and must-save values are never recomputed; the largest "
        "it must keep: " + "; ".join(f"{names(n)} ({nbytes(n):,} B: {best.banned[n]})" for n in stuck))
