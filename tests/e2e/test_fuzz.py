"""Fuzz the CPU backend: random graphs of pointwise, reduction and view ops, compiled and compared with eager.

Hypothesis draws a program -- a few inputs with random shapes (size-1 dims, 0-d), then a chain of steps,
each a unary op, a broadcasting binary op on two earlier values, a reduction over random dims (keepdim
either way), or a view (permute, transpose, expand, slice, reshape, unsqueeze) -- while running it on
small tensors to know every value's shape. The program returns its last value and a few earlier ones,
so kernels get several outputs and values used by several kernels. Ops are chosen to stay finite
(exp of a tanh, log of 1 + |x|), so a mismatch is a compiler bug, not a rounding disagreement.
Derandomized: CI sees the same examples every run; a failing example prints as a readable program.
"""
from __future__ import annotations

import math

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.helpers import assert_matches_eager  # noqa: E402

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "sin": torch.sin, "exp_tanh": lambda x: torch.exp(torch.tanh(x)), "log1p_abs": lambda x: torch.log1p(x.abs()),
    "sqrt_abs": lambda x: torch.sqrt(x.abs() + 1), "square": lambda x: x * x, "gelu": torch.nn.functional.gelu,
    "scale": lambda x: x * 0.5 + 1.0,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum,
    "div": lambda x, y: x / (y.abs() + 1), "where": lambda x, y: torch.where(x > y, x, y - 1),
}
REDUCE = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k), "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k), "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k, correction=0),
    "logsumexp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
    # single-dim reductions: the dims tuple holds one dim
    "softmax": lambda x, d, k: torch.softmax(x, d[0]), "log_softmax": lambda x, d, k: torch.log_softmax(x, d[0]),
    "argmax": lambda x, d, k: x.argmax(d[0], keepdim=k).float(), "max": lambda x, d, k: x.max(d[0], keepdim=k)[0],
}
SINGLE_DIM = ("softmax", "log_softmax", "argmax", "max")
SIZES = (1, 2, 3, 5, 7, 33)


def run_program(program, inputs):
    """Replay `program` (a list of steps) on `inputs`; returns the list of all values."""
    vals = list(inputs)
    for step in program:
        kind, name, args = step[0], step[1], step[2:]
        if kind == "unary":
            vals.append(UNARY[name](vals[args[0]]))
        elif kind == "binary":
            vals.append(BINARY[name](vals[args[0]], vals[args[1]]))
        elif kind == "reduce":
            vals.append(REDUCE[name](vals[args[0]], args[1], args[2]))
        else:
            vals.append(_view(name, vals[args[0]], args[1]))
    return vals


def _view(name, x, arg):
    if name == "permute":
        return x.permute(arg)
    if name == "transpose":
        return x.transpose(*arg)
    if name == "expand":
        return x.expand(arg)
    if name == "slice":
        dim, start, step = arg
        return x[(slice(None),) * dim + (slice(start, None, step),)]
    if name == "reshape":
        return x.reshape(arg)
    return x.unsqueeze(arg)  # unsqueeze


def _draw_view(draw, x):
    """A view step valid for a value of x's shape: (name, arg)."""
    shape, nd = tuple(x.shape), x.ndim
    options = ["unsqueeze", "reshape"]
    if nd >= 2:
        options += ["permute", "transpose"]
    if 1 in shape:
        options.append("expand")
    if any(s >= 2 for s in shape):
        options.append("slice")
    name = draw(st.sampled_from(options))
    if name == "unsqueeze":
        return name, draw(st.integers(0, nd))
    if name == "permute":
        return name, tuple(draw(st.permutations(range(nd))))
    if name == "transpose":
        return name, tuple(draw(st.lists(st.integers(0, nd - 1), min_size=2, max_size=2, unique=True)))
    if name == "expand":
        return name, tuple(draw(st.sampled_from((3, 4))) if s == 1 else s for s in shape)
    if name == "slice":
        dim = draw(st.sampled_from([d for d, s in enumerate(shape) if s >= 2]))
        return name, (dim, draw(st.integers(0, 1)), draw(st.integers(1, 2)))
    # reshape: regroup the element count into a few random factors
    n, dims = math.prod(shape), []
    for f in draw(st.lists(st.sampled_from((2, 3, 5, 7)), max_size=3)):
        if n % f == 0:
            dims.append(f)
            n //= f
    dims.append(n)
    return name, tuple(draw(st.permutations(dims)))


@st.composite
def programs(draw):
    """(program, inputs, output indices): a random graph as data, runnable by run_program. Inputs of
    about half the programs require grad, so their backward graphs are compiled and compared too."""
    n_in = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2 ** 16))
    gen = torch.Generator().manual_seed(seed)
    shapes = [tuple(draw(st.lists(st.sampled_from(SIZES), min_size=0 if i else 1, max_size=3))) for i in range(n_in)]
    inputs = [torch.randn(s, generator=gen) for s in shapes]
    if draw(st.booleans()) and inputs[0].ndim >= 2:  # a non-contiguous input
        inputs[0] = inputs[0].transpose(0, 1).contiguous().transpose(0, 1)
    vals, program = list(inputs), []
    for _ in range(draw(st.integers(2, 8))):
        i = draw(st.one_of(st.just(len(vals) - 1), st.integers(0, len(vals) - 1)))  # mostly a chain
        x = vals[i]
        kind = draw(st.sampled_from(("unary", "binary", "binary", "reduce", "view", "view")))
        if kind == "reduce" and x.ndim == 0:
            kind = "unary"
        if kind == "unary":
            step = ("unary", draw(st.sampled_from(sorted(UNARY))), i)
        elif kind == "binary":
            ok = [j for j, v in enumerate(vals) if _broadcastable(x.shape, v.shape)]
            step = ("binary", draw(st.sampled_from(sorted(BINARY))), i, draw(st.sampled_from(ok)))
        elif kind == "reduce":
            name = draw(st.sampled_from(sorted(REDUCE)))
            count = 1 if name in SINGLE_DIM else draw(st.integers(1, x.ndim))
            dims = tuple(sorted(draw(st.lists(st.integers(0, x.ndim - 1), min_size=count, max_size=count,
                                              unique=True))))
            step = ("reduce", name, i, dims, draw(st.booleans()))
        else:
            view_name, arg = _draw_view(draw, x)
            step = ("view", view_name, i, arg)
        program.append(step)
        vals = run_program(program, inputs)
    first, last = len(inputs), len(vals) - 1  # step results; the last is always an output
    extra = draw(st.lists(st.integers(first, last - 1), max_size=2, unique=True)) if last > first else []
    if draw(st.booleans()):
        inputs = [x.requires_grad_() for x in inputs]
    return program, inputs, sorted(extra) + [last]


def _broadcastable(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


def as_function(program, outputs):
    def fn(*inputs):
        vals = run_program(program, inputs)
        return tuple(vals[o] for o in outputs)
    return fn


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_random_graphs_match_eager(case):
    program, inputs, outputs = case
    fn = as_function(program, outputs)
    differentiable = any(o.requires_grad for o in fn(*inputs))  # argmax alone has no gradient
    assert_matches_eager(fn, *inputs, backend="cpu", grad=differentiable, rtol=1e-4, atol=1e-5)
