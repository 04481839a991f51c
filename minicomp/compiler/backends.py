"""Backend choice and construction: IR graph -> callable. Each backend's pieces live in codegen/
and runtime/; this is the only place that knows the list."""
from __future__ import annotations

import math
import time

from ..errors import MinicompError
from ..ir import OPS, DTYPES, TensorType, prepare
from ..ir.kernel import describe
from ..report import KernelReport, StepReport

FLOPS_PER_BYTE = {"cpu": 4.0, "cuda": 40.0, "cuda_emu": 40.0}


def cuda_ready() -> bool:
    """A GPU and the [cuda] extras (pycuda, NVRTC) are both here."""
    import importlib.util

    import torch
    return torch.cuda.is_available() and all(importlib.util.find_spec(m) for m in ("pycuda", "cuda.bindings"))


def resolve_backend(name: str, device: str = "cpu") -> str:
    """`auto` follows the inputs: `cuda` for CUDA tensors (with the extras), else `cpu`."""
    if name == "auto":  # CUDA tensors without the extras still run correctly, through torch
        name = ("cuda" if cuda_ready() else "interpret") if device == "cuda" else "cpu"
    if name == "cuda" and not cuda_ready():
        raise MinicompError("minicomp: backend 'cuda' needs an NVIDIA GPU and the [cuda] extras "
                            "(pip install -e '.[cuda]'); use 'cpu' or 'cuda_emu'")
    if name in ("cpu", "cuda_emu") and device != "cpu":
        raise MinicompError(f"minicomp: backend {name!r} runs on CPU tensors, got {device} tensors; "
                            "use backend='cuda' or 'auto'")
    return name


def kernel_ops(backend: str):
    """(ops the backend's code generator has, its flops-per-byte balance); (None, 0) without kernels."""
    if backend == "cpu":
        from ..codegen.llvm_ops import SUPPORTED_OPS
        return SUPPORTED_OPS, FLOPS_PER_BYTE["cpu"]
    if backend in ("cuda", "cuda_emu"):
        from ..codegen.cuda_ops import SUPPORTED_OPS
        return SUPPORTED_OPS, FLOPS_PER_BYTE[backend]
    return None, 0.0


def build(graph, ctx, backend: str):
    """Returns (run(*inputs) -> list of outputs, detail dict for the report)."""
    if backend == "interpret":
        return prepare(graph), {}
    if backend == "cpu":
        return build_cpu(graph, ctx)
    if backend == "cuda_emu":
        from .backend_cuda import build_cuda_emu
        return build_cuda_emu(graph, ctx)
    if backend == "cuda":
        from .backend_cuda import build_cuda
        return build_cuda(graph, ctx)
    raise ValueError(f"unknown backend {backend!r}")


def _torch_fn(node, device):
    ref, attrs = OPS[node.op].ref, node.attrs
    if node.op == "getitem":
        i = attrs["index"]
        return lambda t: t[i]
    return lambda *xs: ref(list(xs), attrs, device)


def free_layout_inputs(graph) -> set:
    """Inputs no kernel reads, directly or through views: torch ops take them in the layout they come
    in (a transposed weight AOTAutograd saved for the backward goes to mm as it is, not copied)."""
    users = graph.users()
    free = set()
    for x in graph.inputs:
        stack, ok = [x], True
        while stack and ok:
            for u in users.get(stack.pop(), ()):
                if u.op == "kernel":
                    ok = False
                    break
                if u.op in OPS and OPS[u.op].category == "view":
                    stack.append(u)
        if ok:
            free.add(x)
    return free


def static_views(graph, kernel_inputs, free=frozenset()) -> dict:
    """{view node: (root node, size, stride, offset)} for the views whose layout is known when compiling.

    Roots have a known contiguous layout at run time: inputs and constants (Program makes them
    contiguous; not the `free` inputs, whose views run in torch), kernel results, mm and bmm results, and torch results that kernels read (made
    contiguous). A chain of views (reshape, permute, expand, slice) from a root is then one
    `as_strided` of the root, computed here by running the ops on meta tensors -- a gpt block has
    twenty of them between its matmuls, each a few microseconds through the dispatcher. A reshape
    that must copy ends the chain (it stays a torch op), and so does a view a kernel reads that is
    not contiguous."""
    from .schedule import CONTIGUOUS_TORCH_OPS, meta_of
    meta: dict = {}   # node -> (root node, meta tensor of the node, meta tensor of the root)
    out = {}

    def root(n):
        t = meta_of(n)
        meta[n] = (n, t, t)
    for n in graph.inputs:
        if n not in free:
            root(n)
    for n in graph.nodes:
        if n.op == "constant" or (n.op == "getitem" and n.args[0].op == "kernel"):
            root(n)
        elif OPS[n.op].category == "view" and n.args and n.args[0] in meta:
            r, base_meta, root_meta = meta[n.args[0]]
            t = OPS[n.op].ref([base_meta], n.attrs, "meta")
            if t._is_view() and t._base is root_meta and (n not in kernel_inputs or t.is_contiguous()):
                meta[n] = (r, t, root_meta)
                out[n] = (r, tuple(t.shape), t.stride(), t.storage_offset())
            elif n in kernel_inputs or t.is_contiguous() and not t._is_view():  # made contiguous, or copied
                root(n)
        elif isinstance(n.type, TensorType) and (n in kernel_inputs or n.op in CONTIGUOUS_TORCH_OPS):
            root(n)  # a torch result made contiguous, or a new matmul result (always contiguous)
    return out


