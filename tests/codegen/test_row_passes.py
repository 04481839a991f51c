"""Passes over a row (codegen/row_passes.py). A store that reads none of the last stage's results
runs in an earlier stage's loop, so its value is computed once (row kernels and reductions down
columns). A costly value a later pass needs is kept in a row buffer: the plan picks costly values
only, and the kernel computes them once per element. Every kind of kernel this changes matches eager:
layer_norm over a GELU, softmax over an exp, a GELU gradient summed down columns, two inner dims,
every float dtype, NaN and Inf, split across threads, and the cases that keep nothing (symbolic
rows, rows too long for the budget)."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from minicomp.codegen import row_passes
from minicomp.codegen.collapse import collapse
from minicomp.codegen.llvm_module import generate_module
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import parse
from tests.codegen.test_cpu_ops import compare_compiled, cpu_context, values

NAN, INF = float("nan"), float("inf")


def _kernels(text: str) -> list:
    g = parse(text)
    return [collapse(n.meta["kernel"]) for n in run_passes(g, cpu_context(g)).nodes if n.op == "kernel"]


def _erf_then_variance(n: int, op: str = "erf") -> str:
    """A row's variance of op(x), and op(x) centred and scaled: three passes over each row that all
    need op(x)."""
    return (f"graph g(%x: f32[16,{n}]) -> (f32[16,1], f32[16,{n}]) {{\n"
            f"  %0: f32[16,{n}] = {op} %x\n"
            f"  %1: f32[16,1] = sum %0 [dims=(1,), keepdim=true]\n"
            f"  %2: f32[16,{n}] = sub %0 %1\n"
            f"  %3: f32[16,{n}] = mul %2 %2\n"
            f"  %4: f32[16,1] = sum %3 [dims=(1,), keepdim=true]\n"
            f"  %5: f32[16,{n}] = mul %2 %4\n"
            "  return %4, %5\n}")


def test_a_costly_value_is_computed_in_one_pass_and_loaded_in_the_others():
    ks = _kernels(_erf_then_variance(512))
    assert len(ks) == 1 and len(ks[0].stages) == 2 and ks[0].inner_stores
    kept = list(row_passes.plan(ks[0], row_passes.elem_bytes).values())
    assert [(e.op, source, users) for e, source, users in kept] == [("erf", 0, {1, 2})]
    text, _ = generate_module(ks, whole=lambda k: True)
    assert len(re.findall(r'call float @"minicomp_erf"', text)) == 1  # not once per pass
    assert re.search(r"alloca float, i64 512", text)


def test_cheap_values_are_computed_again():
    """x - mean is a load and two ops: loading it from a row buffer would cost as much."""
    ks = _kernels(_erf_then_variance(512, op="neg"))
    assert row_passes.plan(ks[0], row_passes.elem_bytes) == {}


def test_a_softmax_keeps_no_row_buffer():
    """softmax's last stage writes exp(x - max) into the output as it sums it (prestores), and the
    stores only scale the output: no pass needs the exp again, so no row buffer and no alloca."""
    ks = _kernels("graph g(%x: f32[64,2048]) -> (f32[64,2048]) {\n"
                  "  %0: f32[64,1] = amax %x [dims=(1,), keepdim=true]\n  %1: f32[64,2048] = sub %x %0\n"
                  "  %2: f32[64,2048] = exp %1\n  %3: f32[64,1] = sum %2 [dims=(1,), keepdim=true]\n"
                  "  %4: f32[64,2048] = div %2 %3\n  return %4\n}")
    _, finish = row_passes.prestores(ks[0])
    assert finish and row_passes.plan(ks[0], row_passes.elem_bytes, finish) == {}
    text, _ = generate_module(ks, whole=lambda k: True)
    assert "alloca float, i64" not in text


def test_rows_past_the_budget_keep_nothing():
    n = row_passes.MAX_BYTES // 4 + 1
    ks = _kernels(_erf_then_variance(n))
    assert row_passes.plan(ks[0], row_passes.elem_bytes) == {}


def _norm_gelu_norm(x, r, w, b):
    h = F.layer_norm(x, x.shape[-1:], w, b)
    y = r + F.gelu(h)
    return {"y": y, "out": F.layer_norm(y, y.shape[-1:], w, b), "softmax": torch.softmax(torch.exp(-h * h) * 3, -1)}


@pytest.fixture
def planned(monkeypatch):
    """The plans of the row kernels compiled in the test: (inner dims, kept values' ops)."""
    out = []
    plan = row_passes.plan

    def spy(k, eb, finish=frozenset()):
        kept = plan(k, eb, finish)
        out.append((len(k.inner), sorted(e.op for e, _, _ in kept.values())))
        return kept
    monkeypatch.setattr(row_passes, "plan", spy)
    return out


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
def test_layer_norm_over_gelu_and_softmax_over_exp_match_eager(dtype, threads, monkeypatch, planned):
    from minicomp.runtime import cpu
    monkeypatch.setattr(cpu, "threads", lambda: threads)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 1)
    shape = (37, 300)
    x, r = (values(dtype, shape, i).nan_to_num(0.0, 0.0, 0.0).clamp(-3, 3) for i in (0, 1))
    w, b = (values(dtype, shape[-1:], i).nan_to_num(1.0, 1.0, 1.0).clamp(-2, 2) for i in (2, 3))
    x[4, 7], r[9, 0] = NAN, INF  # rows with NaN or Inf give NaN, as in eager
    compare_compiled(_norm_gelu_norm, x, r, w, b, tol=3e-2 if dtype in ("f16", "bf16") else 1e-4)
    assert any(ops for _, ops in planned), planned


