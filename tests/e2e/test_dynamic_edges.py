"""Sizes that change, at their edges: sizes 0 and 1 after a symbolic program (guards Dynamo does not
check, sizes kept static), comparisons of sizes, and size forms torch's trace and ours write
differently. Every result is compared with eager, on cpu and cuda_emu."""
from __future__ import annotations

import re

import pytest
import torch

import minicomp


def _graphs(c, kind=None):
    return [g for g in c.report().graphs if kind is None or g.kind == kind]


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_slice_torch_sizes_under_its_own_guard_runs_in_torch_without_an_internal_warning(backend, caplog):
    """x[T//2 : T//2*2]: our length is T//2, torch's trace says T - T//2 under its guard that T is
    even. The two agree at the call's sizes but are not provably equal: the slice runs in torch, and
    that is no lowering bug to warn about."""
    def fn(x):
        t = x.shape[0]
        return x[t // 2: t // 2 * 2] * 2
    compiled = minicomp.compile(fn, backend=backend, dynamic=True)
    with caplog.at_level("INFO", logger="minicomp"):
        for n in (6, 7, 9, 10):
            x = torch.randn(n, 3)
            torch.testing.assert_close(compiled(x), fn(x))
    assert not [r for r in caplog.records if "internal" in r.getMessage()]
    assert any("not provably equal" in r.getMessage() for r in caplog.records)


SIZE_ZERO = {  # ops whose symbolic program guards its size non-zero, where Dynamo does not
    "cat_sum": lambda x, y: torch.cat([x, y]).sum(0),
    "tail": lambda x, y: x[1:] * 2 + y.sum(),
    "max_dim": lambda x, y: x.max(0).values + y[0],
    "argmin": lambda x, y: x.argmin(0),
    "amax_all": lambda x, y: x.amax() + y.sum(),
}


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
@pytest.mark.parametrize("name", sorted(SIZE_ZERO))
def test_size_zero_after_a_symbolic_program_runs_or_raises_as_eager(name, backend, caplog):
    """Dynamo reasons about sizes as if they were at least 2, so a guard of minicomp's like
    `s0 > 0` is not one Dynamo checks: a call of size 0 reaches the symbolic program. It runs the
    graph in torch then (right values, or torch's own error where eager raises), and says so once."""
    fn = SIZE_ZERO[name]
    compiled = minicomp.compile(fn, backend=backend)
    for n in (3, 5, 0, 4):
        x, y = torch.randn(n, 3), torch.randn(2, 3)
        try:
            want = fn(x, y)
        except (IndexError, RuntimeError) as e:
            with pytest.raises(type(e), match=re.escape(str(e).split(".")[0])):
                compiled(x, y)
            continue
        got = compiled(x, y)
        torch.testing.assert_close(got, want)
    assert len(_graphs(compiled)) == 2  # the static first call, then one symbolic program: no third
    assert sum("run the graph in torch" in e for e in compiled.report().eager) == 1


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_comparison_of_sizes_given_to_attention_over_lengths(backend):
    """`is_causal = T > 1 and mask is None` (HF's sdpa attention): a new length of 1 compiles static, as torch
    specializes sizes 0 and 1 (traced at 1, the comparison stayed symbolic, which sdpa refused: a
    graph break every decode step); other lengths share one symbolic program, where Dynamo decides
    the comparison under its own guard."""
    import torch.nn.functional as F
    torch.manual_seed(0)
    w = torch.randn(16, 16)

    def f(x, mask=None):
        q = (x @ w).view(x.shape[0], x.shape[1], 2, 8).transpose(1, 2)
        is_causal = q.shape[2] > 1 and mask is None
        return F.scaled_dot_product_attention(q, q, q, is_causal=is_causal).sum(1) * 2
    compiled = minicomp.compile(f, backend=backend)
    with torch.no_grad():
        for t in (5, 1, 2, 3, 1, 7):
            x = torch.randn(2, t, 16)
            torch.testing.assert_close(compiled(x), f(x))
    report = compiled.report()
    assert report.eager == []
    assert len(report.programs) == 3 and "symbolic" in report.programs[2]


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_graph_returning_a_comparison_of_sizes(backend):
    """A graph break after `big = x.shape[0] > 3` makes the comparison an output of the graph
    before it: its value at each call's sizes, not at the sizes it was compiled for."""
    def f(x):
        big = x.shape[0] > 3
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1 if big else y - 1
    compiled = minicomp.compile(f, backend=backend, dynamic=True)
    for n in (2, 5, 3, 7, 1):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), f(x))


def test_a_graph_break_names_what_the_op_said():
    """Dynamo's reason for passing a symbolic comparison to sdpa has an empty explanation; the
    report gives the op's own words instead."""
    import torch.nn.functional as F

    def f(x):
        q = x.view(x.shape[0], x.shape[1], 2, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q, is_causal=q.shape[2] > 1) * 2
    compiled = minicomp.compile(f, backend="cpu", dynamic=True)
    for t in (3, 5):
        x = torch.randn(2, t, 16)
        torch.testing.assert_close(compiled(x), f(x))
    assert any("is_causal" in e and "SymBool" in e for e in compiled.report().eager)


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
@pytest.mark.parametrize("train", [False, True])
def test_an_empty_batch_beside_a_symbolic_dimension(backend, train):
    """(2, 5, 8), (2, 3, 8), then (0, 4, 8): the third program has a static 0 beside a symbolic
    dimension, so every value in it is empty; such a value's shape held torch's SymInt, which the
    IR cannot print (the compile crashed in CSE)."""
    ln = torch.nn.LayerNorm(8)
    compiled = minicomp.compile(ln, backend=backend)
    for shape in [(2, 5, 8), (2, 3, 8), (0, 4, 8)]:
        x = torch.randn(shape, requires_grad=train)
        x_eager = x.detach().clone().requires_grad_(train)
        got, want = compiled(x), ln(x_eager)
        torch.testing.assert_close(got, want)
        if train:
            got.sum().backward()
            want.sum().backward()
            torch.testing.assert_close(x.grad, x_eager.grad)


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_comparison_of_sizes_in_training_and_a_variance_of_one_row(backend):
    """A comparison of sizes inside a training graph would be saved for the backward, which cannot
    take one: the graph gets a static program per size, as before size bools. A variance over a
    symbolic dimension at size 1 divides by n - 1 = 0: NaN, as eager (a float of sizes raised
    ZeroDivisionError there)."""
    def f(x):
        return x * (x.shape[0] > 3) + x.var(0)
    compiled = minicomp.compile(f, backend=backend, dynamic=True)
    for n in (5, 6, 2, 1):
        x = torch.randn(n, 4, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        got, want = compiled(x), f(x_eager)
        torch.testing.assert_close(got, want, equal_nan=True)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad, x_eager.grad, equal_nan=True)
