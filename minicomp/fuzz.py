"""Differential fuzzing: random programs, compiled by minicomp and run eagerly, compared.

    python -m minicomp.fuzz [--examples N] [--seed S] [--backend cpu,cuda_emu] [--save FOLDER]

Each program is Python source (so a failure prints as a program anyone can run): a few inputs of
random shapes (0-d, size-1 and odd sizes, sometimes non-contiguous) and dtypes (f32, f16, bf16, f64,
i32, i64, bool) holding normal values and sometimes NaN, +-inf, huge (1e30) and tiny (1e-30) ones,
then a chain of steps -- pointwise ops, broadcasting binaries, comparisons and where, reductions,
views, casts, matmuls, cat, index_select / gather / advanced indexing -- on values of the types
they take. A third of the programs train: f32 inputs require grad and the gradients of
sum(outputs * weights) are compared too. A mismatch beyond the dtype's tolerance, a crash where
eager did not raise, or eager raising where minicomp did not, is a finding -- except a difference
beyond tolerance where minicomp is as close as eager to the same program run in float64 (an
ill-conditioned result: sin of a large sum, a cancellation; an integer rounded from a float at a tie),
or as close as rounding each input once moves that float64 result (fuzz_judge.py judges).

What the generator does not draw, on purpose, because minicomp differs from eager there by design
(README, Numerics): sin/cos/tan of values beyond 2^24 (tanh bounds them), float-to-int casts of
NaN/Inf/out-of-range values (undefined in C; eager's results are the CPU's), gelu(+inf) (eager's vectorized path gives NaN,
its scalar path +inf, by the element's position: gelu's inputs are clamped to 1e4), and integer division by
zero on cuda_emu (a kernel cannot raise there).
"""
from __future__ import annotations

import argparse
import faulthandler
import math
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass

import torch

from .fuzz_judge import TOL, as_close_as_eager, compare, nudged, rounding_each_op

FLOATS = ("f32", "f16", "bf16", "f64")
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
          "i32": torch.int32, "i64": torch.int64, "b8": torch.bool}
SIZES = (1, 2, 3, 5, 7, 16, 33)
ROUNDED_RUNS = 4  # float64 runs rounding after each op, for an integer result (fuzz_judge.rounding_each_op)
UNARY_F = ("torch.neg({})", "torch.abs({})", "torch.relu({})", "torch.sigmoid({})", "torch.tanh({})",
           "torch.exp({})", "torch.log(torch.abs({}) + 1)", "torch.sqrt({})", "torch.erf({})",
           "torch.sin(torch.tanh({}) * 10)", "torch.cos(torch.tanh({}) * 10)", "F.gelu({}.clamp(max=1e4))", "F.silu({})",
           "torch.rsqrt(torch.abs({}) + 0.5)", "torch.floor({})", "torch.round({})", "({} * {} + 0.5)")
UNARY_I = ("torch.neg({})", "torch.abs({})", "torch.bitwise_not({})", "({} * 3 + 1)")
BINARY_F = ("torch.add", "torch.sub", "torch.mul", "torch.maximum", "torch.minimum", "torch.atan2",
            "lambda a, b: a / (torch.abs(b) + 1)", "lambda a, b: torch.where(a > b, a, b - 1)")
BINARY_I = ("torch.add", "torch.sub", "torch.mul", "torch.maximum", "torch.minimum",
            "lambda a, b: torch.div(a, torch.abs(b) + 1, rounding_mode='floor')",
            "lambda a, b: torch.remainder(a, torch.abs(b) + 1)", "torch.bitwise_xor")
GRAD_UNARY = ("torch.neg({})", "torch.sigmoid({})", "torch.tanh({})", "torch.exp(torch.tanh({}))",
              "torch.log(torch.abs({}) + 1)", "torch.sin({})", "F.gelu({})", "F.silu({})", "({} * {} + 0.5)")


@dataclass
class Value:
    name: str
    shape: tuple
    dtype: str

    @property
    def kind(self) -> str:
        return "float" if self.dtype in FLOATS else ("bool" if self.dtype == "b8" else "int")


