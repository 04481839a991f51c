"""The `cpu` backend: fused graph -> LLVM IR (codegen/llvm.py) -> machine code (llvmlite, runtime/llvm_jit.py)
-> Program of kernel launches (runtime/cpu.py).

One LLVM module holds every kernel of a graph, or, for a graph with enough distinct kernel bodies,
several of about equal work that compile side by side on the machine's cores (runtime/jit_pool.py).
How each kernel runs (one call over its whole outer range, chunks on torch's OpenMP team, or chunks
on our pool) is decided here, when compiling, from its size and the machine's threads; the modules'
text depends on it, so the text a built graph keeps (ctx.artifacts) is keyed by what those
decisions read (and by how many modules it was split into).
"""
from __future__ import annotations


import math
import time

from .assemble import assemble
from .copies import TensorCopy, strided_copy
from .sized import sized_program

FLOPS_PER_BYTE = 4.0  # the machine balance the fusion cost model plans for


def kernel_ops():
    """The ops the LLVM code generator has."""
    from ..codegen.llvm_ops import SUPPORTED_OPS
    return SUPPORTED_OPS


def kernel_text(k) -> str:
    """A kernel's dump, with the loop nests the CPU code generator splits it into (codegen/pieces.py)
    or how it runs a reduction down columns."""
    from ..codegen.columns import COLUMN_TILE, columns
    from ..codegen.pieces import split
    from ..ir.kernel import format_kernel
    pieces = split(k)
    if not pieces:
        if columns(k):
            return format_kernel(k) + (f"  runs down the columns: {k.outer[-1].name} in tiles of {COLUMN_TILE} "
                                       "columns, an accumulator each, the reduction loops around the tile's loop\n")
        return format_kernel(k)
    head = f"  runs as {len(pieces)} loop nests, one per range of {k.outer[pieces[0].pos].name}:\n"
    return format_kernel(k) + head + "".join(
        f"  [{p.lo}, {p.hi}):\n" + "".join("  " + ln + "\n" for ln in format_kernel(p.kernel).splitlines()[4:])
        for p in pieces)


def prepare():
    from ..runtime import cpu, jit_pool
    jit_pool.prestart()
    cpu.warm_up()


