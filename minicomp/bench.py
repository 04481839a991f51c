"""Eager vs minicomp vs torch.compile (Inductor): one table, one interleaved run.

    python -m minicomp.bench [--quick] [--backend NAME] [--cases a,b] [--reps N]
    python -m minicomp.bench --dynamic [--quick]     (one symbolic program vs a static one per size)

Interleaved: each repetition times the callables (eager, minicomp, Inductor, minicomp with fresh
outputs, and a large copy) in a new random order, so a noisy neighbour or a clock change hits all
of them alike; the table shows medians. Ratios below 1 mean minicomp is faster.

The timed loops drop each result, so minicomp's default recycles its big outputs' memory (see
runtime/program.py) while eager and Inductor page-fault fresh memory every call; the `fresh ms`
column is minicomp with `recycle_outputs=False`, for the comparison without that advantage.

Bandwidth: a case must at least read its inputs once and write its outputs once; those bytes over
minicomp's median time is its achieved GB/s, shown against `dst.copy_(src)` measured in the same
run (what this machine can actually stream). A memory-bound kernel near 100% has nothing left to
gain. Each row also carries minicomp's max abs error against eager, and a row outside the
tolerance is marked WRONG and left out of the geomean: a fast wrong answer never looks good.

Compile times: the first call with cold caches, the median of three cold compiles per compiler,
the two taken in turn, each from empty caches of its own (`cold own s`: minicomp's part of it, the
first call's wait for LLVM included; `llvm s`: LLVM's, which runs in the background from the end of
code generation), then a recompile in the same process after `torch._dynamo.reset()` (`again s`),
minicomp's own part of it (`own s`), and Dynamo's trace alone (`dynamo s`: its `eager` backend's
first call less its second), which every Dynamo-based compiler pays before its own work, and
`trace s`: Dynamo and AOTAutograd's traces with nothing compiled, as minicomp runs them
(`trace/ind.`: that and one call over Inductor's cold compile, the least ratio a compiler built on
both can reach). Before the cold compiles, untimed traces pay the process's first-use costs of
tracing for both compilers, and each timed compile starts after a full collection (bench_traces.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.utils._pytree as pytree

import minicomp
from minicomp.api import CompiledModule
from minicomp.options import BACKENDS, Options
from minicomp.overhead import breakdown, format_breakdown

from minicomp.bench_cases import CASE_NAMES, EXTRA_CASES, TRAIN_CASES, make_case, unavailable
from minicomp.bench_train import format_train_table, run_train
from minicomp.bench_traces import cold_caches, collect, compile_parts, trace_only, warm_traces
from minicomp.guard_profile import unprofiled
from minicomp.timing import grid, machine, peak_bytes, set_threads, time_interleaved

OVERHEAD_BOUND_S = 200e-6  # a call below this is mostly host overhead: its breakdown goes in the output
TOLERANCE = 1e-4  # max abs error allowed, relative to max(1, max |eager output|)
AGAIN_SAMPLES = 3  # warm recompiles timed per compiler (the median is shown)
COLD_SAMPLES = 3   # cold compiles timed per compiler (the median is shown; one with --quick)


def _tensors(tree) -> list:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _state(fn) -> list:
    """A module's parameters and buffers are inputs too: the kernels must read them."""
    if isinstance(fn, torch.nn.Module):
        return list(fn.parameters()) + list(fn.buffers())
    return []


def _max_err(actual, expected) -> tuple[float, float]:
    """(max abs error, max |expected|) over all output tensors."""
    a, e = _tensors(actual), _tensors(expected)
    if len(a) != len(e) or any(x.shape != y.shape for x, y in zip(a, e)):
        return math.inf, 0.0
    err = max(((x.float() - y.float()).abs().max().item() for x, y in zip(a, e)), default=0.0)
    scale = max((y.float().abs().max().item() for y in e), default=0.0)
    return err, scale


