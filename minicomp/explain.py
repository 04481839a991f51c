"""`minicomp.explain(model, *inputs)`: why each kernel takes the time it takes.

It compiles the model with every step of every program timed (options.profile), runs it, and
sets each kernel and each torch call (matmul, convolution, other externs) against this machine's
roofline (roofline.py): the least time its bytes, its flops and its launch can take. The largest
of the three names what bounds it -- `memory`, `compute` or `overhead` -- and that least time over
the measured median is the fraction of the roof it reaches. A fraction above 1 would mean a
byte or flop count below the truth: that count is the bug, and nothing here clamps it.

Against eager on the same inputs: the bytes eager's ATen ops move (each reads its operands and
writes its results once, counted by a dispatch mode), how many ops it launches, and its time.
`str()` is a table; `.save(folder)` writes report.md, roofline.png, the fused graph as a picture
and the IR and kernel sources of every stage (explain_save.py).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .api import CompiledModule
from .options import Options
from .timing import time_interleaved

BOUNDS = ("memory", "compute", "overhead")


@dataclass
class Row:
    name: str            # k3, or the torch op (mm, aten.sort.default)
    graph: str           # forward_0, backward_1, inference_2
    kind: str            # kernel | torch
    label: str           # what it does: "add+gelu", "transpose", "matmul"
    ops: list
    bytes_read: int
    bytes_written: int
    flops: int
    time_s: float        # median of the timed calls
    bound: str           # memory | compute | overhead
    roof_fraction: float  # the bound's least time over time_s

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """flops per byte moved"""
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes / self.time_s / 1e9 if self.time_s else 0.0

    @property
    def gflops(self) -> float:
        return self.flops / self.time_s / 1e9 if self.time_s else 0.0


@dataclass
class Totals:
    bytes: int           # what the compiled program's steps move
    min_bytes: int       # the least any program could: each graph's inputs read once, outputs written once
    launches: int        # kernels and torch calls per call
    time_s: float        # one compiled call (forward and backward when training), median
    eager_bytes: int
    eager_launches: int
    eager_time_s: float


@dataclass
class Explanation:
    rows: list
    totals: Totals
    roofline: object
    refusals: list = field(default_factory=list)   # fusions not made, and why
    report: object = None                           # the compiled callable's report()
    stages: dict = field(default_factory=dict)      # "000_forward_0/07_ir_after_fuse.txt" -> text: IR, kernels, sources

    @property
    def kernels(self) -> list:
        return self.rows

    def __str__(self) -> str:
        from .explain_save import table
        return table(self)

    def save(self, folder: str) -> str:
        from .explain_save import save
        return save(self, folder)


class _Traffic(TorchDispatchMode):
    """Eager's cost, op by op: each ATen op that does work reads its tensor operands and writes
    its results (views and metadata ops move nothing)."""

    def __init__(self):
        super().__init__()
        self.bytes, self.launches = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or torch.Tag.view_copy in func.tags or func.__name__ in _NO_WORK):
            def nbytes(tree):
                return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(tree)
                           if isinstance(t, torch.Tensor))
            self.bytes += nbytes((args, kwargs)) + nbytes(out)
            self.launches += 1
        return out


_NO_WORK = {"detach.default", "lift_fresh.default", "empty.memory_format", "empty_strided.default",
            "_to_copy.default_noop", "set_.source_Storage_storage_offset", "ones_like.default_noop"}


def _eager_traffic(call) -> tuple[int, int]:
    mode = _Traffic()
    with mode:
        call()
    return mode.bytes, mode.launches


def _rows(steps, roof, torch_roof=None) -> list:
    """One row per step; a torch call is judged against `torch_roof` where torch runs elsewhere than
    the kernels (cuda_emu: its kernels are emulated, torch's matmuls run natively on the CPU)."""
    rows = []
    for s in steps:
        if not s.samples:
            continue
        t = statistics.median(s.samples)
        matmul = s.kind == "torch" and s.label == "matmul"
        r = torch_roof if s.kind == "torch" and torch_roof is not None else roof
        least = {"memory": r.memory_time(s.bytes_read, s.bytes_written),
                 "compute": r.compute_time(s.flops, matmul),
                 "overhead": r.launch_s if s.kind == "kernel" else r.torch_call_s}
        bound = max(BOUNDS, key=least.get)
        rows.append(Row(s.name, s.graph, s.kind, s.label, list(s.ops), s.bytes_read, s.bytes_written, s.flops, t,
                        bound, least[bound] / t if t else 0.0))
    return rows


def _min_bytes(report) -> int:
    return sum(g.detail.get("min_bytes", 0) for g in report.graphs)


def explain(model_or_fn, *inputs, backend: str = "auto", training: bool = False, reps: int = 20,
            roofline=None) -> Explanation:
    """Compile `model_or_fn`, run it on `inputs` (forward and backward of sum(outputs * fixed
    weights) when `training`), and explain every step. `roofline`: a Roofline to judge against
    (default: this machine's, measured once and cached)."""
    from . import roofline as rl
    from .backends import resolve_backend
    device = "cuda" if any(isinstance(x, torch.Tensor) and x.is_cuda for x in pytree.tree_leaves(inputs)) else "cpu"
    resolved = resolve_backend(backend, device)
    roof = roofline or rl.get(resolved)
    stages = tempfile.mkdtemp(prefix="minicomp-explain-")
    options = dataclasses.replace(Options.make(backend=backend, debug=stages), debug_level=0, profile=True,
                                  cuda_graphs=False)
    compiled = CompiledModule(model_or_fn, options)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    weights = {}

    def run(fn):
        if not training:
            with torch.no_grad():
                return fn(*inputs)
        for x in pytree.tree_leaves(inputs):
            if isinstance(x, torch.Tensor):
                x.grad = None
        outs = [o for o in pytree.tree_leaves(fn(*inputs)) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outs:
            raise ValueError("minicomp.explain(training=True): no output requires grad")
        for i, o in enumerate(outs):
            weights.setdefault(i, torch.randn(o.shape, dtype=o.dtype, device=o.device,
                                              generator=torch.Generator(device=o.device).manual_seed(i)))
        torch.autograd.backward(outs, [weights[i] for i in range(len(outs))])
        if isinstance(fn, torch.nn.Module) or isinstance(fn, CompiledModule):
            (fn if isinstance(fn, torch.nn.Module) else fn.model).zero_grad(set_to_none=True)
    run(compiled)  # compile
    run(compiled)
    for s in compiled.report().steps:
        s.samples.clear()
    for _ in range(reps):
        run(compiled)
        sync()
    torch_roof = rl.get("cpu") if resolved in rl.EMULATED else None
    rows = _rows(compiled.report().steps, roof, torch_roof)
    if roofline is None and resolved not in rl.EMULATED and any(r.roof_fraction > 1.05 for r in rows):
        # a roof measured on a busier day than this one: measure it again, once; what is still
        # above it stays above it (a byte or flop count to fix, never a figure to clamp). Not an
        # emulator's: its roofs take minutes to measure, and only its own kernels meet them
        roof = rl.get(resolved, refresh=True)
        rows = _rows(compiled.report().steps, roof)
    eager_bytes, eager_launches = _eager_traffic(lambda: run(model_or_fn))
    t = time_interleaved({"eager": lambda: run(model_or_fn), "compiled": lambda: run(compiled)}, max(5, reps // 2),
                         sync=sync)
    totals = Totals(sum(r.bytes for r in rows), _min_bytes(compiled.report()), len(rows), t["compiled"],
                    eager_bytes, eager_launches, t["eager"])
    return Explanation(rows, totals, roof, list(compiled.report().refusals), compiled.report(), _read(stages))


def _read(folder: str) -> dict:
    """The dump folder's files as {relative path: text}; the folder is removed."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in sorted(files):
            path = os.path.join(root, f)
            with open(path) as fh:
                out[os.path.relpath(path, folder)] = fh.read()
    shutil.rmtree(folder, ignore_errors=True)
    return dict(sorted(out.items()))
