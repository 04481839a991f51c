"""The one ordered list of graph passes, and the driver that runs them with verification and dumps."""
from __future__ import annotations

from ..ir import Graph, verify
from .passes import cse, dce, fold_constants, simplify_views

PASSES = [
    ("simplify_views", simplify_views.run),
    ("fold_constants", fold_constants.run),
    ("cse", cse.run),
    ("dce", dce.run),
]


def run_passes(graph: Graph, ctx) -> Graph:
    """ctx: has .options (verify flag) and .dump (a Dumper); passes may read more from it."""
    for name, fn in PASSES:
        graph = fn(graph, ctx)
        if ctx.options.verify:
            verify(graph)
        ctx.dump.stage(f"ir_after_{name}", str(graph))
    return graph
