"""Reductions on the CPU backend against eager: every axis and set of axes, keepdim both ways, every dtype.

The op table's reductions (sum, prod, amax, amin, argmax, argmin) are checked per dtype as one IR graph
each, as in test_cpu_ops.py. The reductions torch decomposes into them (mean, var, std, softmax,
log_softmax, logsumexp, max/min with indices) go through `minicomp.compile(backend="cpu")`, on a
transposed input, so reduced axes are strided in memory. Then the cases backends get wrong: NaN
(amax propagates it, argmax points at the first), rows of -inf (softmax gives NaN like eager), empty
reductions (sum 0, prod 1, mean NaN), 0-d and size-1 dims.
"""
from __future__ import annotations

import itertools

import re

import pytest
import torch

import minicomp
from minicomp.ir import DTYPES, OPS, TensorType

from tests.codegen.test_cpu_ops import ALL_DTYPES, FLOAT_DTYPES, compare, compare_compiled, run_ops, takes, values

NAN, INF = float("nan"), float("inf")
SHAPE = (3, 5, 7)
DIM_SETS = [d for r in (1, 2, 3) for d in itertools.combinations(range(3), r)]


def reduction_specs(dtype: str) -> list:
    """(label, op, input indices, attrs) for each table reduction of a SHAPE input, per axis set and keepdim."""
    specs = []
    for op in ("sum", "prod", "amax", "amin"):
        for dims, keep in itertools.product(DIM_SETS, (False, True)):
            attrs = {"dims": dims, "keepdim": keep}
            if takes(op, attrs, (TensorType(SHAPE, dtype),)):
                specs.append((f"{op}{dims}{'k' if keep else ''}", op, (0,), attrs))
    for op, dim, keep in itertools.product(("argmax", "argmin"), range(3), (False, True)):
        attrs = {"dim": dim, "keepdim": keep}
        if takes(op, attrs, (TensorType(SHAPE, dtype),)):
            specs.append((f"{op}({dim}){'k' if keep else ''}", op, (0,), attrs))
    return specs


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_table_reductions_over_every_axis_set(dtype):
    # float products stay in f16's range (eager multiplies f16 in f16, we in f32, so only an overflow
    # tells them apart); integers wrap the same way in both; NaN and inf get their own test
    x = values(dtype, SHAPE, 0)
    if dtype in FLOAT_DTYPES:
        x = x.nan_to_num(0.0, 0.0, 0.0).clamp(-1.1, 1.1)
    specs = reduction_specs(dtype)
    assert specs, f"no reduction takes {dtype}"
    got, want, report = run_ops(specs, [x])
    compare(got, want)
    assert not {op for _, op, _, _ in specs} - {op for k in report.kernels for op in k.ops}


def decomposed(x):
    """The reductions torch builds from the table's: every axis set, keepdim both ways."""
    out = {}
    for dims, keep in itertools.product(DIM_SETS, (False, True)):
        out[f"mean{dims}{keep}"] = x.mean(dims, keepdim=keep)
        out[f"var{dims}{keep}"] = x.var(dims, keepdim=keep)
        out[f"std{dims}{keep}"] = x.std(dims, keepdim=keep, correction=0)
        out[f"logsumexp{dims}{keep}"] = torch.logsumexp(x, dims, keepdim=keep)
    for d in range(3):
        out[f"softmax{d}"] = torch.softmax(x, d)
        out[f"log_softmax{d}"] = torch.log_softmax(x, d)
        for keep in (False, True):
            out[f"max{d}{keep}"] = x.max(d, keepdim=keep)
            out[f"min{d}{keep}"] = x.min(d, keepdim=keep)
    out["sum_all"], out["max_all"], out["argmin_all"] = x.sum(), x.max(), x.argmin()
    return out


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_decomposed_reductions_over_every_axis_set(dtype):
    x = values(dtype, (7, 5, 3), 0).permute(2, 1, 0)  # (3, 5, 7), strided
    x = torch.where(x.isfinite(), x, torch.zeros_like(x))
    compare_compiled(decomposed, x)