class Generator:
    """Draws one program: source text and the inputs to call it with."""

    def __init__(self, seed: int, training: bool):
        self.r = random.Random(seed)
        self.seed, self.training = seed, training
        self.vals: list = []
        self.lines: list = []
        self.inputs: list = []   # (name, shape, dtype, special values?, contiguous?, index bound)

    def shape(self, rank=None) -> tuple:
        rank = self.r.choice((0, 1, 2, 2, 3)) if rank is None else rank
        return tuple(self.r.choice(SIZES) for _ in range(rank))

    def new_input(self, shape, dtype, index_bound=None) -> Value:
        v = Value(f"x{len(self.inputs)}", tuple(shape), dtype)
        special = dtype in FLOATS and not self.training and self.r.random() < 0.3
        self.inputs.append((v.name, v.shape, dtype, special, self.r.random() < 0.8, index_bound))
        self.vals.append(v)
        return v

    def emit(self, expr: str, shape, dtype) -> Value:
        v = Value(f"v{len(self.lines)}", tuple(shape), dtype)
        self.lines.append(f"    {v.name} = {expr}")
        self.vals.append(v)
        return v

    def pick(self, kind=None, pred=lambda v: True) -> Value | None:
        pool = [v for v in self.vals if (kind is None or v.kind == kind) and pred(v)]
        if not pool:
            return None
        return pool[-1] if self.r.random() < 0.5 else self.r.choice(pool)  # mostly a chain

    def step(self) -> None:
        kinds = ["unary", "binary", "binary", "reduce", "view", "view", "matmul"]
        if not self.training:
            kinds += ["compare", "cast", "cat", "index"]
        else:
            kinds += ["cat", "index"]
        getattr(self, "_" + self.r.choice(kinds))()

    # -- steps --------------------------------------------------------------------------------------
    def _unary(self):
        x = self.pick("float" if self.training else None, lambda v: v.kind != "bool")
        if x is None:
            return
        forms = GRAD_UNARY if self.training else (UNARY_F if x.kind == "float" else UNARY_I)
        self.emit(self.r.choice(forms).format(x.name, x.name), x.shape, x.dtype)

    def _binary(self):
        x = self.pick("float" if self.training else None, lambda v: v.kind != "bool")
        if x is None:
            return
        ys = [v for v in self.vals if v.dtype == x.dtype and _broadcast(x.shape, v.shape) is not None]
        y = self.r.choice(ys)
        fn = self.r.choice(BINARY_F if x.kind == "float" else BINARY_I)
        if self.training and fn == "torch.atan2":
            fn = "torch.mul"
        self.emit(f"({fn})({x.name}, {y.name})", _broadcast(x.shape, y.shape), x.dtype)

    def _compare(self):
        x = self.pick(None, lambda v: v.kind != "bool")
        if x is None:
            return
        ys = [v for v in self.vals if v.dtype == x.dtype and _broadcast(x.shape, v.shape) is not None]
        y = self.r.choice(ys)
        shape = _broadcast(x.shape, y.shape)
        c = self.emit(f"{x.name} {self.r.choice(('<', '>', '==', '!=', '<='))} {y.name}", shape, "b8")
        if self.r.random() < 0.5:
            self.emit(f"torch.where({c.name}, {x.name}, {y.name})", shape, x.dtype)
        elif self.r.random() < 0.5:
            other = self.pick("bool", lambda v: _broadcast(v.shape, shape) is not None)
            self.emit(f"torch.logical_{self.r.choice(('and', 'or', 'xor'))}({c.name}, {other.name})",
                      _broadcast(other.shape, shape), "b8")

    def _cast(self):
        x = self.pick()
        to = self.r.choice(("f32", "f16", "bf16", "i32", "i64", "b8", "f64"))
        if x.kind == "float" and to in ("i32", "i64"):  # defined values only: bounded, integral
            self.emit(f"(torch.nan_to_num(torch.tanh({x.name})) * 100).round().to(torch.{_torch_name(to)})",
                      x.shape, to)
        else:
            self.emit(f"{x.name}.to(torch.{_torch_name(to)})", x.shape, to)

    def _reduce(self):
        x = self.pick("float" if self.training else None, lambda v: v.shape != () and v.kind != "bool")
        if x is None:
            return
        nd = len(x.shape)
        dims = tuple(sorted(self.r.sample(range(nd), self.r.randint(1, nd))))
        keep = self.r.random() < 0.5
        out = tuple(1 if i in dims else s for i, s in enumerate(x.shape)) if keep else \
            tuple(s for i, s in enumerate(x.shape) if i not in dims)
        d = dims[0]
        if x.kind == "int":
            form, shape, dt = self.r.choice((
                (f"{x.name}.sum({dims}, keepdim={keep})", out, "i64"),
                (f"{x.name}.amax({dims}, keepdim={keep})", out, x.dtype),
                (f"{x.name}.argmax({d}, keepdim={keep})", _reduced(x.shape, d, keep), "i64")))
        else:
            forms = [(f"{x.name}.sum({dims}, keepdim={keep})", out), (f"{x.name}.mean({dims}, keepdim={keep})", out),
                     (f"{x.name}.amax({dims}, keepdim={keep})", out),
                     (f"torch.logsumexp({x.name}, {dims}, keepdim={keep})", out),
                     (f"torch.softmax({x.name}, {d})", x.shape), (f"torch.log_softmax({x.name}, {d})", x.shape),
                     (f"{x.name}.var({dims}, keepdim={keep}, correction=0)", out)]
            if not self.training:
                forms.append((f"{x.name}.argmax({d}, keepdim={keep}).to({x.name}.dtype)", _reduced(x.shape, d, keep)))
            form, shape = self.r.choice(forms)
            dt = x.dtype
        self.emit(form, shape, dt)

    def _view(self):
        x = self.pick()
        shape, nd = x.shape, len(x.shape)
        options = ["unsqueeze", "reshape", "contiguous_t"] + (["permute"] if nd >= 2 else []) + \
            (["expand"] if 1 in shape else []) + (["slice"] if any(s >= 2 for s in shape) else [])
        name = self.r.choice(options)
        if name == "unsqueeze":
            d = self.r.randint(0, nd)
            self.emit(f"{x.name}.unsqueeze({d})", shape[:d] + (1,) + shape[d:], x.dtype)
        elif name == "permute" or (name == "contiguous_t" and nd >= 2):
            perm = list(range(nd))
            self.r.shuffle(perm)
            tail = ".contiguous()" if name == "contiguous_t" else ""
            self.emit(f"{x.name}.permute({tuple(perm)}){tail}", tuple(shape[p] for p in perm), x.dtype)
        elif name == "expand":
            new = tuple(self.r.choice((3, 4)) if s == 1 else s for s in shape)
            self.emit(f"{x.name}.expand({new})", new, x.dtype)
        elif name == "slice":
            d = self.r.choice([i for i, s in enumerate(shape) if s >= 2])
            start, step = self.r.randint(0, 1), self.r.randint(1, 2)
            n = len(range(start, shape[d], step))
            self.emit(f"{x.name}[{'(slice(None),) * ' + str(d) + ' + ' if d else ''}(slice({start}, None, {step}),)]",
                      shape[:d] + (n,) + shape[d + 1:], x.dtype)
        else:
            n, dims = math.prod(shape), []
            for f in self.r.sample((2, 3, 5, 7), self.r.randint(0, 3)):
                if n % f == 0:
                    dims.append(f)
                    n //= f
            dims.append(n)
            self.r.shuffle(dims)
            self.emit(f"{x.name}.reshape({tuple(dims)})", tuple(dims), x.dtype)

    def _matmul(self):
        x = self.pick("float", lambda v: len(v.shape) in (2, 3) and v.dtype in ("f32", "f64"))
        if x is None:
            return
        n = self.r.choice((1, 4, 8, 17))
        w = self.new_input(x.shape[:-2] + (x.shape[-1], n), x.dtype)
        self.emit(f"{x.name} @ {w.name}", x.shape[:-1] + (n,), x.dtype)

    def _cat(self):
        x = self.pick("float" if self.training else None, lambda v: v.shape != ())
        if x is None:
            return
        d = self.r.randrange(len(x.shape))
        self.emit(f"torch.cat([{x.name}, {x.name} * 2 if {x.name}.dtype != torch.bool else ~{x.name}], {d})",
                  x.shape[:d] + (2 * x.shape[d],) + x.shape[d + 1:], x.dtype)

    def _index(self):
        x = self.pick("float" if self.training else None, lambda v: v.shape != ())
        if x is None:
            return
        d = self.r.randrange(len(x.shape))
        form = self.r.choice(("index_select", "gather", "advanced"))
        if form == "gather":
            shape = tuple(self.r.randint(1, s) for s in x.shape)
            idx = self.new_input(shape, "i64", index_bound=x.shape[d])
            self.emit(f"torch.gather({x.name}, {d}, {idx.name})", shape, x.dtype)
            return
        k = self.r.choice((1, 3, 9))
        idx = self.new_input((k,), "i64", index_bound=x.shape[d])
        if form == "index_select":
            self.emit(f"torch.index_select({x.name}, {d}, {idx.name})", x.shape[:d] + (k,) + x.shape[d + 1:], x.dtype)
        else:
            self.emit(f"{x.name}[{idx.name}]", (k,) + x.shape[1:], x.dtype)

    def program(self):
        for _ in range(self.r.randint(1, 3)):
            dt = "f32" if self.training else self.r.choice(("f32", "f32", "f32", "f16", "bf16", "f64", "i32", "i64", "b8"))
            self.new_input(self.shape(), dt)
        for _ in range(self.r.randint(2, 9)):
            self.step()
        outs = [v for v in self.vals if v.name.startswith("v")]
        if not outs:
            self.emit(f"{self.vals[0].name} + {self.vals[0].name}" if self.vals[0].kind != "bool"
                      else f"~{self.vals[0].name}", self.vals[0].shape, self.vals[0].dtype)
            outs = [self.vals[-1]]
        if self.training:
            outs = [v for v in outs if v.kind == "float"] or outs
        chosen = sorted(set([outs[-1].name] + [v.name for v in self.r.sample(outs, min(2, len(outs)))]),
                        key=lambda n: int(n[1:]))
        args = ", ".join(n for n, *_ in self.inputs)
        src = "\n".join([f"def program({args}):"] + self.lines + [f"    return ({', '.join(chosen)},)"]) + "\n"
        return src, self.make_inputs()

    def make_inputs(self) -> list:
        gen = torch.Generator().manual_seed(self.seed)
        out = []
        for name, shape, dtype, special, contiguous, bound in self.inputs:
            if bound is not None:
                t = torch.randint(0, bound, shape, generator=gen)
            elif dtype in FLOATS:
                t = torch.randn(shape, generator=gen, dtype=torch.float64) * 2
                if special and t.numel():
                    flat = t.view(-1)
                    for v in (math.nan, math.inf, -math.inf, 1e30, -1e30, 1e-30, 0.0, -0.0):
                        if torch.rand((), generator=gen) < 0.3:
                            flat[torch.randint(0, flat.numel(), (), generator=gen)] = v
                t = t.to(DTYPES[dtype])
            elif dtype == "b8":
                t = torch.rand(shape, generator=gen) < 0.5
            else:
                t = torch.randint(-20, 21, shape, generator=gen, dtype=DTYPES[dtype])
            if not contiguous and t.ndim >= 2:
                t = t.transpose(0, 1).contiguous().transpose(0, 1)
            if self.training and dtype == "f32" and bound is None:
                t.requires_grad_(True)
            out.append(t)
        return out


