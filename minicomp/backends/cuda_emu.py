"""The `cuda_emu` backend: the exact CUDA C of the `cuda` backend, run on the CPU.

The source (cuda.py generate) is compiled for the host with runtime/cuda_emu.h and runs on CPU
tensors: kernel steps are emulated launches, torch steps and the arena are the ordinary Program's.
Launches are capped to small grids and blocks (every CUDA thread is a fiber, one running at a time);
the kernels are grid-stride, so their results do not depend on the launch size. A graph over symbolic sizes builds
its library once, and each call size gets a program instance over it (sized.py), its launches
passing that size's values and grids.
"""
from __future__ import annotations


import time

from . import cuda
from .assemble import assemble
from .sized import sized_program

EMU_MAX_GRID = 2
EMU_MAX_BLOCK = 128
FLOPS_PER_BYTE = cuda.FLOPS_PER_BYTE  # plans fusion as `cuda` does: the same kernels
kernel_ops = cuda.kernel_ops


def build(graph, ctx):
    from ..runtime.cuda_emu import EmuLaunch, EmuModule

    t0 = time.perf_counter()
    kernels, source, launches = cuda.generate(graph, ctx, max_grid=EMU_MAX_GRID, max_block=EMU_MAX_BLOCK)
    module = EmuModule(source, [k.name for k in kernels], cuda.prelude_headers()) if kernels else None
    codegen_s = time.perf_counter() - t0

    def launch(k, slots, values=None):
        lc = launches[k.name]
        grid, sizes = lc.at(values) if values is not None else (lc.grid, ())
        return EmuLaunch(module, k.name, grid, lc.block, lc.shared_bytes, slots, sizes)
    if graph.sizes:
        program, detail = sized_program(graph, ctx, kernels, launch, module)
    else:
        program, detail = assemble(graph, ctx, kernels, launch, module)
    detail.update(strategies=[launches[k.name].strategy for k in kernels], codegen_ms=round(codegen_s * 1e3, 1))
    return program, detail
