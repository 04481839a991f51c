"""The roofline of this machine, measured once with minicomp's own programs and cached on disk.

Three costs bound a step's time from below (DESIGN.md): the bytes it moves over the bandwidth of
memory, the flops it does over the machine's peak, and the fixed cost of launching it at all.
Each roof is measured the way explain() measures a kernel -- one step of a compiled program,
timed -- so a kernel is judged against what the same mechanism achieves at its best:

  read bandwidth   a row-sum kernel over the working set (nothing written), per size class
  write bandwidth  from a copy kernel of the same size (t = S/2 / read + S/2 / write)
  vector flops     chains of cheap ops side by side on data that fits in cache, counted in the op table's
                   cost units (the same units every kernel's flops are counted in), on enough
                   elements that the kernel runs on every thread (VECTOR_ELEMENTS)
  matmul flops     torch.mm of square matrices (matmuls run in BLAS/cuBLAS)
  launch           a kernel over 16 elements; a torch call's floor likewise (an mm of 2x2)

Bandwidth depends on where the data lives (caches, then DRAM), so it is measured per working-set
size and a kernel is compared with the class at or above its own size: a 200 KB kernel is not
held to DRAM speed it never needed. Roofs take the fastest of many samples (an optimistic roof:
a kernel below it is really below it), taken in rounds over all the programs, so that a burst of
load on a shared machine cannot sink one figure alone; what no memory system does -- a read slower
than a copy, a smaller working set slower than a larger one -- is mended upward, never downward.
Cached per machine, backend, thread count and version.
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
VERSION = "roofline-4"


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


def _program(fn, inputs, backend: str, kind: str):
    """fn compiled with profiling on, called once, and its first `kind` step (samples cleared)."""
    import minicomp
    from minicomp.options import Options
    options = dataclasses.replace(Options.make(backend=backend, cuda_graphs=False), profile=True)
    compiled = minicomp.CompiledModule(fn, options)
    with torch.no_grad():
        compiled(*inputs)
    step = next(s for s in compiled.report().steps if s.kind == kind)
    step.samples.clear()
    return compiled, step


def _best_steps(cases, reps: int, backend: str) -> list:
    """[(the time of each case's first `kind` step at its best, its step)] for cases of (fn, inputs,
    kind): its fastest of `reps` calls -- a roof is the best the machine did, and a busy neighbour only
    ever makes a sample slower. The calls go round the cases, one each per round, so a burst of load on a
    shared machine slows a sample of every case, not all the samples of one. Then each case runs
    `reps // 2` calls back to back, as a kernel in a loop does (its data partly still in cache): a
    16 MiB copy measured only between other programs was 3% slower than a 128 MiB kernel timed in a loop."""
    programs = [(_program(fn, inputs, backend, kind), inputs) for fn, inputs, kind in cases]
    with torch.no_grad():
        for _ in range(reps):
            for (compiled, _), inputs in programs:
                compiled(*inputs)
        for (compiled, _), inputs in programs:
            for _ in range(reps // 2):
                compiled(*inputs)
    return [(min(step.samples), step) for (_, step), _ in programs]


def _no_slower_when_smaller(gbps: list) -> list:
    """Bandwidths by working set with each raised to the best of the larger sets': a smaller working set
    fits in the same memory or a faster one, so only a noisy sample has it slower. Raising a figure,
    never lowering one, keeps the roofs optimistic."""
    out = list(gbps)
    for i in reversed(range(len(out) - 1)):
        out[i] = max(out[i], out[i + 1])
    return out


def measure(backend: str = "cpu", quick: bool = False) -> Roofline:
    """Measure this machine's roofs for `backend` (a few seconds)."""
    device = "cuda" if backend == "cuda" else "cpu"
    sizes = GPU_SIZES if device == "cuda" else CPU_SIZES
    if quick:
        sizes = sizes[:3]
    reps = 12 if quick else 30
    cases = []
    for s in sizes:
        cols = 1024
        cases.append((lambda x: x.sum(1), (torch.randn(max(1, s // 4 // cols), cols, device=device),), "kernel"))
        cases.append((lambda x: x + 1.0, (torch.randn(max(1, s // 8), device=device),), "kernel"))
    n_vec = VECTOR_ELEMENTS[device]
    # the best of a cheap-op chain and transcendental ones (interleaved by the codegen)
    cases += [(chain, (torch.rand(n_vec, device=device),), "kernel") for chain in _CHAINS]
    for n in ((512, 1024) if quick else (1024, 2048)):  # the better of two sizes: BLAS peaks at either;
        # near the FMA peak the clock decides: the best of as many samples as the bandwidth roofs take
        cases.append((lambda a, b: a @ b, (torch.randn(n, n, device=device), torch.randn(n, n, device=device)),
                      "torch"))
    timed = _best_steps(cases, reps, backend)
    read, write, copy = [], [], []
    for i in range(len(sizes)):
        (t_read, _), (t_copy, _) = timed[2 * i], timed[2 * i + 1]
        r = cases[2 * i][1][0].numel() * 4 / t_read
        nb = cases[2 * i + 1][1][0].numel() * 4
        copy.append(2 * nb / t_copy / 1e9)
        read.append(max(r / 1e9, copy[-1]))  # reading alone is never slower than a copy of as many bytes
    read, copy = _no_slower_when_smaller(read), _no_slower_when_smaller(copy)
    for i in range(len(sizes)):  # t_copy = nb / read + nb / write
        nb = cases[2 * i + 1][1][0].numel() * 4
        w_time = timed[2 * i + 1][0] - nb / (read[i] * 1e9)
        write.append(nb / w_time / 1e9 if w_time > 0 else read[i])
    write = _no_slower_when_smaller(write)
    at = 2 * len(sizes)
    vector = max(step.flops / t / 1e9 for t, step in timed[at:at + len(_CHAINS)])
    matmul = max(2 * case[1][0].shape[0] ** 3 / t / 1e9
                 for case, (t, _) in zip(cases[at + len(_CHAINS):], timed[at + len(_CHAINS):]))
    (t_launch, _), (t_call, _) = _best_steps(
        [(lambda x: x + 1.0, (torch.randn(16, device=device),), "kernel"),
         (lambda a, b: a @ b, (torch.randn(2, 2, device=device), torch.randn(2, 2, device=device)), "torch")],
        reps * 4, backend)
    return Roofline(machine(device), backend, list(sizes), read, write, copy, vector, matmul, t_launch, t_call)


def _cheap(x):
    """Cheap ops in eight chains per element, side by side: one chain of 32 steps ran at the latency
    of each step, not at the vector units' rate (45 against 115 GFLOP/s units on 2 Zen 4 threads),
    and a row kernel with independent work per element (layer_norm(gelu)) read 109% of that roof."""
    ys = [x * (1 + 0.125 * i) for i in range(8)]
    for _ in range(4):
        ys = [torch.abs(y - 0.5) * 1.5 for y in ys]
    return ((ys[0] + ys[1]) + (ys[2] + ys[3])) + ((ys[4] + ys[5]) + (ys[6] + ys[7]))


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
