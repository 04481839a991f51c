"""The ordered pass lists, one per kind of backend, and the driver that runs them with verification
and dumps. What is listed here is exactly what runs.

`interpret` runs the tensor-level graph op by op, so it gets the tensor passes only; a backend with
kernels (cpu, cuda, cuda_emu) also puts CPU convolutions, their backward and the pointwise ops
around them in channels-last (their input is a buffer its kernels write in that order), splits
large reductions, moves a matmul operand's transpose outside the reshape a kernel writes
(orient_operands), fuses (rematerialization included: one stage, whose result is the fused graph)
and plans the arena.
"""
from __future__ import annotations

import contextlib
import gc
import time

from ..ir import Graph, round_trip, sym, verify
from .passes import (channels_last, cse, dce, fold_constants, fuse, orient_operands, plan_memory, simplify_views,
                     split_reductions)

TENSOR_PASSES = [
    ("simplify_views", simplify_views.run),
    ("fold_constants", fold_constants.run),
    ("cse", cse.run),
    ("dce", dce.run),
]
KERNEL_PASSES = TENSOR_PASSES + [
    ("channels_last", channels_last.run),
    ("split_reductions", split_reductions.run),
    ("orient_operands", orient_operands.run),
    ("fuse", fuse.run),
    ("plan_memory", plan_memory.run),
]


def passes(ctx) -> list:
    """The pass list for ctx's backend: tensor passes without kernel ops, kernel passes with them."""
    return TENSOR_PASSES if ctx.kernel_ops is None else KERNEL_PASSES


def run_passes(graph: Graph, ctx) -> Graph:
    """ctx: has .options (verify flag), .dump (a Dumper) and .kernel_ops; passes may read more from it.
    Each pass's milliseconds (verification included) go to ctx.phases_ms where ctx has one."""
    with sym.scope(graph.sizes):
        return _run(graph, ctx)


def _run(graph: Graph, ctx) -> Graph:
    times = getattr(ctx, "phases_ms", {})
    for name, fn in passes(ctx):
        t0 = time.perf_counter()
        graph = fn(graph, ctx)
        if ctx.options.verify:
            round_trip(verify(graph))
        ctx.dump.stage(f"ir_after_{name}", graph.__str__)
        times[name] = round((time.perf_counter() - t0) * 1e3, 1)
    return graph


@contextlib.contextmanager
def gc_paused():
    """Python's cycle collector off while a compile step runs: a compile allocates many small objects,
    and each full collection walks everything Dynamo and AOTAutograd keep alive (0.3 s with HF
    GPT-2 loaded; four GPT blocks' training forward spent most of its 270 ms of LLVM IR generation
    in collections). Nothing a compile builds is garbage in a cycle it must free meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