def check_devices(graph_name: str, items, device, why: str = "the program reads it there") -> None:
    """Refuse a tensor (name, tensor) that is not on the program's `device`, naming it: a kernel
    given another device's pointer reads garbage or faults."""
    import torch
    want = torch.device(device)
    for name, t in items:
        d = t.device if isinstance(t, torch.Tensor) else None
        if d is not None and (d.type != want.type or None not in (d.index, want.index) and d.index != want.index):
            raise MinicompError(f"minicomp: {graph_name}: {name} ({tuple(t.shape)}, {t.dtype}) is on {d}, but the "
                                f"program runs on {want} and {why}")


def assemble(graph, ctx, kernels, make_launch, keepalive, device="cpu"):
    """A fused graph's Program, for any backend: env slots for every value, one step per torch op,
    and `make_launch(kernel, slots)` for each kernel node (slots: its buffers' env slots in
    Kernel.buffers order). Returns (program, report detail)."""
    from ..runtime.program import AsStrided, Program, TorchCall
    knodes = [n for n in graph.nodes if n.op == "kernel"]
    slot = {n: i for i, n in enumerate(graph.inputs)}
    constants = [n for n in graph.nodes if n.op == "constant"]
    for n in constants + graph.nodes:
        slot.setdefault(n, len(slot))
    kernel_inputs = {a for kn in knodes for a in kn.args}  # torch results kernels read: made contiguous
    results: dict = {}
    for n in graph.nodes:
        if n.op == "getitem" and n.args[0].op == "kernel":
            results.setdefault(n.args[0], {})[n.attrs["index"]] = n
    outputs = set(o for o in graph.outputs if o is not None)
    launches, buffers, reports = {}, [], {}
    for n, k in zip(knodes, kernels):
        outs = results.get(n, {})
        launches[n] = make_launch(k, [slot[n.args[j]] if kind == "arg" else slot[outs[j]] for kind, j in n.meta["io"]])
        reports[n] = KernelReport(k.name, ctx.name, list(k.ops), k.bytes_read, k.bytes_written, k.flops,
                                  label=describe(k))
        for j, g in outs.items():
            buffers.append((slot[g], g.type.shape, DTYPES[g.type.dtype],
                            g.meta.get("arena_offset")))  # None: fresh each call (plan_memory)
    free = free_layout_inputs(graph)
    views = static_views(graph, kernel_inputs, free)
    needed = outputs | {a for n in graph.nodes if n not in views for a in n.args}  # views only views read: skipped
    steps, names, timed = [], [], []
    for n in graph.nodes:
        if n.op in ("constant", "input") or (n.op == "getitem" and n.args[0].op == "kernel"):
            continue
        if n in views:
            if n in needed:
                root, size, stride, offset = views[n]
                steps.append(AsStrided(slot[root], slot[n], size, stride, offset))
                names.append(f"minicomp {ctx.name} view")
                timed.append(None)
            continue
        if n.op == "kernel":
            steps.append(launches[n])
            r = reports[n]
            timed.append(StepReport(r.name, ctx.name, "kernel", r.label, r.ops, r.bytes_read, r.bytes_written, r.flops))
        else:
            steps.append(TorchCall(_torch_fn(n, device), [slot[a] for a in n.args], slot[n], n in kernel_inputs))
            timed.append(_torch_step_report(n, ctx.name))
        names.append(f"minicomp {ctx.name} {timed[-1].name} ({timed[-1].label})")
    if ctx.options.profile:
        steps = [_timed(step, r, reports.get(n)) if r is not None else step
                 for step, r, n in zip(steps, timed, _step_nodes(graph, views, needed))]
        ctx.report.steps.extend(r for r in timed if r is not None)
    # only a torch op's result can view the arena; kernel results and inputs never do
    may_alias = [i for i, o in enumerate(graph.outputs) if o is not None and o.op not in ("input", "constant")
                 and not (o.op == "getitem" and o.args[0].op == "kernel")]
    values = [graph.constants[c.attrs["name"]] for c in constants]
    check_devices(ctx.name, [(f"constant {c.attrs['name']}", t) for c, t in zip(constants, values)], device)
    program = Program(len(graph.inputs), values, steps, buffers,
                      [None if o is None else slot[o] for o in graph.outputs], ctx.arena_bytes, len(slot), device,
                      may_alias, recycle=ctx.options.recycle_outputs,
                      contiguous_inputs=[i for i, x in enumerate(graph.inputs) if x not in free], names=names)
    program.keepalive = keepalive  # the kernels' machine code lives as long as the program
    ctx.report.kernels.extend(reports.values())
    detail = {"kernels": len(knodes), "torch_ops": len(steps) - len(knodes), "arena_bytes": ctx.arena_bytes,
              "remat_bytes_saved": ctx.remat_bytes_saved}
    return program, detail