def build(graph, ctx):
    from ..codegen import llvm_module
    from ..ir.kernel import check_sites, outer_extent
    from ..runtime import cpu, jit_pool, llvm_jit
    from ..runtime.cpu import KernelLaunch
    from ..runtime.llvm_jit import JitModule

    def mode(k):  # of a collapsed kernel
        return cpu.launch_mode(math.prod(v.size for v in k.outer + k.inner), outer_extent(k))

    knodes = [n for n in graph.nodes if n.op == "kernel"]
    t0 = time.perf_counter()
    phases = ctx.phases_ms
    sized = bool(graph.sizes)  # symbolic sizes: launch modes are decided per call size (sized.py)
    parts = 1 + jit_pool.workers()
    # what launch modes and the split depend on
    key = ("llvm", cpu.threads(), cpu.openmp(), cpu.PARALLEL_MIN_WORK, sized, parts)
    jobs: dict = {}  # modules that start compiling (a worker, a thread) while the next is generated

    def early(i, text):
        # module 0, generated last, compiles on the thread JitModule starts just after: a thread of
        # its own cost a second start, which waits 0.1-4 ms for a core while the others compile
        if i:
            jobs[i] = llvm_jit.start_compile(text)
    if key not in ctx.artifacts:  # a Built graph (capture.py) carries its modules from the first compile
        ks = [n.meta["kernel"] for n in knodes]
        # kernels run as torch's copy_ (copies.py), by name
        copies = {} if sized else {k.name: c for k, c in zip(ks, map(strided_copy, ks)) if c is not None}
        # no graph name in the modules: stable cache keys
        rest = [k for k in ks if k.name not in copies]
        texts, compiled = llvm_module.generate_modules(rest, parts, whole=lambda k: mode(k) == "whole", sized=sized,
                                                       min_bodies=jit_pool.MIN_BODIES_PER_MODULE,
                                                       on_text=early) if rest else ([], [])
        compiled = iter(compiled)
        ctx.artifacts[key] = texts, [k if k.name in copies else next(compiled) for k in ks], copies
        phases["llvm_ir"] = _ms(time.perf_counter() - t0)
    texts, kernels, copies = ctx.artifacts[key]
    text = "\n".join(texts)
    ctx.dump.stage("kernels", lambda: "\n".join(kernel_text(k) for k in kernels), level=3)
    ctx.dump.stage("llvm", text if len(texts) == 1 else "".join(  # each module's text whole, after its own header
        f"; ---- module {i + 1} of {len(texts)} (compiled side by side, runtime/jit_pool.py) ----\n{t}\n"
        for i, t in enumerate(texts)), level=4)
    # the program comes back while LLVM works (on workers and a thread): the Dynamo and AOTAutograd
    # steps after a backend returns overlap it, and the first call binds the kernels (waiting for
    # the rest of it). A program over symbolic sizes binds its first instance now.
    jit = JitModule(texts, jobs, wait=sized) if len(knodes) > len(copies) else None
    codegen_s = time.perf_counter() - t0

    def launch(k, slots):
        if k.name in copies:
            return TensorCopy(slots, copies[k.name])
        return KernelLaunch(jit.address(k.name), slots, outer_extent(k), k.name, mode(k), tuple(check_sites(k)))

    def bind(steps):  # the program's first call
        jit.wait()
        phases["llvm_jit"], phases["llvm_wait"] = _ms(jit.seconds), _ms(jit.waited)
        for g in ctx.report.graphs:  # written when build returned: what the workers did is known now
            if g.name == ctx.name:
                g.detail["llvm_in_workers"] = jit.in_workers
        return [launch(*s.args) if isinstance(s, _Unbound) else s for s in steps]
    t2 = time.perf_counter()
    if sized:
        program, detail = sized_program(graph, ctx, kernels, _sized_launch(jit), jit)
        if jit is not None:
            phases["llvm_jit"] = _ms(jit.seconds)
    else:
        program, detail = assemble(graph, ctx, kernels, lambda k, slots: launch(k, slots) if jit is None or
                                   k.name in copies else _Unbound(k, slots), jit)
        if jit is not None:
            program.bind = bind
    phases["assemble"] = _ms(time.perf_counter() - t2)
    detail.update(llvm_cached=bool(jit and jit.cached), codegen_ms=_ms(codegen_s),
                  llvm_bodies=len(llvm_module.BODY_DEFINITION.findall(text)), llvm_modules=len(texts),
                  torch_copies=len(copies),
                  llvm_in_workers=jit.in_workers if jit else 0)
    return program, detail


class _Unbound:
    """A kernel's step until the program's first call binds it (Program.bind): its launch needs
    the machine code's addresses."""

    def __init__(self, *args):
        self.args = args


def _sized_launch(jit):
    """make_launch(kernel, slots, values) for a program over symbolic sizes: every launch has a
    table of its own (instances of several sizes run the same machine code), the symbols' values in
    an array it points to, and runs whole or on the OpenMP team as the size at hand calls for."""
    import ctypes

    from ..ir.kernel import check_sites, outer_extent
    from ..ir import sym
    from ..ir.kernel import kernel_symbols
    from ..runtime import cpu
    from ..runtime.cpu import KernelLaunch

    def launch(k, slots, values):
        ext = sym.evaluate(outer_extent(k), values)
        work = math.prod(sym.evaluate(v.size, values) for v in k.outer + k.inner)
        names = kernel_symbols(k)
        sizes = (ctypes.c_int64 * len(names))(*[values[s] for s in names]) if names else None
        return KernelLaunch(jit.address(k.name), slots, ext, k.name, cpu.launch_mode(work, ext),
                            tuple(check_sites(k)), sizes)
    return launch


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)
