"""Backends: a fused IR graph -> a callable. The only place that knows the list.

One module per backend (interpret, cpu, cuda, cuda_emu), each with `build(graph, ctx)` ->
(run(*inputs) -> outputs, report detail), `kernel_ops()` (the ops its code generator has; None
for a backend without kernels) and FLOPS_PER_BYTE (the balance the fusion cost model plans for).
They take their pieces from codegen/ (source text) and runtime/ (loading and running it), and
share assemble.py (the Program) and layout.py (views of known layout). Code generators and
runtimes are imported when a backend builds, so `import minicomp` loads neither llvmlite nor pycuda.
The compiler imports this package, never the other way round.
"""
from __future__ import annotations

from ..errors import MinicompError
from . import cpu, cuda, cuda_emu, interpret

REGISTRY = {"interpret": interpret, "cpu": cpu, "cuda": cuda, "cuda_emu": cuda_emu}


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


def prepare(name: str, inputs) -> None:
    """Start what a backend can before its graphs exist, for a compile about to trace with `inputs`:
    the cpu backend's compile workers (runtime/jit_pool.py), whose start then overlaps Dynamo's trace."""
    import torch
    device = "cuda" if any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in inputs) else "cpu"
    if name in ("cpu", "auto") and device == "cpu":
        cpu.prepare()


def kernel_ops(backend: str):
    """(ops the backend's code generator has, its flops-per-byte balance); (None, 0) without kernels."""
    b = REGISTRY.get(backend)
    if b is None or b.kernel_ops() is None:
        return None, 0.0
    return b.kernel_ops(), b.FLOPS_PER_BYTE


def build(graph, ctx, backend: str):
    """Returns (run(*inputs) -> list of outputs, detail dict for the report)."""
    if backend not in REGISTRY:
        raise ValueError(f"unknown backend {backend!r}")
    from ..ir import sym
    with sym.scope(graph.sizes):
        return REGISTRY[backend].build(graph, ctx)