@pytest.mark.parametrize("dtype", ["i64", "i32", "u8", "b8"])
def test_integer_and_bool_reductions(dtype):
    def fn(x):
        out = {"sum": x.sum(), "sum1": x.sum(1), "sum02k": x.sum((0, 2), keepdim=True), "amax": x.amax(1),
               "amin": x.amin((0, 1)), "max": x.max(2), "min": x.min(0, keepdim=True), "prod": x.prod(1),
               "any": x.any(1), "all": x.all(2), "float_mean": x.float().mean(1)}
        if dtype != "b8":
            out.update(argmax=x.argmax(0), argmin=x.argmin(2, keepdim=True),
                       sum_minus_max=(x * 2).sum(-1) - x.amax(-1))
        return out
    x = values(dtype, (7, 5, 3), 0).permute(2, 1, 0)  # (3, 5, 7), strided
    if dtype != "b8":  # small values: ties for argmax, products in range
        x = x.clamp(0 if dtype == "u8" else -3, 3)
    compare_compiled(fn, x)


def test_nan_and_inf_rows_follow_eager():
    def fn(x):
        out = {}
        for d in (0, 1):
            out.update({f"amax{d}": x.amax(d), f"amin{d}": x.amin(d), f"argmax{d}": x.argmax(d),
                        f"argmin{d}": x.argmin(d), f"max{d}": x.max(d), f"min{d}": x.min(d), f"sum{d}": x.sum(d),
                        f"prod{d}": x.prod(d), f"mean{d}": x.mean(d), f"var{d}": x.var(d),
                        f"softmax{d}": torch.softmax(x, d), f"log_softmax{d}": torch.log_softmax(x, d),
                        f"logsumexp{d}": torch.logsumexp(x, d)})
        out.update(amax=x.amax(), argmax=x.argmax(), argmin=x.argmin())
        return out
    x = torch.tensor([[1.0, NAN, 3.0, -1.0, 3.0],     # NaN in the middle: argmax points at it
                      [NAN, NAN, NAN, NAN, NAN],
                      [-INF, -INF, -INF, -INF, -INF],  # softmax of an all -inf row: NaN, as eager
                      [INF, 2.0, -INF, 0.0, INF],      # ties: the first index wins
                      [5.0, 5.0, -2.0, 5.0, 0.0],
                      [-0.0, 0.0, -0.0, 0.0, -0.0]])
    for dtype in FLOAT_DTYPES:
        compare_compiled(fn, x.to(DTYPES[dtype]))


def test_empty_and_degenerate_reductions():
    def fn(e, s, z):  # e (3, 0), s (4, 1), z ()
        return {"sum_empty": e.sum(1), "prod_empty": e.prod(1), "mean_empty": e.mean(1), "sum_all_empty": e.sum(),
                "sum_keep_empty": e.sum(1, keepdim=True), "amax_other_dim": e.amax(0),
                "softmax_other_dim": torch.softmax(e, 0), "sum_size1": s.sum(1), "argmax_size1": s.argmax(1),
                "softmax_size1": torch.softmax(s, 1), "var_size1": s.var(1, correction=0),
                "var_no_dof": s.var(1), "amax_size1": s.amax(0), "sum_0d": z.sum(), "amax_0d": z.amax(),
                "argmax_0d": z.argmax(), "softmax_0d": torch.softmax(z, 0), "logsumexp_0d": torch.logsumexp(z, 0)}
    compare_compiled(fn, values("f32", (3, 0), 0), values("f32", (4, 1), 1), values("f32", (), 2))


def test_long_rows_threads_and_vector_tails():
    """Rows longer than a vector with a ragged tail, many rows: the threaded, vectorized paths."""
    def fn(x):
        return {"softmax": torch.softmax(x, -1), "col_softmax": torch.softmax(x, 0), "sum": x.sum(-1),
                "mean0": x.mean(0), "amax": x.amax(-1), "argmax": x.argmax(-1), "var": x.var(-1),
                "layer_norm": torch.nn.functional.layer_norm(x, (x.shape[-1],))}
    # sums of 1031 terms cancel: compare to the size of the terms, not of the sum
    compare_compiled(fn, values("f32", (301, 1031), 0).clamp(-50, 50).nan_to_num(0.0), tol=1e-3)