def test_two_inner_dims_and_a_transposed_input(planned):
    def fn(x):
        e = torch.erf(x.transpose(1, 2))  # rows over two dims, strided in memory
        m = e.mean((1, 2), keepdim=True)
        return {"norm": (e - m) * torch.rsqrt(((e - m) ** 2).mean((1, 2), keepdim=True) + 1e-5)}
    compare_compiled(fn, values("f32", (6, 70, 9), 0).nan_to_num(0.0, 0.0, 0.0), tol=1e-4)
    assert any(dims == 2 and ops for dims, ops in planned), planned


def test_symbolic_rows_keep_nothing_and_match_eager(planned):
    import minicomp
    fn = minicomp.compile(lambda x: F.layer_norm(F.gelu(F.layer_norm(x, x.shape[-1:])), x.shape[-1:]),
                          backend="cpu", dynamic=True)
    for n in (33, 70):
        x = torch.randn(5, n)
        torch.testing.assert_close(fn(x), F.layer_norm(F.gelu(F.layer_norm(x, (n,))), (n,)), rtol=1e-4, atol=1e-5)
    assert planned and not any(ops for _, ops in planned), planned


def _erf_summed_down_columns(n: int) -> str:
    """erf(a) stored, and g * erf(a) summed over the middle dim, down columns (as the Mixer's backward
    GELU kernel stores the GELU it recomputes beside its gradient's bias-gradient sum)."""
    t = f"f32[64,16,{n}]"
    return (f"graph g(%a: {t}, %g: {t}) -> ({t}, f32[64,{n}]) {{\n"
            f"  %0: {t} = erf %a\n  %1: {t} = mul %g %0\n"
            f"  %2: f32[64,{n}] = sum %1 [dims=(1,), keepdim=false]\n  return %0, %2\n}}")


def test_stores_that_read_no_last_stage_result_run_in_a_stage_loop():
    from minicomp.codegen.columns import columns
    for text, column in ((_erf_summed_down_columns(256), True), (_erf_then_variance(512), False)):
        ks = _kernels(text)
        assert len(ks) == 1 and columns(ks[0]) == column
        k = ks[0]
        want = [0] if column else [len(k.stages)]  # the variance's stores read its last stage
        assert row_passes.store_passes(k) == want
        code, _ = generate_module(ks, whole=lambda k: True)
        assert len(re.findall(r'call float @"minicomp_erf"', code)) == 1


def _stored_beside_reductions(x, g):
    e = torch.erf(x) * g
    c = x - x.mean(-1, keepdim=True)  # reads the first stage's mean: stored in the variance's loop
    return {"e": e, "col": e.sum(0), "row": e.sum(-1), "c": c, "var": (c * c).mean(-1),
            "gelu_grad_cols": (g * torch.exp(-x * x)).view(4, -1, x.shape[-1]).sum(1)}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", ["f32", "f16", "f64"])
def test_stores_made_in_a_stage_loop_match_eager(dtype, threads, monkeypatch):
    from minicomp.runtime import cpu
    monkeypatch.setattr(cpu, "threads", lambda: threads)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 1)
    moved = []
    passes = row_passes.store_passes
    monkeypatch.setattr(row_passes, "store_passes", lambda k: moved.append((len(k.stages), passes(k))) or moved[-1][1])
    x, g = (values(dtype, (24, 300), i).nan_to_num(0.0, 0.0, 0.0).clamp(-3, 3) for i in (0, 1))
    x[5, 3] = NAN
    compare_compiled(_stored_beside_reductions, x, g, tol=3e-2 if dtype == "f16" else 1e-4)
    assert any(q < n for n, qs in moved for q in qs), moved
