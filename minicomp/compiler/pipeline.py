"""The one ordered list of graph passes, and the driver that runs them with verification and dumps.

The last four only act for backends that generate kernels (ctx.kernel_ops is not None); for
`interpret` the graph stays at the tensor level.
"""
from __future__ import annotations

from ..ir import Graph, round_trip, verify
from .passes import cse, dce, fold_constants, fuse, plan_memory, rematerialize, simplify_views, split_reductions

PASSES = [
    ("simplify_views", simplify_views.run),
    ("fold_constants", fold_constants.run),
    ("cse", cse.run),
    ("dce", dce.run),
    ("split_reductions", split_reductions.run),
    ("fuse", fuse.run),
    ("rematerialize", rematerialize.run),
    ("plan_memory", plan_memory.run),
]


def run_passes(graph: Graph, ctx) -> Graph:
    """ctx: has .options (verify flag) and .dump (a Dumper); passes may read more from it."""
    for name, fn in PASSES:
        graph = fn(graph, ctx)
        if ctx.options.verify:
            round_trip(verify(graph))
        ctx.dump.stage(f"ir_after_{name}", graph.__str__)
    if ctx.options.profile and getattr(ctx, "schedule", None) is not None:  # explain() lists what did not fuse
        ctx.report.refusals += [f"{ctx.name}: {p} -> {c}: {pop} -> {cop}: {why}"
                                for p, c, pop, cop, why in fuse.refusals(ctx.source_graph, ctx.schedule)]
    return graph
