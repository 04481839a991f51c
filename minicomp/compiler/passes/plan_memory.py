"""Memory planning: the arena layout of a fused graph's intermediates (backends/arena.py).

A graph over symbolic sizes gets no offsets here: each size it runs at is planned on its own
concrete copy (backends/sized.py), with the same planner.
"""
from __future__ import annotations

from ...backends import arena
from ...ir import Graph


def run(graph: Graph, ctx) -> Graph:
    ctx.arena_bytes = 0 if graph.sizes else arena.plan(graph)
    return graph