@pytest.mark.parametrize("dynamic", [False, True])
def test_long_float_sums_keep_eager_accuracy(dynamic):
    """Sums over a million elements and more, measured against float64: blocked (cascade) partial
    sums keep the error near ATen's; one accumulator a row lost 20x more (2e-6 relative on 4M
    elements, 6e-5 on their variance). A symbolic row length is blocked too, and a reduction over
    several loops (dims 0 and 2, not contiguous together) in blocks of its outer loop."""
    import minicomp

    def fn(x, y):
        return {"sum": x.sum(-1), "mean": x.mean(-1), "var": x.var(-1),
                "layer_norm": torch.nn.functional.layer_norm(x, x.shape[-1:]), "sum02": y.sum((0, 2))}
    gen = torch.Generator().manual_seed(0)
    compiled = minicomp.compile(fn, backend="cpu", dynamic=dynamic)
    for n in ((3_000_001, 1 << 20) if dynamic else (3_000_001,)):
        x = torch.randn(2, n, generator=gen) + 10
        y = torch.randn(4096, 8, 300, generator=gen) + 3
        got, want = compiled(x, y), fn(x.double(), y.double())
        for name, ref in want.items():
            err = ((got[name].double() - ref).abs().max() / ref.abs().max()).item()
            eager = ((fn(x, y)[name].double() - ref).abs().max() / ref.abs().max()).item()
            assert err <= max(8 * eager, 1e-6), f"{name} over {n}: relative error {err:.2e} (eager {eager:.2e})"


def test_reductions_fused_with_their_consumers_stay_correct():
    """A reduction feeding a broadcast op feeding another reduction: several stages in one row kernel."""
    def fn(x, w):
        centered = x - x.mean(-1, keepdim=True)
        scaled = centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5) * w
        return {"norm": scaled, "row_max": scaled.amax(-1), "col_sum": scaled.sum(0), "lse": scaled.logsumexp(-1),
                "pick": scaled.argmax(-1), "softmax_of_norm": torch.softmax(scaled, -1)}
    x, w = values("f32", (37, 65), 0).nan_to_num(0.0, 0.0, 0.0), values("f32", (65,), 1).nan_to_num(1.0, 1.0, 1.0)
    compare_compiled(fn, x, w, tol=1e-4)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64", "i32"])
