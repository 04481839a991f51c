"""View simplification: chains of views collapse, and views (or casts) that change nothing vanish.

Assumes: view ops are pure index math. Guarantees: no reshape of a reshape, no permute of a
permute, no identity reshape/permute/expand/slice/cast; types of all results are unchanged.
"""
from __future__ import annotations

from ...ir import Graph


def _is_noop(n) -> bool:
    if n.op in ("reshape", "expand", "permute", "slice", "cast"):
        return n.type == n.args[0].type and (n.op != "permute" or list(n.attrs["dims"]) == sorted(n.attrs["dims"]))
    return False


def run(graph: Graph, ctx=None) -> Graph:
    replace = {}
    for n in graph.nodes:
        n.args = tuple(replace.get(a, a) for a in n.args)
        if _is_noop(n):
            replace[n] = n.args[0]
            continue
        src = n.args[0] if n.args else None
        if n.op == "reshape" and src.op == "reshape":
            n.args = src.args
        elif n.op == "permute" and src.op == "permute":
            inner = src.attrs["dims"]
            n.attrs = {"dims": tuple(inner[d] for d in n.attrs["dims"])}
            n.args = src.args
            if list(n.attrs["dims"]) == list(range(len(n.attrs["dims"]))):
                replace[n] = n.args[0]
        elif n.op == "expand" and src.op == "expand":
            n.args = src.args
        if n.op == "reshape" and n.type == n.args[0].type:
            replace[n] = n.args[0]
    graph.replace_uses(replace)
    return graph
