"""Backend choice and construction: IR graph -> callable. Each backend's pieces live in codegen/
and runtime/; this is the only place that knows the list."""
from __future__ import annotations

from ..ir import prepare


def resolve_backend(name: str) -> str:
    if name == "auto":
        return "interpret"
    if name in ("cpu", "cuda", "cuda_emu"):
        raise NotImplementedError(f"minicomp: backend {name!r} is not built yet; use 'interpret'")
    return name


def build(graph, ctx, backend: str):
    """Returns (run(*inputs) -> list of outputs, detail dict for the report)."""
    if backend == "interpret":
        return prepare(graph), {}
    raise ValueError(f"unknown backend {backend!r}")
