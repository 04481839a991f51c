"""Timing that survives a shared, noisy machine (interleaved samples, medians, calibrated batches),
and the plain-text tables its figures go into.

Used by the benchmark (bench.py, bench_train.py), the demo and the sample notebooks.
"""
from __future__ import annotations

import math
import os
import platform
import random
import statistics
import time

import torch


def set_threads() -> None:
    """Every contender gets all the cores (torch defaults to the physical ones only)."""
    torch.set_num_threads(os.cpu_count() or 1)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def _calibrate(fn, target_s: float) -> int:
    """Calls per sample so that one sample lasts about target_s (tiny cases would time the clock).
    Doubles until a batch lasts half of that: one call timed alone can be a slow one (cold caches,
    a page fault), and too few calls per sample would then time mostly that."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        took = time.perf_counter() - t0
        if took >= target_s / 2 or n >= 10_000:
            return max(1, min(10_000, math.ceil(n * target_s / max(took, 1e-9))))
        n *= 2


def time_interleaved(fns: dict, reps: int, target_s: float = 2e-3, sync=lambda: None) -> dict:
    """{name: median seconds per call}, sampled over `fns` (zero-argument callables) in a new random
    order each repetition, each batch after one untimed call: whatever a callable leaves behind
    (evicted caches, torch's OpenMP threads still spinning after a parallel copy) falls on a
    different successor each time, and the median drops it. `sync` waits for queued device work (torch.cuda.synchronize) so samples time the work,
    not the queueing."""
    for fn in fns.values():
        fn()  # warm-up: caches, allocator, lazy compiles
    inner = {name: _calibrate(lambda: (fn(), sync()), target_s) for name, fn in fns.items()}
    samples = {name: [] for name in fns}
    names = list(fns)
    order = random.Random(0)
    for _ in range(reps):
        order.shuffle(names)
        for name in names:
            fn, n = fns[name], inner[name]
            fn()  # untimed: the first call after another callable's batch runs on cold caches
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            samples[name].append((time.perf_counter() - t0) / n)
    return {name: statistics.median(s) for name, s in samples.items()}


def grid(rows: list, columns: list) -> list:
    """A text table's lines: columns are (header, row key, format); a row whose "ok" is false is
    marked WRONG; names (the first two columns) left, numbers right."""
    def cell(row, key, fmt):
        v = row[key]
        return "-" if v is None else fmt.format(v)
    body = [[cell(r, k, f) for _, k, f in columns] + ["" if r["ok"] else "WRONG"] for r in rows]
    heads = [h for h, _, _ in columns] + [""]
    widths = [max(len(x) for x in col) for col in zip(heads, *body)]

    def line(cells):
        return "  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(heads), line(["-" * w for w in widths])] + [line(b) for b in body]


def peak_bytes(call) -> int:
    """The most memory `call()` holds at once beyond what was allocated before it, from the
    profiler's record of every allocation and free (CPU tensors, and GPU ones on a GPU), in the
    order they happened. (Summing each op's self memory in op order would book a free at a
    function's return at the start of the op enclosing it, as if freed before it was allocated.)"""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, profile_memory=True) as prof:
        call()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for e in events:
        held += e.nbytes()
        peak = max(peak, held)
    return peak
