"""The roofline of this machine, measured once with minicomp's own programs and cached on disk.

Three costs bound a step's time from below (DESIGN.md): the bytes it moves over the bandwidth of
memory, the flops it does over the machine's peak, and the fixed cost of launching it at all.
Each roof is measured the way explain() measures a kernel -- one step of a compiled program,
timed -- so a kernel is judged against what the same mechanism achieves at its best:

  read bandwidth   a row-sum kernel over the working set (nothing written), per size class
  write bandwidth  from a copy kernel of the same size (t = S/2 / read + S/2 / write)
  vector flops     a long chain of cheap ops on data that fits in cache, counted in the op table's
                   cost units (the same units every kernel's flops are counted in), on enough
                   elements that the kernel runs on every thread (VECTOR_ELEMENTS)
  matmul flops     torch.mm of square matrices (matmuls run in BLAS/cuBLAS)
  launch           a kernel over 16 elements; a torch call's floor likewise (an mm of 2x2)

Bandwidth depends on where the data lives (caches, then DRAM), so it is measured per working-set
size and a kernel is compared with the class at or above its own size: a 200 KB kernel is not
held to DRAM speed it never needed. Roofs take the fastest of many samples (an optimistic roof:
a kernel below it is really below it). Cached per machine, backend, thread count and version.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
from dataclasses import asdict, dataclass

import torch

EMULATED = ("cuda_emu",)  # backends whose kernels run emulated on the CPU, beside torch's native calls
CPU_SIZES = (1 << 18, 1 << 21, 1 << 24, 1 << 26)      # working-set bytes: L2, L3, DRAM, big DRAM
GPU_SIZES = (1 << 22, 1 << 25, 1 << 28, 1 << 30)
# the vector roof's chains run over as many elements as it takes to use the whole machine: on the CPU
# past PARALLEL_MIN_WORK (runtime/cpu.py, 32768), so they run on every thread as a kernel that size
# does (16384 elements ran on one, and 2-thread kernels read 120-150% of that roof); on a GPU, every SM
VECTOR_ELEMENTS = {"cpu": 1 << 17, "cuda": 1 << 22}
VERSION = "roofline-2"


@dataclass
class Roofline:
    machine: str
    backend: str
    sizes: list           # working-set bytes of each class
    read_gbps: list
    write_gbps: list
    copy_gbps: list       # (read + written bytes) / time of a copy, per class: the usual "copy bandwidth"
    vector_gflops: float  # op-table cost units per second of our kernels' arithmetic
    matmul_gflops: float
    launch_s: float       # a kernel step's floor
    torch_call_s: float   # a torch call's floor

    def _class(self, nbytes: int) -> int:
        for i, s in enumerate(self.sizes):
            if nbytes <= s:
                return i
        return len(self.sizes) - 1

    def memory_time(self, bytes_read: int, bytes_written: int) -> float:
        """The least time moving these bytes takes at this working set's bandwidth."""
        i = self._class(bytes_read + bytes_written)
        return bytes_read / (self.read_gbps[i] * 1e9) + bytes_written / (self.write_gbps[i] * 1e9)

    def compute_time(self, flops: int, matmul: bool) -> float:
        return flops / ((self.matmul_gflops if matmul else self.vector_gflops) * 1e9)

    def __str__(self) -> str:
        bw = ", ".join(f"{_size(s)}: read {r:.1f}, copy {c:.1f}" for s, r, c in
                       zip(self.sizes, self.read_gbps, self.copy_gbps))
        return (f"roofline of {self.machine} [{self.backend}]: GB/s by working set ({bw}); "
                f"vector {self.vector_gflops:.1f} GFLOP/s (op-table units), matmul {self.matmul_gflops:.1f} GFLOP/s; "
                f"launch {self.launch_s * 1e6:.1f} us, torch call {self.torch_call_s * 1e6:.1f} us")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def machine(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {torch.get_num_threads()} threads"


def _best_step(fn, inputs, reps: int, backend: str, kind: str = "kernel") -> tuple[float, object]:
    """(the time of fn's first `kind` step at its best -- its fastest of `reps` calls: a roof is the
    best the machine did, and a busy neighbour only ever makes a sample slower -- and its report)."""
    import minicomp
    from minicomp.options import Options
    options = dataclasses.replace(Options.make(backend=backend, cuda_graphs=False), profile=True)
    compiled = minicomp.CompiledModule(fn, options)
    with torch.no_grad():
        compiled(*inputs)
        step = next(s for s in compiled.report().steps if s.kind == kind)
        step.samples.clear()
        for _ in range(reps):
            compiled(*inputs)
    return min(step.samples), step


def measure(backend: str = "cpu", quick: bool = False) -> Roofline:
    """Measure this machine's roofs for `backend` (a few seconds)."""
    device = "cuda" if backend == "cuda" else "cpu"
    sizes = GPU_SIZES if device == "cuda" else CPU_SIZES
    if quick:
        sizes = sizes[:3]
    reps = 12 if quick else 30
    read, write, copy = [], [], []
    for s in sizes:
        cols = 1024
        x = torch.randn(max(1, s // 4 // cols), cols, device=device)
        t_read, _ = _best_step(lambda x: x.sum(1), (x,), reps, backend)
        r = x.numel() * 4 / t_read
        half = torch.randn(max(1, s // 8), device=device)
        t_copy, _ = _best_step(lambda x: x + 1.0, (half,), reps, backend)
        nb = half.numel() * 4
        w_time = t_copy - nb / r
        w = nb / w_time if w_time > 0 else r
        read.append(r / 1e9)
        write.append(w / 1e9)
        copy.append(2 * nb / t_copy / 1e9)

    vector = 0.0
    n_vec = VECTOR_ELEMENTS[device]
    for chain in _CHAINS:  # the best of a cheap-op chain and transcendental ones (interleaved by the codegen)
        t_vec, step = _best_step(chain, (torch.rand(n_vec, device=device),), reps, backend)
        vector = max(vector, step.flops / t_vec / 1e9)
    matmul = 0.0
    for n in ((512, 1024) if quick else (1024, 2048)):  # the better of two sizes: BLAS peaks at either
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        t_mm, _ = _best_step(lambda a, b: a @ b, (a, b), reps, backend, kind="torch")  # near the FMA peak the
        # clock decides: the best of as many samples as the bandwidth roofs take
        matmul = max(matmul, 2 * n ** 3 / t_mm / 1e9)
    t_launch, _ = _best_step(lambda x: x + 1.0, (torch.randn(16, device=device),), reps * 4, backend)
    t_call, _ = _best_step(lambda a, b: a @ b, (torch.randn(2, 2, device=device), torch.randn(2, 2, device=device)),
                           reps * 4, backend, kind="torch")
    return Roofline(machine(device), backend, list(sizes), read, write, copy, vector, matmul, t_launch, t_call)


def _cheap(x):
    for _ in range(32):
        x = torch.abs(x - 0.5) * 1.5
    return x


def _transcendental(x):
    for _ in range(8):
        x = torch.sigmoid(torch.exp(-x) * 0.5) + torch.erf(x)
    return x


_CHAINS = (_cheap, _transcendental)


def _key(backend: str) -> str:
    from minicomp import __version__
    from minicomp.runtime import cache
    device = "cuda" if backend == "cuda" else "cpu"
    return cache.key(VERSION, __version__, torch.__version__, backend, machine(device), str(os.cpu_count()))


def get(backend: str = "cpu", refresh: bool = False) -> Roofline:
    """This machine's roofline for `backend`: from the cache, or measured now and cached."""
    from minicomp.runtime import cache
    k = _key(backend)
    blob = cache.get("roofline", k)
    old = None
    if blob is not None:
        try:
            old = Roofline(**json.loads(blob))
        except (TypeError, ValueError):
            cache.drop("roofline", k)
    if old is not None and not refresh:
        return old
    roof = measure(backend, quick=backend in EMULATED)  # an emulator's full set takes minutes: 4 ms a launch
    if old is not None and old.sizes == roof.sizes:  # a roof is the best this machine has done:
        roof = best(old, roof)                       # a refresh under load must not lower it
    cache.put("roofline", k, json.dumps(asdict(roof)).encode())
    return roof


def best(a: Roofline, b: Roofline) -> Roofline:
    """Per figure, the better of two measurements of one machine (higher rates, lower floors)."""
    return Roofline(a.machine, a.backend, a.sizes,
                    [max(x, y) for x, y in zip(a.read_gbps, b.read_gbps)],
                    [max(x, y) for x, y in zip(a.write_gbps, b.write_gbps)],
                    [max(x, y) for x, y in zip(a.copy_gbps, b.copy_gbps)],
                    max(a.vector_gflops, b.vector_gflops), max(a.matmul_gflops, b.matmul_gflops),
                    min(a.launch_s, b.launch_s), min(a.torch_call_s, b.torch_call_s))
