"""Dead-code elimination.

Assumes: the graph is functional (no op has a side effect; externs come from functionalized ATen).
Guarantees: every remaining node is used by an output, directly or transitively.
"""
from __future__ import annotations

from ...ir import Graph


def run(graph: Graph, ctx=None) -> Graph:
    live = {o for o in graph.outputs if o is not None}
    for n in reversed(graph.nodes):
        if n in live:
            live.update(n.args)
    graph.nodes = [n for n in graph.nodes if n in live]
    return graph
