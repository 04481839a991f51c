"""The CUDA backends' construction: fused graph -> CUDA C (codegen/cuda.py) -> a runtime Program.

`cuda_emu` builds the exact source the `cuda` backend gives NVRTC, compiles it for the host with
runtime/cuda_emu.h, and runs it on CPU tensors: kernel steps are emulated launches, torch steps and
the arena are runtime/cpu.py's. Launches are capped to small grids and blocks (every CUDA thread is
an OS thread); the kernels are grid-stride, so their results do not depend on the launch size.
"""
from __future__ import annotations

import os
import time

from ..ir import DTYPES
from ..report import KernelReport

EMU_MAX_GRID = 2
EMU_MAX_BLOCK = 128
DEFAULT_SM_COUNT = 132  # an H200, when there is no device to ask


def sm_count() -> int:
    """Streaming multiprocessors of the current GPU (launch sizes follow it); an H200's without one."""
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return DEFAULT_SM_COUNT


def prelude_headers() -> dict:
    """The files generated sources include, by the name they include them under."""
    from ..codegen import cuda
    with open(os.path.join(os.path.dirname(cuda.__file__), cuda.PRELUDE)) as f:
        return {cuda.PRELUDE: f.read()}


def build_cuda_emu(graph, ctx):
    from ..codegen.collapse import collapse
    from ..codegen.cuda import generate
    from ..ir.kernel import format_kernel
    from ..runtime.cpu import Program, TorchCall
    from ..runtime.cuda_emu import EmuLaunch, EmuModule
    from .backends import _step_reports, _timed, _torch_fn

    knodes = [n for n in graph.nodes if n.op == "kernel"]
    kernels = [n.meta["kernel"] for n in knodes]
    t0 = time.perf_counter()
    source, launches = generate(kernels, sm_count=sm_count(), max_grid=EMU_MAX_GRID, max_block=EMU_MAX_BLOCK)
    ctx.dump.stage("kernels", "\n".join(format_kernel(collapse(k)) for k in kernels), level=3)
    ctx.dump.stage("cuda", source, level=4)
    module = EmuModule(source, [k.name for k in kernels], prelude_headers()) if knodes else None
    codegen_s = time.perf_counter() - t0

    slot = {n: i for i, n in enumerate(graph.inputs)}
    constants = [n for n in graph.nodes if n.op == "constant"]
    for n in constants:
        slot[n] = len(slot)
    for n in graph.nodes:
        if n not in slot:
            slot[n] = len(slot)
    kernel_inputs = {a for kn in knodes for a in kn.args}  # kernels read contiguous buffers
    results: dict = {}
    for n in graph.nodes:
        if n.op == "getitem" and n.args[0].op == "kernel":
            results.setdefault(n.args[0], {})[n.attrs["index"]] = n
    outputs = set(o for o in graph.outputs if o is not None)
    buffers, reports = [], []
    for n, k, launch in zip(knodes, kernels, launches):
        outs = results.get(n, {})
        slots = [slot[n.args[j]] if kind == "arg" else slot[outs[j]] for kind, j in n.meta["io"]]
        n.meta["launch"] = EmuLaunch(module, k.name, launch.grid, launch.block, launch.shared_bytes, slots)
        reports.append(KernelReport(k.name, ctx.name, list(k.ops), k.bytes_read, k.bytes_written, k.flops))
        for j, g in outs.items():
            buffers.append((slot[g], g.type.shape, DTYPES[g.type.dtype],
                            None if g in outputs else g.meta["arena_offset"]))
    steps = []
    for n in graph.nodes:
        if n.op in ("constant", "input") or (n.op == "getitem" and n.args[0].op == "kernel"):
            continue
        if n.op == "kernel":
            steps.append(n.meta["launch"])
        else:
            steps.append(TorchCall(_torch_fn(n), [slot[a] for a in n.args], slot[n], n in kernel_inputs))
    if os.environ.get("MINICOMP_PROFILE") == "1":
        steps = [_timed(s, r) for s, r in zip(steps, _step_reports(graph, reports))]
    program = Program(len(graph.inputs), [graph.constants[c.attrs["name"]] for c in constants], steps, buffers,
                      [None if o is None else slot[o] for o in graph.outputs], ctx.arena_bytes, len(slot))
    program.module = module  # the loaded kernels live as long as the program
    ctx.report.kernels.extend(reports)
    detail = {"kernels": len(knodes), "torch_ops": sum(not isinstance(s, EmuLaunch) for s in steps),
              "arena_bytes": ctx.arena_bytes, "remat_bytes_saved": ctx.remat_bytes_saved,
              "strategies": [launch.strategy for launch in launches], "codegen_ms": round(codegen_s * 1e3, 1)}
    return program, detail
