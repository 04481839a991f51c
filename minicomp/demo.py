"""The main job: compile one GPT-style transformer block and show that it is right, and how fast.

    python -m minicomp.demo [--backend NAME] [--debug [LEVEL|DIR]] [--reps N]

The block (LayerNorm, causal self-attention with softmax, GELU MLP, residuals) covers the three
kinds of work the compiler sees: matrix multiplies (extern calls into BLAS), reductions
(LayerNorm, softmax) and pointwise chains (GELU, scaling, residual adds). The demo checks the
forward output and every gradient of one training step against eager PyTorch, prints what the
compiler did (`compiled.report()`), and times eager against compiled. It exits non-zero when the
error exceeds the tolerance, so it doubles as a smoke test.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import dataclass

import torch

import minicomp
from minicomp.options import BACKENDS

from minicomp.timing import set_threads, time_interleaved
from minicomp.models import Block


@dataclass
class DemoResult:
    forward_err: float       # max |compiled - eager| of the block's output
    grad_err: float          # max over the input and every parameter gradient of one training step
    compile_s: float         # first training call, compile included
    times_ms: dict           # {"eager inference": ms, "compiled inference": ms, "eager train": ..., ...}
    report: str


def _max_err(actual, expected) -> float:
    return max((a.detach() - e.detach()).abs().max().item() for a, e in zip(actual, expected))


def run_demo(backend="auto", debug=False, reps=20, shape=(4, 64, 128, 4)) -> DemoResult:
    B, T, C, H = shape
    torch.manual_seed(0)
    eager = Block(C, H, T)
    model = copy.deepcopy(eager)
    compiled = minicomp.compile(model, backend=backend, debug=debug)
    x = torch.randn(B, T, C)
    weight = torch.randn(B, T, C)  # loss = sum(out * weight): every output element gets its own gradient

    def train_step(m, xi):
        m.zero_grad(set_to_none=True)
        xi.grad = None
        out = m(xi)
        (out * weight).sum().backward()
        return out

    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_e = train_step(eager, xe)
    t0 = time.perf_counter()
    out_c = train_step(compiled, xc)
    compile_s = time.perf_counter() - t0
    grads_e = [xe.grad] + [p.grad for p in eager.parameters()]
    grads_c = [xc.grad] + [p.grad for p in model.parameters()]
    forward_err = _max_err([out_c], [out_e])
    grad_err = _max_err(grads_c, grads_e)

    def infer(m):
        with torch.no_grad():
            return m(x)
    infer(compiled)  # compile the inference signature before timing
    times = time_interleaved({
        "eager inference": lambda: infer(eager),
        "compiled inference": lambda: infer(compiled),
        "eager train step": lambda: train_step(eager, xe),
        "compiled train step": lambda: train_step(compiled, xc),
    }, reps)
    return DemoResult(forward_err, grad_err, compile_s, {k: v * 1e3 for k, v in times.items()},
                      str(compiled.report()))


def _debug_arg(text: str):
    """--debug alone: level 1; --debug 2: that level; --debug DIR: dump every stage into DIR."""
    return int(text) if text.isdigit() else text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minicomp.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--debug", nargs="?", const=True, default=False, type=_debug_arg,
                   help="print what the compiler does (a level 1-3, or a folder to dump every stage into)")
    p.add_argument("--reps", type=int, default=20, help="interleaved timing repetitions (median reported)")
    p.add_argument("--shape", default="4,64,128,4", help="B,T,C,heads")
    p.add_argument("--tol", type=float, default=1e-3, help="max abs error allowed (forward and gradients)")
    args = p.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    set_threads()

    r = run_demo(args.backend, args.debug, args.reps, shape)
    print(f"GPT block B,T,C,heads = {shape}, backend={args.backend}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(r.report)
    print(f"first training call (compile included): {r.compile_s:.2f} s")
    print(f"max abs error vs eager: forward {r.forward_err:.2e}, gradients {r.grad_err:.2e} (tolerance {args.tol:g})")
    for what in ("inference", "train step"):
        e, c = r.times_ms[f"eager {what}"], r.times_ms[f"compiled {what}"]
        print(f"{what:>10}: eager {e:8.3f} ms   compiled {c:8.3f} ms   compiled/eager {c / e:5.2f}x "
              f"(median of {args.reps} interleaved runs)")
    if max(r.forward_err, r.grad_err) > args.tol:
        print("FAIL: compiled result differs from eager beyond the tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
