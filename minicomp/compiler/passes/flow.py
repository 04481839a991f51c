"""The minimum s-t cut partition.py's min_cut asks for, on networkx.

The flow runs Boykov-Kolmogorov on a residual network built here straight from the edge list, in
the format networkx's flow functions document (networkx.algorithms.flow build_residual_network:
both directions of every edge, the reverse one at capacity 0, an infinite capacity stood for by
R.graph["inf"], three times the sum of the finite ones). Building a DiGraph of the flow network
first and letting networkx derive the residual network from it cost as much again as the flow
itself on an HF GPT-2 joint graph (three cuts per training compile). The cut is networkx's
minimum_cut's: the sink side is every node that reaches the sink through edges the maximum flow
leaves unsaturated.
"""
from __future__ import annotations

import networkx as nx
from networkx.algorithms.flow import boykov_kolmogorov


def _residual(edges: list, source, sink) -> nx.DiGraph:
    cap: dict = {}
    for u, v, c in edges:  # a repeated edge keeps a capacity it was given (DiGraph.add_edge's update)
        if u != v and (c is None or c > 0) and (c is not None or (u, v) not in cap):
            cap[u, v] = c
    inf = 3 * sum(c for c in cap.values() if c is not None) or 1
    R = nx.DiGraph()
    R.add_nodes_from((source, sink))
    R.add_edges_from((u, v, {"capacity": inf if c is None else min(c, inf)}) for (u, v), c in cap.items())
    R.add_edges_from((v, u, {"capacity": 0}) for (u, v) in cap if (v, u) not in cap)
    R.graph["inf"] = inf
    return R


def sink_side(edges: list, source, sink) -> set:
    """The sink side of a minimum `source`-`sink` cut of the flow network `edges`: (u, v, capacity),
    None for an infinite one. Raises networkx.NetworkXUnbounded when infinite edges join the two."""
    R = _residual(edges, source, sink)
    stub = nx.DiGraph()  # the flow reads only the residual network; the graph argument names the ends
    stub.add_nodes_from((source, sink))
    R = boykov_kolmogorov(stub, source, sink, residual=R, value_only=True)
    pred, side, stack = R.pred, {sink}, [sink]
    while stack:
        v = stack.pop()
        for u, e in pred[v].items():
            if u not in side and e["flow"] < e["capacity"]:
                side.add(u)
                stack.append(u)
    return side


def infinite_path(edges: list, source, sink) -> list:
    """The nodes of a `source`-to-`sink` path of infinite edges (what makes a cut impossible), ends
    included, or [] when there is none."""
    succ: dict = {}
    for u, v, c in edges:
        if c is None:
            succ.setdefault(u, []).append(v)
    parent, stack = {source: None}, [source]
    while stack:
        u = stack.pop()
        for v in succ.get(u, ()):
            if v not in parent:
                parent[v] = u
                stack.append(v)
    if sink not in parent:
        return []
    path, v = [], sink
    while v is not None:
        path.append(v)
        v = parent[v]
    return path[::-1]
