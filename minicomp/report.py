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
    phases_ms: dict = field(default_factory=dict)  # where compile_s went: lowering, each pass, codegen, ...

    def phases(self) -> str:
        """phases_ms as one line, e.g. `lower 7.1, fuse 92.7, llvm_jit 184.0 ms` (aot_autograd: its
        tracing around the graphs of one Dynamo graph, kept on the first of them)."""
        return ", ".join(f"{k} {v}" for k, v in self.phases_ms.items()) + " ms"

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
    label: str = ""      # what it does, in a few words: the fused ops, or "copy", "transpose", ...

    def __str__(self) -> str:
        return (f"{self.name} ({self.graph}) {self.label}: {' '.join(self.ops) or '-'}; read {self.bytes_read:,} B, "
                f"wrote {self.bytes_written:,} B, {self.flops:,} flops")


@dataclass
class StepReport:
    """One step of a compiled program as it ran (options.profile, or explain()): a kernel or a
    torch call (a matmul, a convolution, an extern), with the seconds of every call it timed."""
    name: str            # k3, or the torch op: mm, aten.sort.default
    graph: str
    kind: str            # kernel | torch
    label: str
    ops: list
    bytes_read: int
    bytes_written: int
    flops: int
    samples: list = field(default_factory=list)


def _kb(n: int) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.2f} MiB"


@dataclass
class PartitionReport:
    """A training graph's cut (compiler/passes/partition.py): what the forward saves for the backward."""
    name: str            # joint_0, ...
    partitioner: str     # min-cut | remat=False
    saved_bytes: int     # activations kept between forward and backward (graph inputs are free)
    no_remat_bytes: int  # what remat=False would keep
    saved: list          # (value, bytes)
    recomputed: list     # (value, op, bytes its recomputation saves, flops it adds)
    rules: str = ""      # the recompute rules that made the cut (remat_budget may relax them)
    budget: float | None = None
    seconds: float = 0.0  # the cut's time: lowering the joint graph, the min cuts, scheduling, extracting fx modules

    def __str__(self) -> str:
        share = self.saved_bytes / self.no_remat_bytes if self.no_remat_bytes else 1.0
        head = (f"{self.name} [{self.partitioner}]: saved_bytes={self.saved_bytes:,} ({_kb(self.saved_bytes)}, "
                f"{share:.0%} of remat=False's {self.no_remat_bytes:,}) in {len(self.saved)} value(s)")
        if self.budget is not None:
            head += f", remat_budget={self.budget:g} (rules: {self.rules})"
        if not self.recomputed:
            return head + "; nothing recomputed"
        flops = sum(r[3] for r in self.recomputed)
        saving = [r for r in self.recomputed if r[2]]
        items = ", ".join(f"{op} {v.split(' at ')[0]} (saves {b:,} B, +{f:,} flops)" for v, op, b, f in saving)
        rest = len(self.recomputed) - len(saving)
        return (head + f"; recomputed in backward: {len(self.recomputed)} op(s), +{flops:,} flops: {items}"
                + (f", and {rest} op(s) they inline" if rest else ""))


@dataclass
class Report:
    graphs: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    eager: list = field(default_factory=list)   # what ran eagerly, and why
    partitions: list = field(default_factory=list)  # training graphs: what the forward saves (PartitionReport)
    steps: list = field(default_factory=list)       # profiled programs' steps, timed (StepReport)
    refusals: list = field(default_factory=list)    # profiled graphs: "graph: producer -> consumer: why"
    runs: list = field(default_factory=list, repr=False)  # the programs built, released with their callable
    programs: list = field(default_factory=list)    # minicomp.compile: each program it built for a signature, and why
    recompiles: list = field(default_factory=list)  # minicomp.compile: Dynamo's recompiles of those, with the failed guard

    @property
    def replay_bytes(self) -> int:
        """Bytes CUDA Graph replay copies per call of every program (inputs into static buffers,
        static outputs cloned), beyond what the kernels move."""
        return sum(g.detail.get("replay_bytes", 0) for g in self.graphs)

    @property
    def saved_bytes(self) -> int:
        """Activations the last training graph keeps between forward and backward."""
        return self.partitions[-1].saved_bytes if self.partitions else 0

    def __str__(self) -> str:
        lines = [f"minicomp report: {len(self.graphs)} graph(s), {len(self.kernels)} kernel(s)"]
        lines += ["  " + str(g) for g in self.graphs]
        lines += [f"  program {i}: {p}" for i, p in enumerate(self.programs, 1)]
        lines += [f"  {r}" for r in self.recompiles]
        for g, run in zip(self.graphs, self.runs):
            if "symbolic" in g.detail:
                built = getattr(run, "built", None)
                lines.append(f"  sizes of {g.name}: symbolic inputs {', '.join(g.detail['symbolic'])}; guards: "
                             f"{'; '.join(g.detail['guards']) or 'none added by minicomp'}"
                             + (f"; {built} size(s) run so far" if built is not None else ""))
        lines += ["  " + str(p) for p in self.partitions]
        if any("replay_bytes" in g.detail for g in self.graphs):
            lines.append(f"  CUDA Graph replay copies {self.replay_bytes:,} B per call beyond the kernels' traffic "
                         "(inputs into static buffers, outputs cloned), all graphs together")
        lines += ["  " + str(k) for k in self.kernels]
        lines += [f"  ran eagerly: {e}" for e in self.eager]
        return "\n".join(lines)
