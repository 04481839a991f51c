"""Sizes that change between calls: one symbolic program against a static program per size.

    python -m minicomp.bench --dynamic [--quick] [--cases a,b]

Each case runs at several sizes of its first input's leading dimension (the rows of a memory-bound
case, the sequence length of a transformer; a prime among them, so no size divides the vector width
or the thread split evenly). At each size four callables are timed interleaved, medians shown:
eager, minicomp's static program for that size (dynamic=False, compiled before timing), minicomp's
one symbolic program (dynamic="auto", the default: two warm-up calls at other sizes make it, with just
that dimension symbolic, and it then serves every size in the table), and torch.compile(dynamic=True). `dyn/static` is what one program for every size costs against
specializing; `dyn/ind.dyn` compares the two compilers' dynamic programs. Compile times: the
symbolic program's first call against one static compile (cold caches for both, in this run).
Outputs are recycled by minicomp (see bench.py); every call is checked against eager.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

import minicomp
from minicomp.bench_cases import make_case
from minicomp.timing import grid, machine, set_threads, time_interleaved

CASES = ["softmax", "layernorm_gelu", "rmsnorm_residual", "chain10", "gpt_block"]
FRACTIONS = (1.0, 0.61, 0.37, 0.13)  # of the case's own leading size; each rounded to a prime near it
TOLERANCE = 1e-4


def _prime_near(n: int) -> int:
    def prime(k):
        return k > 1 and all(k % d for d in range(2, int(k ** 0.5) + 1))
    while not prime(n):
        n += 1
    return n


def _resized(inputs, dim_size: int, dim: int):
    """The case's inputs with `dim` of every input of the first input's rank cut or grown to dim_size."""
    first = inputs[0]
    out = []
    for x in inputs:
        if x.dim() == first.dim() and x.shape[dim] == first.shape[dim]:
            shape = list(x.shape)
            shape[dim] = dim_size
            out.append(torch.randn(*shape, dtype=x.dtype, device=x.device))
        else:
            out.append(x)
    return tuple(out)


def _first_call_s(fn, inputs) -> float:
    t0 = time.perf_counter()
    fn(*inputs)
    return time.perf_counter() - t0


def bench_case(name: str, reps: int, quick: bool, backend: str) -> list:
    case = make_case(name, quick)
    fn = case.fn
    dim = 1 if name == "gpt_block" else 0  # a block's sequence length; the rows elsewhere
    base = case.inputs[0].shape[dim]
    fractions = (0.9,) + FRACTIONS[1:] if name == "gpt_block" else FRACTIONS  # its causal mask holds the block size
    sizes = sorted({_prime_near(max(2, int(base * f))) if f < 1 else base for f in fractions}, reverse=True)
    torch._dynamo.reset()  # (never after a compile the table times: it would drop its code)
    static_compile_s = _first_call_s(minicomp.compile(fn, backend=backend, dynamic=False),
                                     _resized(case.inputs, sizes[0], dim))
    warm = [s for s in range(sizes[0] - 3, 1, -1) if s not in sizes][:2]  # the static first program, then the symbolic one
    dynamic = minicomp.compile(fn, backend=backend)
    _first_call_s(dynamic, _resized(case.inputs, warm[0], dim))
    dyn_compile_s = _first_call_s(dynamic, _resized(case.inputs, warm[1], dim))
    inductor = torch.compile(fn, dynamic=True)
    rows = []
    for size in sizes:
        inputs = _resized(case.inputs, size, dim)
        static = minicomp.compile(fn, backend=backend, dynamic=False)
        static(*inputs)
        inductor(*inputs)
        want = fn(*inputs)
        got = dynamic(*inputs)
        err = max((a - b).abs().max().item() for a, b in zip(_flat(got), _flat(want)))
        scale = max(1.0, max(b.abs().max().item() for b in _flat(want)))
        t = time_interleaved({"eager": lambda: fn(*inputs), "static": lambda: static(*inputs),
                              "dynamic": lambda: dynamic(*inputs), "inductor": lambda: inductor(*inputs)}, reps)
        rows.append({"case": name, "size": f"{'T' if dim else 'rows'}={size}", "eager_ms": t["eager"] * 1e3,
                     "static_ms": t["static"] * 1e3, "dynamic_ms": t["dynamic"] * 1e3,
                     "inductor_ms": t["inductor"] * 1e3, "dyn_vs_static": t["dynamic"] / t["static"],
                     "dyn_vs_inductor": t["inductor"] and t["dynamic"] / t["inductor"],
                     "ok": err <= TOLERANCE * scale, "err": err, "programs": None, "compile": None})
    graphs = dynamic.report().graphs
    if not graphs[-1].detail.get("symbolic"):
        raise RuntimeError(f"{name}: the warm-up calls made no symbolic program")
    rows[0]["compile"] = f"dyn {dyn_compile_s:.2f} s / static {static_compile_s:.2f} s"
    rows[0]["programs"] = len(graphs) - 1  # the first warm-up's static program aside
    return rows


def _flat(out):
    return [out] if isinstance(out, torch.Tensor) else [x for x in out if isinstance(x, torch.Tensor)]


COLUMNS = [("case", "case", "{}"), ("size", "size", "{}"), ("eager ms", "eager_ms", "{:.3f}"),
           ("static ms", "static_ms", "{:.3f}"), ("dynamic ms", "dynamic_ms", "{:.3f}"),
           ("ind.dyn ms", "inductor_ms", "{:.3f}"), ("dyn/static", "dyn_vs_static", "{:.2f}"),
           ("dyn/ind.dyn", "dyn_vs_inductor", "{:.2f}"), ("max abs err", "err", "{:.1e}"),
           ("programs", "programs", "{}"), ("compile", "compile", "{}")]


def geomean(xs) -> float:
    xs = [x for x in xs if x]
    return statistics.geometric_mean(xs) if xs else float("nan")


def format_table(rows: list) -> str:
    out = grid(rows, COLUMNS)
    good = [r for r in rows if r["ok"]]
    out.append(f"geomean over {len(good)} sizes: dyn/static {geomean(r['dyn_vs_static'] for r in good):.2f}, "
               f"dyn/ind.dyn {geomean(r['dyn_vs_inductor'] for r in good):.2f}; programs = graphs minicomp "
               "built for the symbolic program over all the sizes (1: one program served them all)")
    wrong = sorted({r["case"] for r in rows if not r["ok"]})
    if wrong:
        out.append(f"WRONG (error above {TOLERANCE:g} x max(1, max|eager|)): {', '.join(wrong)}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minicomp.bench --dynamic", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--reps", type=int, default=None)
    args = p.parse_args([a for a in (argv or sys.argv[1:]) if a != "--dynamic"])
    set_threads()
    reps = args.reps or (7 if args.quick else 20)
    print(f"machine: {machine()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="minicomp-bench-") as d, torch.no_grad():
        os.environ["MINICOMP_CACHE_DIR"] = os.path.join(d, "minicomp")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(d, "inductor")
        for name in [c for c in args.cases.split(",") if c]:
            print(f"bench: {name}: compiling, then {reps} interleaved rounds per size", file=sys.stderr, flush=True)
            rows += bench_case(name, reps, args.quick, args.backend)
    print(format_table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