def _cpu_kernel_text(k) -> str:
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


def build_cpu(graph, ctx):
    from ..codegen.llvm import (BUFS_SUFFIX, PAR_SUFFIX, RUN_SUFFIX, check_sites, generate_module,
                                outer_extent)
    from ..runtime import cpu
    from ..runtime.cpu import JitModule, KernelLaunch

    def mode(k):  # of a collapsed kernel
        return cpu.launch_mode(math.prod(v.size for v in k.outer + k.inner), outer_extent(k))

    knodes = [n for n in graph.nodes if n.op == "kernel"]
    t0 = time.perf_counter()
    key = ("llvm", cpu.threads(), cpu.openmp(), cpu.PARALLEL_MIN_WORK)  # what launch modes depend on
    if key not in ctx.artifacts:  # a Built graph (capture.py) carries its module from the first compile
        # no graph name in the module: a stable cache key
        ctx.artifacts[key] = generate_module([n.meta["kernel"] for n in knodes],
                                             whole=lambda k: mode(k) == "whole", openmp=cpu.openmp())
    text, kernels = ctx.artifacts[key]
    ctx.dump.stage("kernels", lambda: "\n".join(_cpu_kernel_text(k) for k in kernels), level=3)
    ctx.dump.stage("llvm", text, level=4)
    jit = JitModule(text) if knodes else None
    codegen_s = time.perf_counter() - t0

    def launch(k, slots):
        m = mode(k)
        entry = jit.address(k.name + (RUN_SUFFIX if m == "whole" else PAR_SUFFIX)) if m != "chunks" else None
        bufs = jit.global_address(k.name + BUFS_SUFFIX) if m != "chunks" else None
        sites = tuple(check_sites(k))
        return KernelLaunch(jit.address(k.name), slots, outer_extent(k), k.name, m, entry, bufs, sites)
    program, detail = assemble(graph, ctx, kernels, launch, jit)
    detail.update(llvm_cached=bool(jit and jit.cached), codegen_ms=round(codegen_s * 1e3, 1))
    return program, detail


def _step_nodes(graph, views, needed):
    """The nodes assemble made steps of, in step order."""
    for n in graph.nodes:
        if n.op in ("constant", "input") or (n.op == "getitem" and n.args[0].op == "kernel"):
            continue
        if n not in views or n in needed:
            yield n


def _torch_step_report(n, graph_name: str) -> StepReport:
    """A torch call's bytes (its operands read once, its results written once) and flops (the op
    table's count: 2*M*N*K for a matmul; unknown, 0, for an extern)."""
    from ..ir.types import itemsize

    def nbytes(t):
        if isinstance(t, TensorType):
            return t.numel * itemsize(t.dtype)
        return sum(nbytes(x) for x in t) if isinstance(t, tuple) else 0
    name = n.attrs["target"] if n.op == "extern" else n.op
    if OPS[n.op].category in ("view", "tuple"):  # a view moves nothing (a reshape torch must copy shows as time)
        return StepReport(name, graph_name, "torch", "view", [n.op], 0, 0, 0)
    try:
        flops = int(OPS[n.op].flops(n.type, tuple(a.type for a in n.args), n.attrs)) if n.op != "extern" else 0
    except Exception:  # a multi-result type the op's count does not take
        flops = 0
    label = {"matmul": "matmul", "extern": "torch call"}.get(OPS[n.op].category, OPS[n.op].category)
    return StepReport(name, graph_name, "torch", label, [n.op], sum(nbytes(a.type) for a in n.args), nbytes(n.type),
                      flops)


def _timed(step, report: StepReport, kernel_report=None):
    """options.profile: time each call of a step; a kernel's report keeps the running mean."""
    samples, clock = report.samples, time.perf_counter

    def run(env):
        t = clock()
        step(env)
        samples.append(clock() - t)
        if kernel_report is not None:
            kernel_report.time_s += (samples[-1] - kernel_report.time_s) / len(samples)
    return run
