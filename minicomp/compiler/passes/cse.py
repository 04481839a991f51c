"""Common-subexpression elimination.

Assumes: nodes are in topological order. Guarantees: no two non-extern nodes have the same op,
operands and attributes (externs are left alone: one of them may draw random numbers), and graph
outputs that were different nodes stay different tensors: where two merge ((x + 1, x + 1)), the later
output is a `copy` of the first (eager's two results do not share memory; one returned twice does).
"""
from __future__ import annotations

from ...ir import Graph, Node
from ...ir.printer import format_attrs


def run(graph: Graph, ctx=None) -> Graph:
    seen: dict = {}
    replace: dict = {}
    kept = []
    for n in graph.nodes:
        n.args = tuple(replace.get(a, a) for a in n.args)
        if n.op == "extern":
            kept.append(n)
            continue
        key = (n.op, tuple(id(a) for a in n.args), format_attrs(n.attrs), str(n.type))
        if key in seen:
            replace[n] = seen[key]
        else:
            seen[key] = n
            kept.append(n)
    graph.nodes = kept
    before = list(graph.outputs)
    graph.replace_uses(replace)
    firsts: dict = {}
    for i, (old, new) in enumerate(zip(before, graph.outputs)):
        if new is None:
            continue
        first = firsts.setdefault(id(new), (i, old))
        if first[0] != i and first[1] is not old:  # two outputs merged into one node
            graph.outputs[i] = Node("copy", (new,), {}, new.type, meta=dict(new.meta))
            graph.nodes.append(graph.outputs[i])
    return graph
