"""Where a compiled call's host time goes: microseconds per call, layer by layer, measured.

A call of `minicomp.compile(fn)` passes through layers, each timed on its own with the inputs it
really gets (recorded from one call), many calls a sample, interleaved (timing.time_interleaved):
- `guards`: the check that the call matches CompiledModule's last program: Dynamo's own guards,
  checked without Dynamo's wrapper (frame_call.py), or, where that program's frame cannot run that
  way (a graph break in it), C++ TensorGuards; off that fast path, building the signature and
  looking it up;
- `dynamo + aot`: the frame's code Dynamo rewrote (around the graph's call), the wrapper between it
  and the program (AOTAutograd's, where it is not bypassed), and off the direct path Dynamo's own
  wrapper, frame evaluation and guards (the compiled callable less the programs it calls);
- `program`: Program.__call__ around the generated call (executor checkout, the profiler check);
- inside the generated call, one clock read between phases, the clock's own share subtracted:
  `input checks` (contiguity), `output allocation`, `pointer binding` (data pointers into the
  kernels' tables), `kernels` (each launch through ctypes and its run), `torch calls`, `views`,
  `output checks` (outputs that may view the arena).
The layers add up to the whole call up to the noise of separate samples; what is left is shown as
`other`. For a small program this is where the time goes; for a big one, the kernels.
"""
from __future__ import annotations

import statistics

import torch

from .signature import call_signature
from .runtime.program import Executor, Program
from .timing import time_interleaved


def _executors(compiled) -> list:
    return [(run, run.primary()) for run in compiled.report().runs if isinstance(run, Program)]


def _record_inputs(compiled, inputs) -> list:
    """[(program, executor, the inputs it got)] for each program one call of `compiled` runs."""
    seen, patched = [], []
    for program, ex in _executors(compiled):
        if ex is None:
            continue
        run = ex.run

        def spy(*args, _run=run, _p=program, _ex=ex):
            seen.append((_p, _ex, args))
            return _run(*args)
        ex.run = spy
        patched.append((ex, run))
    try:
        compiled(*inputs)
    finally:
        for ex, run in patched:
            ex.run = run
    return seen


def breakdown(compiled, inputs, reps: int = 7, target_s: float = 2e-3) -> dict:
    """{phase: microseconds per call} of `compiled(*inputs)` (called at least once already), in
    call order, plus `total` (the whole call, measured) and `other` (total less the phases)."""
    compiled(*inputs)
    calls = _record_inputs(compiled, inputs)
    fast = compiled._fast
    run = fast.program if fast is not None and len(inputs) == fast.nargs else None
    direct = run is not None and run.check(tuple(inputs))
    on_fast = direct or (run is not None and run.entry is None and fast.guards is not None
                         and torch.is_grad_enabled() is fast.grad and fast.owner.training is fast.training
                         and fast.guards.check(*inputs))
    fns = {"total": lambda: compiled(*inputs)}
    if direct:  # Dynamo's guards, then its entry's code, without its wrapper (frame_call.py)
        args = tuple(inputs)
        fns["guards"] = lambda: run.check(args)
        fns["compiled"] = lambda: run.attempt(args)
    elif on_fast:
        fns["guards"] = lambda: fast.guards.check(*inputs)
        fns["compiled"] = lambda: run.program(*inputs)
    else:
        fns["guards"] = lambda: compiled._programs.get(call_signature(compiled.model, inputs, {}))
    for j, (program, ex, args) in enumerate(calls):
        fns[f"program{j}"] = lambda p=program, a=args: p(*a)
        fns[f"executor{j}"] = lambda e=ex, a=args: e.run(*a)
    t = time_interleaved(fns, reps, target_s)
    out = {"total": t["total"], "guards": t["guards"]}
    programs = sum(t[f"program{j}"] for j in range(len(calls)))
    out["dynamo + aot"] = (t["compiled"] - (t["guards"] if direct else 0.0) if on_fast
                           else t["total"] - t["guards"]) - programs
    out["program"] = programs - sum(t[f"executor{j}"] for j in range(len(calls)))
    mark = Executor.mark_seconds()
    for j, (program, ex, args) in enumerate(calls):
        phases = _phases(ex, args, reps, mark, t[f"executor{j}"])
        for name, s in phases.items():
            out[name] = out.get(name, 0.0) + s
    out["other"] = out["total"] - sum(s for name, s in out.items() if name != "total")
    return {name: s * 1e6 for name, s in out.items()}


def _phases(ex, args, reps: int, mark: float, whole: float) -> dict:
    """Seconds per call of each phase of one generated call, from its phased twin: per phase, the
    median over `reps` batches (sized like a 2 ms sample of the unphased call) less its clock reads."""
    run, totals, marks = ex.phased()
    n = max(1, min(10_000, int(2e-3 / max(whole, 1e-9))))
    run(*args)
    samples = {name: [] for name in run.phases}
    for _ in range(reps):
        totals[:] = [0.0] * len(totals)
        for _ in range(n):
            run(*args)
        for name, j in run.phases.items():
            samples[name].append(max(0.0, totals[j] / n - marks[j] * mark))
    return {name: statistics.median(s) for name, s in samples.items()}


def format_breakdown(case: str, us: dict) -> str:
    """One line: `case: 20.4 us per call = guards 1.5 + dynamo + aot 11.6 + ...`."""
    parts = [f"{name} {v:.1f}" for name, v in us.items() if name != "total"]
    return f"{case}: {us['total']:.1f} us per call = " + " + ".join(parts)