def test_reductions_down_columns_run_in_column_tiles(dtype, threads, monkeypatch):
    """Sums, products, maxima and minima down the columns (the kept last dim contiguous) run with an
    accumulator per column, a tile of COLUMN_TILE columns at a time: more columns than one tile, a
    ragged last tile, NaN in a column, two reductions in one kernel, split across threads or not."""
    from minicomp.codegen import columns, llvm_module
    from minicomp.codegen.collapse import collapse
    from minicomp.runtime import cpu
    monkeypatch.setattr(cpu, "threads", lambda: threads)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 1)
    taken = []
    generate = llvm_module.generate_modules
    monkeypatch.setattr(llvm_module, "generate_modules", lambda ks, *a, **k: taken.extend(
        columns.columns(collapse(kk)) for kk in ks) or generate(ks, *a, **k))

    def fn(x, g):
        y = x * 2 + 1
        return {"sum": (y * g).sum(0), "both": (y.sum(0), (y * y).sum(0)), "amax": y.amax(0), "amin": (y - g).amin(0),
                "prod": (x * 0 + 1).prod(0), "3d": (y.view(3, -1, y.shape[-1]) + 0).sum((0, 1))}
    n = columns.COLUMN_TILE + 7
    x, g = values(dtype, (12, n), 0), values(dtype, (12, n), 1)
    if dtype in FLOAT_DTYPES:
        x, g = x.nan_to_num(0.0, 0.0, 0.0).clamp(-2, 2), g.nan_to_num(0.0, 0.0, 0.0).clamp(-2, 2)
        x[3, 5] = NAN  # amax and amin of that column are NaN, as in eager
    else:
        x, g = x % 5, g % 5
    compare_compiled(fn, x, g, tol=1e-2 if dtype in ("f16", "bf16") else None)
    assert taken and all(taken), taken


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", ["f32", "f16", "f64"])
def test_a_mean_then_a_variance_down_columns_run_in_column_tiles(dtype, threads, monkeypatch):
    """A reduction stage that reads an earlier one's result (a variance around the mean: a batch norm's
    statistics over channels-last data, [N,H,W,C] summed over N, H, W) runs in column tiles too, each
    stage's accumulators read by the next stage and by the stores of their own column; with a
    normalized output written down the rows (inner stores)."""
    from minicomp.codegen import columns, llvm_module
    from minicomp.codegen.collapse import collapse
    from minicomp.runtime import cpu
    monkeypatch.setattr(cpu, "threads", lambda: threads)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 1)
    taken = []
    generate = llvm_module.generate_modules
    monkeypatch.setattr(llvm_module, "generate_modules", lambda ks, *a, **k: taken.extend(
        (len(collapse(kk).stages), columns.columns(collapse(kk))) for kk in ks) or generate(ks, *a, **k))

    def fn(x):
        x = x * 2 + 1  # a kernel's value (a sum down the columns of an input runs in torch)
        mean = x.mean((0, 1, 2), keepdim=True)
        var = ((x - mean) ** 2).mean((0, 1, 2))
        return {"var": var, "scaled_max": (x - mean).amax((0, 1, 2)) * torch.rsqrt(var + 1e-5)}
    n = columns.COLUMN_TILE + 9
    x = values(dtype, (2, 3, 5, n), 0).nan_to_num(0.0, 0.0, 0.0).clamp(-3, 3)
    x[1, 2, 4, 7] = NAN  # that column's statistics are NaN, as in eager
    compare_compiled(fn, x, tol=1e-2 if dtype == "f16" else None)
    assert any(stages == 2 and ok for stages, ok in taken), taken


def test_an_f32_sum_down_long_columns_is_as_exact_as_eager():
    """A column's f32 sum adds in f64 (one accumulator per column, no vector lanes to split it):
    8192 rows of values around 1e3 sum within eager's own distance from float64 (0.54 against
    eager's 2.4; an f32 accumulator's was 4.7)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8192, 96, generator=gen, dtype=torch.float64).mul(100).add(1e3).float()

    def fn(x):
        return {"sum": (x * 1.5).sum(0)}
    got = minicomp.compile(fn, backend="cpu")(x)["sum"].double()
    exact, eager = (x.double() * 1.5).sum(0), fn(x)["sum"].double()
    assert (got - exact).abs().max() <= (eager - exact).abs().max()


def test_a_row_reduction_is_not_a_column_reduction():
    from minicomp.codegen.collapse import collapse
    from minicomp.codegen.columns import columns
    from tests.runtime.test_cpu_runtime import _kernels
    row, col = (_kernels(f"""
        graph t(%x: f32[64,128]) -> (f32[{n}]) {{
          %0: f32[64,128] = exp %x
          %1: f32[{n}] = sum %0 [dims=({d},), keepdim=false]
          return %1
        }}""") for n, d in ((64, 1), (128, 0)))
    assert not columns(collapse(row[0])) and columns(collapse(col[0]))
    from minicomp.backends.cpu import kernel_text
    assert "runs down the columns" in kernel_text(collapse(col[0]))
    assert "runs down the columns" not in kernel_text(collapse(row[0]))
    # the loop over a tile's columns vectorizes (an f32 sum adds in f64: columns.py)
    assert re.search(r"<(4|8|16) x double>", cpu_optimize(col))


def cpu_optimize(kernels) -> str:
    from minicomp.codegen.llvm_module import generate_module
    from minicomp.runtime import llvm_jit
    return llvm_jit.optimize(generate_module(kernels)[0])


def test_every_table_reduction_is_tested():
    reductions = {n for n, d in OPS.items() if d.category == "reduction"}
    assert reductions == {op for dt in ALL_DTYPES for _, op, _, _ in reduction_specs(dt)}
