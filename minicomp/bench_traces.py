"""The traces under every compile the benchmark times: Dynamo's, and AOTAutograd's with nothing
compiled (`trace_only`), which both minicomp and Inductor run before their own work.

A process pays first-use costs in these traces: Dynamo's source-line index of each file it traces,
and each op's first meta kernel and decomposition run in AOTAutograd (0.1-0.4 s for an HF model's
first trace). Whichever compiler traces a case first pays them, so the benchmark runs
`warm_traces` before its cold compiles: untimed traces that pay them for both compilers, each
with its own decomposition table. What stays in the cold columns is each compiler's own work:
AOTAutograd's trace proper, lowering, passes and code generation. Each timed compile starts
after a full collection of the cycle collector (`collect`).

A cold compile is one sample of a noisy figure (+-0.3 s on a 3 s GPT-2 training compile here), so
the benchmark times several and shows the median; each runs inside `cold_caches`: empty disk caches
of its own for both compilers and none of their in-memory ones, as in a new process on a new machine.
"""
from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile

import torch


def inductor_decompositions() -> dict:
    """The decompositions Inductor has AOTAutograd apply."""
    from torch._inductor.decomposition import select_decomp_table
    return select_decomp_table()


def trace_only(decompositions: dict | None = None):
    """A Dynamo backend that runs AOTAutograd (with the decompositions minicomp gives each graph,
    unless others are given) and compiles nothing: Dynamo's and AOTAutograd's traces, the part of a
    cold compile that is torch's."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from minicomp.compiler.decompositions import aot_backend
    keep = lambda gm, _: make_boxed_func(gm)  # noqa: E731
    compilers = dict(fw_compiler=keep, bw_compiler=keep, inference_compiler=keep)
    if decompositions is None:
        return aot_backend(**compilers)
    return aot_autograd(decompositions=decompositions, **compilers)


def warm_traces(step) -> None:
    """Run `step(backend)` untimed with Dynamo's eager backend and with AOTAutograd under each
    compiler's decompositions (see the module note), each from a reset; a trace that fails is skipped."""
    for backend in ("eager", trace_only(), trace_only(inductor_decompositions())):
        torch._dynamo.reset()
        try:
            step(backend)
        except Exception:  # an op one table cannot trace: the compiler that uses it pays its own first use
            pass
    torch._dynamo.reset()


@contextlib.contextmanager
def cold_caches():
    """A cold compile inside: minicomp's and Inductor's disk caches point at new empty folders
    (removed after), and the graphs each keeps in memory are dropped (minicomp's Built graphs,
    Inductor's loaded code and its graph caches). Dynamo's caches are the caller's to reset."""
    from minicomp.compiler.capture import forget_built
    root = tempfile.mkdtemp(prefix="minicomp-cold-")
    before = os.environ.get("MINICOMP_CACHE_DIR")
    os.environ["MINICOMP_CACHE_DIR"] = os.path.join(root, "minicomp")
    forget_built()
    try:
        with _fresh_inductor_cache(root):
            yield
    finally:
        if before is None:
            os.environ.pop("MINICOMP_CACHE_DIR", None)
        else:
            os.environ["MINICOMP_CACHE_DIR"] = before
        shutil.rmtree(root, ignore_errors=True)


def _fresh_inductor_cache(root: str):
    """Inductor's own context for this: a new TORCHINDUCTOR_CACHE_DIR, its in-memory caches cleared
    (named fresh_inductor_cache before torch 2.8)."""
    from torch._inductor import utils
    fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache
    return fresh(dir=root)


def collect() -> None:
    """A full collection of the cycle collector, before each timed compile of either compiler. A
    full collection of a heap holding a few models takes 0.2-0.5 s here, and one that lands inside a
    compile (Dynamo's trace allocates a lot) added that to whichever compiler it hit; after a full
    collection the next waits until the long-lived objects grew by a quarter (CPython's rule)."""
    gc.collect()


def compile_parts(report) -> tuple[float, float]:
    """(minicomp's own seconds in a compile, LLVM's seconds) from a compiled function's report: every
    graph's compile (lowering, passes, code generation) and every training cut, and what the first
    calls waited for LLVM (`llvm_wait`); the graphs' `llvm_jit` phases (O3, machine code and loading,
    in the workers and on a thread of this process: after code generation, partly while Dynamo and
    AOTAutograd finish, so only `llvm_wait` of it is in own)."""
    own = sum(g.compile_s + g.phases_ms.get("llvm_wait", 0.0) / 1e3 for g in report.graphs)
    own += sum(p.seconds for p in report.partitions)
    return own, sum(g.phases_ms.get("llvm_jit", 0.0) for g in report.graphs) / 1e3
