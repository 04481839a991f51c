"""What `compiled.report()` returns: per compiled graph and (from the CPU backend on) per kernel,
plus everything that ran eagerly (graph breaks, fallbacks), so nothing is silently slow."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GraphReport:
    name: str            # e.g. forward_0, backward_0
    kind: str            # forward | backward | inference
    backend: str
    fx_nodes: int
    nodes: int           # IR nodes after the passes
    externs: list        # ATen ops that run through torch
    compile_s: float
    detail: dict = field(default_factory=dict)  # backend-specific facts (kernel count, bytes, ...)

    def __str__(self) -> str:
        ext = f", externs: {', '.join(sorted(set(self.externs)))}" if self.externs else ""
        extra = "".join(f", {k}={v}" for k, v in self.detail.items())
        return (f"{self.name} [{self.kind}, {self.backend}]: {self.fx_nodes} fx nodes -> {self.nodes} IR nodes"
                f"{extra}{ext}; compiled in {self.compile_s * 1e3:.1f} ms")


@dataclass
class KernelReport:
    name: str
    graph: str
    ops: list            # the IR ops fused into this kernel
    bytes_read: int
    bytes_written: int
    flops: int
    time_s: float = 0.0  # measured by the backend's profiler when asked

    def __str__(self) -> str:
        return (f"{self.name} ({self.graph}): {' '.join(self.ops)}; read {self.bytes_read:,} B, "
                f"wrote {self.bytes_written:,} B, {self.flops:,} flops")


@dataclass
class Report:
    graphs: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    eager: list = field(default_factory=list)   # what ran eagerly, and why

    def __str__(self) -> str:
        lines = [f"minicomp report: {len(self.graphs)} graph(s), {len(self.kernels)} kernel(s)"]
        lines += ["  " + str(g) for g in self.graphs]
        lines += ["  " + str(k) for k in self.kernels]
        lines += [f"  ran eagerly: {e}" for e in self.eager]
        return "\n".join(lines)