def _timed_first_call(fn, inputs) -> tuple[float, object]:
    collect()
    t0 = time.perf_counter()
    out = fn(*inputs)
    return time.perf_counter() - t0, out


def time_split(fn, inputs, backend: str, reps: int) -> tuple[float, float]:
    """(seconds in torch calls, seconds in minicomp's kernels) per call: the medians of each step of a
    profiled program (options.profile), summed by kind. The torch calls are the matmuls and
    convolutions minicomp hands to torch (the BLAS/oneDNN Inductor calls too): their time is the part
    of a call no code generator of ours can cut."""
    compiled = CompiledModule(fn, dataclasses.replace(Options.make(backend=backend), profile=True))
    for _ in range(2):
        compiled(*inputs)
    steps = compiled.report().steps
    for st in steps:
        st.samples.clear()
    for _ in range(max(3, reps // 2)):
        compiled(*inputs)
    per = {"torch": 0.0, "kernel": 0.0}
    for st in steps:
        if st.samples:
            per[st.kind] += statistics.median(st.samples)
    return per["torch"], per["kernel"]


def bench_case(name: str, backend: str, reps: int, quick: bool, copy_elems: int, device: str = "cpu") -> dict:
    case = make_case(name, quick, device)
    fn, inputs = case.fn, case.inputs
    # Dynamo keeps compiled code on the function's code object: each cold compile starts from a reset,
    # and the compiles timed afterwards follow one last reset, so nothing they hold is ever dropped
    # (a reset after a compile would make the timed callables recompile in their warm-up).
    torch._dynamo.reset()
    expected = fn(*inputs)
    # the process's first-use costs of tracing this case, paid for both compilers (bench_traces.py):
    # the cold columns compare the compilers, not the order they run in
    warm_traces(lambda b: torch.compile(fn, backend=b)(*inputs))
    # cold compiles, the two compilers in turn, each from empty caches (bench_traces.cold_caches): medians
    cold, ind_cold, notes = [], [], []
    for _ in range(1 if quick else COLD_SAMPLES):
        torch._dynamo.reset()
        with cold_caches():
            compiled = minicomp.compile(fn, backend=backend)
            cold.append((_timed_first_call(compiled, inputs)[0],) + compile_parts(compiled.report()))
        if ind_cold is None:
            continue
        torch._dynamo.reset()
        try:
            with cold_caches():
                ind_cold.append(_timed_first_call(torch.compile(fn), inputs)[0])
        except Exception as e:  # a machine without a C++ compiler: still show eager vs minicomp
            ind_cold = None
            notes.append(f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    compile_s, cold_own_s, llvm_s = (statistics.median(c[k] for c in cold) for k in range(3))
    inductor_compile_s = statistics.median(ind_cold) if ind_cold else None
    # Warm recompiles: the median of three for each compiler (a full garbage collection of a heap this
    # size takes 0.3 s and lands on one compile or another). No reset follows the last round: the
    # callables timed below are its compiles, and a reset would drop them.
    # Dynamo's own trace of the case (its `eager` backend compiles nothing) is the floor under both.
    again, ind_again, dynamo, traces = [], [], [], []
    for _ in range(AGAIN_SAMPLES):
        torch._dynamo.reset()
        with unprofiled():  # the floor without the guard profile, which minicomp.compile skips (guard_profile.py)
            traced = torch.compile(fn, backend="eager")
            dynamo.append(_timed_first_call(traced, inputs)[0] - _timed_first_call(traced, inputs)[0])  # less a run
            torch._dynamo.reset()
            traced = torch.compile(fn, backend=trace_only())
            traces.append(_timed_first_call(traced, inputs)[0] - _timed_first_call(traced, inputs)[0])
        torch._dynamo.reset()
        compiled = minicomp.compile(fn, backend=backend)
        s, actual = _timed_first_call(compiled, inputs)
        again.append(s)
        if inductor_compile_s is not None:
            inductor = torch.compile(fn)
            ind_again.append(_timed_first_call(inductor, inputs)[0])
    recompile_s, dynamo_s, trace_s = statistics.median(again), statistics.median(dynamo), statistics.median(traces)
    inductor_again_s = statistics.median(ind_again) if ind_again else None
    if inductor_compile_s is None:
        inductor = None
    own_s = compile_parts(compiled.report())[0]  # ours, without Dynamo/AOT tracing
    fresh = minicomp.compile(fn, backend=backend, recycle_outputs=False)  # every output newly allocated
    fresh(*inputs)
    err, scale = _max_err(actual, expected)
    ok = err <= TOLERANCE * max(1.0, scale)

    notes += [f"ran eagerly: {e}" for e in compiled.report().eager]
    externs = sorted({x for g in compiled.report().graphs for x in g.externs})
    if externs:
        notes.append(f"externs: {', '.join(externs)}")

    src = torch.randn(copy_elems, device=device)
    dst = torch.empty_like(src)
    fns = {"eager": lambda: fn(*inputs), "minicomp": lambda: compiled(*inputs), "copy": lambda: dst.copy_(src),
           "fresh": lambda: fresh(*inputs)}
    if inductor is not None:
        fns["inductor"] = lambda: inductor(*inputs)
    t = time_interleaved(fns, reps, sync=torch.cuda.synchronize if device != "cpu" else lambda: None)
    # where an overhead-bound call's host time goes, layer by layer (overhead.py), measured after the table's samples
    overhead = breakdown(compiled, inputs, reps) if device == "cpu" and t["minicomp"] < OVERHEAD_BOUND_S else None
    # the profiled call runs apart from the interleaved samples (and a little slower): its shares, not its times
    torch_s, kernel_s = time_split(fn, inputs, backend, reps) if device == "cpu" else (0.0, 0.0)
    share = torch_s / (torch_s + kernel_s) if torch_s + kernel_s > 0 else None

    # peak memory of one call beyond what was held before it; minicomp's arena is held between calls,
    # so it counts against us (the fresh-output program: a recycled output is memory never allocated)
    eager_peak = peak_bytes(fns["eager"])
    mc_peak = peak_bytes(fns["fresh"]) + sum(getattr(r, "arena_bytes", 0) for r in fresh.report().runs)
    moved = _nbytes(_tensors(inputs) + _state(fn) + _tensors(expected))
    copy_gbps = 2 * _nbytes([src]) / t["copy"] / 1e9
    gbps = moved / t["minicomp"] / 1e9
    return {
        "case": name, "shape": case.shape, "backend": backend,
        "eager_ms": t["eager"] * 1e3, "minicomp_ms": t["minicomp"] * 1e3,
        "inductor_ms": t["inductor"] * 1e3 if inductor is not None else None,
        "fresh_ms": t["fresh"] * 1e3,
        "vs_eager": t["minicomp"] / t["eager"],
        "vs_inductor": t["minicomp"] / t["inductor"] if inductor is not None else None,
        "fresh_vs_eager": t["fresh"] / t["eager"],
        "fresh_vs_inductor": t["fresh"] / t["inductor"] if inductor is not None else None,
        "bytes": moved, "gbps": gbps, "copy_gbps": copy_gbps, "pct_copy": 100 * gbps / copy_gbps,
        "compile_s": compile_s, "recompile_s": recompile_s, "own_s": own_s, "dynamo_s": dynamo_s, "trace_s": trace_s,
        "cold_own_s": cold_own_s, "llvm_s": llvm_s,
        # a compile whose own work cost nothing would still trace, then run the model once
        "trace_floor": (trace_s + t["minicomp"]) / inductor_compile_s if inductor_compile_s else None,
        "compile_vs_inductor": compile_s / inductor_compile_s if inductor_compile_s else None,
        "inductor_compile_s": inductor_compile_s, "inductor_again_s": inductor_again_s,
        "eager_peak_kib": eager_peak / 1024, "mc_peak_kib": mc_peak / 1024,
        "max_abs_err": err, "ok": ok, "notes": notes, "overhead_us": overhead,
        "torch_share": share,
        # mc/inductor if everything but the torch calls cost nothing (Inductor's matmuls as fast as ours)
        "floor": share * t["minicomp"] / t["inductor"] if share is not None and inductor is not None else None,
    }


def run_bench(cases=None, backend: str = "auto", reps: int | None = None, quick: bool = False,
              device: str = "cpu") -> list:
    """One row (a dict) per case; see format_table for the columns."""
    set_threads()
    reps = reps or (7 if quick else 30)
    copy_elems = (8 << 20) if quick else (32 << 20)
    names = list(cases or CASE_NAMES)
    rows = []
    with torch.no_grad():
        for i, name in enumerate(names, 1):
            progress(f"[{i}/{len(names)}] {name}: cold compiles (minicomp and torch.compile in turn, {1 if quick else COLD_SAMPLES} each), warm ones, then {reps} interleaved rounds")
            rows.append(bench_case(name, backend, reps, quick, copy_elems, device))
    return rows


def progress(message: str) -> None:
    """The benchmark's progress, on stderr (the table goes to stdout)."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def geomean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


COLUMNS = [  # (header, row key, format)
    ("case", "case", "{}"), ("shape", "shape", "{}"),
    ("eager ms", "eager_ms", "{:.3f}"), ("minicomp ms", "minicomp_ms", "{:.3f}"),
    ("inductor ms", "inductor_ms", "{:.3f}"), ("fresh ms", "fresh_ms", "{:.3f}"),
    ("mc/eager", "vs_eager", "{:.2f}"), ("mc/inductor", "vs_inductor", "{:.2f}"),
    ("torch calls", "torch_share", "{:.0%}"), ("floor", "floor", "{:.2f}"),
    ("GB/s", "gbps", "{:.1f}"), ("% copy", "pct_copy", "{:.0f}%"),
    ("compile s", "compile_s", "{:.2f}"), ("compile/ind.", "compile_vs_inductor", "{:.2f}"),
    ("cold own s", "cold_own_s", "{:.2f}"), ("llvm s", "llvm_s", "{:.2f}"),
    ("again s", "recompile_s", "{:.2f}"), ("own s", "own_s", "{:.2f}"),
    ("dynamo s", "dynamo_s", "{:.2f}"), ("trace s", "trace_s", "{:.2f}"), ("trace/ind.", "trace_floor", "{:.2f}"),
    ("inductor s", "inductor_compile_s", "{:.2f}"), ("ind. again s", "inductor_again_s", "{:.2f}"),
    ("eager peak KiB", "eager_peak_kib", "{:.0f}"), ("mc peak KiB", "mc_peak_kib", "{:.0f}"),
    ("max abs err", "max_abs_err", "{:.1e}"),
]


def format_table(rows: list) -> str:
    out = grid(rows, COLUMNS)
    good = [r for r in rows if r["ok"]]
    out.append(f"geomean over {len(good)} correct case(s): mc/eager {geomean(r['vs_eager'] for r in good):.2f}, "
               f"mc/inductor {geomean(r['vs_inductor'] for r in good):.2f}; with fresh outputs: "
               f"mc/eager {geomean(r['fresh_vs_eager'] for r in good):.2f}, "
               f"mc/inductor {geomean(r['fresh_vs_inductor'] for r in good):.2f}")
    if rows:
        out.append(f"copy bandwidth (dst.copy_(src), median over cases): "
                   f"{statistics.median(r['copy_gbps'] for r in rows):.1f} GB/s; "
                   f"compile s = first call, cold caches, median of {COLD_SAMPLES} (one with --quick); again s = a fresh compile of the same case in this process, median of 3 "
                   f"(Dynamo traces again; minicomp's graph cache then skips AOTAutograd, lowering, passes and code generation, "
                   f"as Inductor's caches skip its own); own s = minicomp's part of that (building the program, loading machine code); "
                   f"dynamo s = Dynamo's trace alone (backend='eager', same rounds; its first call less its second; Dynamo's guard profile skipped, as minicomp.compile skips it): what no Dynamo-based compile goes under; trace s = Dynamo and AOTAutograd with nothing compiled (same decompositions, same rounds), "
                   f"the part of a cold compile that is torch's, and trace/ind. that and one call over Inductor's cold compile: the least a compile through both can be; "
                   f"cold own s = minicomp's part of the cold compile (with the first call's wait for LLVM), llvm s = LLVM's O3, machine code and "
                   f"loading, in the background from the end of code generation; "
                   f"torch calls = the share of a profiled minicomp call's step time (medians summed) in torch calls: "
                   f"matmuls and convolutions through BLAS/oneDNN, as Inductor calls them; the rest is minicomp's kernels; "
                   f"floor = that share x mc/inductor: the ratio left if minicomp's own kernels cost nothing; "
                   f"fresh ms = minicomp with recycle_outputs=False: every output newly allocated, as eager and "
                   f"Inductor do (the timed loops drop each result, so minicomp's default reuses its memory); "
                   f"peak KiB = the most one call holds beyond what was allocated before it (torch.profiler's "
                   f"allocation record), minicomp's with fresh outputs and its arena added")
    bound = [r for r in rows if r.get("overhead_us")]
    if bound:
        out.append("per-call host time, us by layer (minicomp.overhead; measured layer by layer, so `other` is "
                   "the noise between separate samples):")
        out += ["  " + format_breakdown(r["case"], r["overhead_us"])
                + (f"  [torch.compile {r['inductor_ms'] * 1e3:.1f} us]" if r["inductor_ms"] is not None else "")
                for r in bound]
    out += [f"{r['case']}: {n}" for r in rows for n in r["notes"]]
    wrong = [r["case"] for r in rows if not r["ok"]]
    if wrong:
        out.append(f"WRONG (error above {TOLERANCE:g} x max(1, max|eager|)): {', '.join(wrong)}")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--dynamic" in argv:  # sizes that change between calls: its own table (bench_dynamic.py)
        from minicomp import bench_dynamic
        return bench_dynamic.main(argv)
    p = argparse.ArgumentParser(prog="python -m minicomp.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--cases", default=",".join(CASE_NAMES + TRAIN_CASES),
                   help="comma-separated, from: " + ", ".join(CASE_NAMES + EXTRA_CASES + TRAIN_CASES))
    p.add_argument("--device", default="cpu", help="where the inputs live: cpu or cuda")
    p.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 30, 7 with --quick)")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    everything = CASE_NAMES + EXTRA_CASES + TRAIN_CASES
    unknown = [c for c in cases if c not in everything]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(everything)}")
    skipped = [f"{c}: {unavailable(c)}" for c in cases if unavailable(c)]
    cases = [c for c in cases if not unavailable(c)]
    train = [c for c in cases if c in TRAIN_CASES]
    cases = [c for c in cases if c not in TRAIN_CASES]
    set_threads()
    print(f"machine: {machine()}")
    print(f"backend: {args.backend}{' (quick)' if args.quick else ''}")
    for line in skipped:
        print(f"skipped {line}")
    with tempfile.TemporaryDirectory(prefix="minicomp-bench-") as d:
        # cold compiles for both compilers: empty disk caches, private to this run
        os.environ["MINICOMP_CACHE_DIR"] = os.path.join(d, "minicomp")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(d, "inductor")
        rows = run_bench(cases, args.backend, args.reps, args.quick, args.device) if cases else []
        if rows:
            print(format_table(rows))
        train_rows = run_train(train, args.backend, args.reps, args.quick) if train else []
        if train_rows:
            print(("\n" if rows else "") + format_train_table(train_rows))
    return 0 if all(r["ok"] for r in rows + train_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
