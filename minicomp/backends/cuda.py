"""The `cuda` backend: fused graph -> CUDA C (codegen/cuda.py) -> NVRTC -> pycuda -> Program.

The source is compiled with NVRTC for the device's exact architecture and launched with pycuda
(runtime/cuda.py), the whole program replayed as a CUDA Graph (runtime/cuda_graph.py). `cuda_emu`
(cuda_emu.py) builds the same source through `generate` here, so the two run one text. A graph over
symbolic sizes is compiled once; each call size gets a program instance over the one module
(sized.py), its launches passing that size's values and grid, replayed as a CUDA Graph of its own.
"""
from __future__ import annotations

import copy
import os
import time

from .. import options
from ..ir import sym
from .assemble import assemble, check_devices
from .layout import free_layout_inputs
from .sized import sized_program

FLOPS_PER_BYTE = 40.0  # the machine balance the fusion cost model plans for
DEFAULT_SM_COUNT = 132  # an H200, when there is no device to ask


def kernel_ops():
    """The ops the CUDA code generator has (cuda_emu's too)."""
    from ..codegen.cuda_ops import SUPPORTED_OPS
    return SUPPORTED_OPS


def sm_count() -> int:
    """Streaming multiprocessors launch sizes are planned for: MINICOMP_SM_COUNT if set, else the
    current GPU's, else an H200's."""
    import torch
    override = options.sm_count()
    if override is not None:
        return override
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return DEFAULT_SM_COUNT


def prelude_headers() -> dict:
    """The files generated sources include, by the name they include them under."""
    from ..codegen import cuda
    with open(os.path.join(os.path.dirname(cuda.__file__), cuda.PRELUDE)) as f:
        return {cuda.PRELUDE: f.read()}


def generate(graph, ctx, **caps):
    """(kernels, CUDA source, {kernel name: its launch}) of a fused graph; `caps` limit grids and blocks."""
    from ..codegen.collapse import collapse
    from ..codegen.cuda import generate as generate_source
    from ..ir.kernel import format_kernel
    kernels = [n.meta["kernel"] for n in graph.nodes if n.op == "kernel"]
    source, launches = generate_source(kernels, sm_count=sm_count(), **caps)
    ctx.dump.stage("kernels", lambda: "\n".join(format_kernel(collapse(k)) for k in kernels), level=3)
    ctx.dump.stage("cuda", source, level=4)
    return kernels, source, {launch.name: launch for launch in launches}


def on_device(graph, device):
    """`graph` with its tensor constants on `device`: a CPU `torch.tensor(2.0)` captured into a CUDA
    program would be read by kernels as a host pointer. A shallow copy; the graph is not changed."""
    moved = {name: t.to(device) for name, t in graph.constants.items()}
    if all(moved[n] is t for n, t in graph.constants.items()):
        return graph
    graph = copy.copy(graph)
    graph.constants = moved
    return graph


def build(graph, ctx):
    """NVRTC -> CUBIN -> pycuda, on the device of the program's inputs, not the current one: what
    depends on the device (the binary for its architecture and driver, the loaded module, constants
    moved there, the arena) is made at the first call, when the inputs say which device that is
    (runtime/cuda.py CudaRunner; a compile runs right before its first call anyway). The whole
    program is replayed as a CUDA Graph unless cuda_graphs=False."""
    from ..runtime import cubin, nvrtc
    from ..runtime import cuda as runtime
    from ..runtime.cuda import CudaLaunch, CudaModule, CudaRunner
    from ..runtime.cuda_graph import GraphReplay

    t0 = time.perf_counter()
    sized, env = bool(graph.sizes), sym.current()
    kernels, source, launches = generate(graph, ctx)
    names = [k.name for k in kernels]
    detail = {"kernels": len(kernels), "arena_bytes": ctx.arena_bytes, "remat_bytes_saved": ctx.remat_bytes_saved,
              "strategies": [launches[n].strategy for n in names],
              "codegen_ms": round((time.perf_counter() - t0) * 1e3, 1), "cuda_graphs": ctx.options.cuda_graphs}
    if sized:  # planned per call size: sized.py reports the arena at the hints
        del detail["arena_bytes"]

    def bind(where, dev, inputs):
        binary = nvrtc.compile(source, dev.arch, prelude_headers(), driver=dev.driver_version) if kernels else None
        if binary is not None and binary.kind == "cubin":  # a block that cannot launch: say which, before capture
            cubin.check(binary.data, [launches[n] for n in names], dev.arch)
        module = CudaModule(dev, binary.data, names) if kernels else None

        def launch(k, slots, values=None):
            lc = launches[k.name]
            grid, sizes = lc.at(values) if values is not None else (lc.grid, ())
            return CudaLaunch(module, k.name, grid, lc.block, lc.shared_bytes, slots, sizes)
        if sized:  # a CUDA Graph per instance: each is a static program
            wrap = (lambda p: GraphReplay(p, dev.torch_stream, detail, api=runtime.tc)) if ctx.options.cuda_graphs else None
            with sym.using(env):  # bound at the first call, outside build's SymEnv: the same one again
                program, more = sized_program(on_device(graph, where), ctx, kernels, launch, module, str(where), wrap)
        else:
            program, more = assemble(on_device(graph, where), ctx, kernels, launch, module, device=str(where))
        free = free_layout_inputs(graph)
        read = [i for i, x in enumerate(graph.inputs) if x not in free]  # what the kernels read
        check_devices(ctx.name, [(f"input {i}", inputs[i]) for i in read], where, "kernels read it")
        detail.update(more, binary=binary.kind if binary else None, device=str(where))
        return program
    return CudaRunner(bind, detail, ctx.options.cuda_graphs and not sized, ctx.arena_bytes), detail