def _torch_name(dt: str) -> str:
    return str(DTYPES[dt]).split(".")[1]


def _broadcast(a, b):
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


def _reduced(shape, d, keep):
    return tuple(1 if i == d else s for i, s in enumerate(shape)) if keep else shape[:d] + shape[d + 1:]


def run_one(seed: int, backend: str) -> tuple[str, str, str | None]:
    """(outcome: ok | mismatch | crash, the program's source, what went wrong)."""
    import minicomp
    training = seed % 3 == 0
    gen = Generator(seed, training)
    src, inputs = gen.program()
    coarsest = max((TOL[v.dtype] for v in gen.vals if v.dtype in TOL and v.dtype != "f64"), default=0.0)
    coarsest_dtype = max((v.dtype for v in gen.vals if v.dtype in FLOATS),
                         key=lambda d: torch.finfo(DTYPES[d]).eps, default="f64")
    ns = {"torch": torch, "F": torch.nn.functional}
    exec(compile(src, f"<fuzz program {seed}>", "exec"), ns)
    fn = ns["program"]

    def call(f, xs, weight_dtypes=None):
        outs = f(*xs)
        if not training:
            return list(outs), []
        diff = [o for o in outs if o.requires_grad]
        leaves = [x for x in xs if x.requires_grad]
        if not diff or not leaves:
            return list(outs), []
        gen = torch.Generator().manual_seed(seed)
        dtypes = weight_dtypes or [o.dtype for o in diff]  # the float64 run draws the same weights
        weights = [torch.randn(o.shape, generator=gen, dtype=dt).to(o.dtype) for o, dt in zip(diff, dtypes)]
        grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(diff, weights)), leaves, allow_unused=True)
        return list(outs), list(grads)

    def fresh():
        return [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    try:
        want, want_grads = call(fn, fresh())
    except Exception:  # an invalid program (the generator's fault, not a finding)
        return "skip", src, None
    try:
        got, got_grads = call(minicomp.compile(fn, backend=backend), fresh())
    except Exception as e:  # noqa: BLE001
        return "crash", src, "".join(traceback.format_exception_only(type(e), e)).strip()[:2000]
    why = compare(got, want, "output", coarsest) or compare(got_grads, want_grads, "grad", coarsest)
    if why and ("max error" in why or "elements differ" in why):  # a float, or an int rounded from one
        weights = [o.dtype for o in want if o is not None and o.requires_grad]  # both float64 runs draw eager's weights
        try:  # the same program in float64, and again on inputs moved by one rounding each (fuzz_judge.py)
            wide = [x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x.clone()
                    for x in inputs]
            ref, ref_grads = call(fn, wide, weights)
            moved, moved_grads = call(fn, nudged(inputs, seed), weights)
            rounded = []
            if any(o is not None and not o.is_floating_point() for o in want):  # an integer result: ties
                for k in range(ROUNDED_RUNS):
                    with rounding_each_op(torch.finfo(DTYPES[coarsest_dtype]).eps, seed + k):
                        rounded.append(sum(call(fn, wide, weights), []))
        except Exception:  # noqa: BLE001 -- a program that does not run in float64 keeps its finding
            ref = None
        if ref is not None and as_close_as_eager(got + got_grads, want + want_grads, ref + ref_grads,
                                                 moved + moved_grads, rounded):
            return "ok", src, None
    return ("mismatch" if why else "ok"), src, why


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minicomp.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="the first program's seed; program i uses seed + i")
    p.add_argument("--backend", default="cpu", help="comma-separated: cpu, cuda_emu, interpret")
    p.add_argument("--save", default=None, help="a folder for each failing program's source and error")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    import logging
    logging.getLogger("minicomp").setLevel(logging.ERROR)  # internal-lowering warnings are not findings
    counts, t0 = {}, time.perf_counter()
    failures = []
    faulthandler.enable()  # a crash in generated code prints where it was
    running = os.path.join(args.save, "running.txt") if args.save else None
    if running:
        os.makedirs(args.save, exist_ok=True)
    for backend in args.backend.split(","):
        for i in range(args.examples):
            torch._dynamo.reset()
            if running:  # left behind by a hard crash (a segfault), naming the program that caused it
                with open(running, "w") as f:
                    f.write(f"{backend} seed {args.seed + i}\n")
            outcome, src, why = run_one(args.seed + i, backend)
            counts[(backend, outcome)] = counts.get((backend, outcome), 0) + 1
            if outcome in ("mismatch", "crash"):
                failures.append((backend, args.seed + i, outcome, src, why))
                print(f"{backend} seed {args.seed + i}: {outcome}: {why}\n{src}", file=sys.stderr)
                if args.save:
                    os.makedirs(args.save, exist_ok=True)
                    with open(os.path.join(args.save, f"{backend}_{args.seed + i}.py"), "w") as f:
                        f.write(f"# {outcome}: {why}\n{src}")
            if not args.quiet and (i + 1) % 100 == 0:
                print(f"fuzz: {backend}: {i + 1}/{args.examples} programs, {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr, flush=True)
    if running:
        os.remove(running)
    for backend in args.backend.split(","):
        tried = sum(v for (b, o), v in counts.items() if b == backend and o != "skip")
        print(f"{backend}: {tried} programs tried (seeds {args.seed}..{args.seed + args.examples - 1}), "
              f"{counts.get((backend, 'mismatch'), 0)} mismatches, {counts.get((backend, 'crash'), 0)} crashes, "
              f"{counts.get((backend, 'skip'), 0)} invalid programs skipped")
    print(f"{time.perf_counter() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
