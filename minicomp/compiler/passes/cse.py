"""Common-subexpression elimination.

Assumes: nodes are in topological order. Guarantees: no two non-extern nodes have the same op,
operands and attributes (externs are left alone: one of them may draw random numbers).
"""
from __future__ import annotations

from ...ir import Graph
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
    graph.replace_uses(replace)
    return graph
