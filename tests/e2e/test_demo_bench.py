"""The main job, the benchmark harness and the sample notebook, at settings small enough for CI."""
import importlib.util
from pathlib import Path

import pytest
import torch

import minicomp
from minicomp import bench, demo

ROOT = Path(__file__).resolve().parents[2]
ROW_KEYS = {"case", "shape", "backend", "eager_ms", "minicomp_ms", "inductor_ms", "vs_eager", "vs_inductor",
            "bytes", "gbps", "copy_gbps", "pct_copy", "compile_s", "recompile_s", "own_s", "cold_own_s", "llvm_s", "dynamo_s", "trace_s", "trace_floor", "inductor_compile_s",
            "compile_vs_inductor", "inductor_again_s", "fresh_ms", "fresh_vs_eager", "fresh_vs_inductor",
            "eager_peak_kib", "mc_peak_kib", "max_abs_err", "ok", "notes", "overhead_us", "torch_share", "floor"}


def test_demo_matches_eager(capsys):
    assert demo.main(["--reps", "2", "--shape", "2,16,32,2", "--tol", "1e-4"]) == 0
    out = capsys.readouterr().out
    assert "minicomp report:" in out and "max abs error vs eager" in out


def test_bench_rows_and_table():
    rows = bench.run_bench(["cos_cos", "tiny_chain50"], backend="auto", reps=2, quick=True)
    assert [r["case"] for r in rows] == ["cos_cos", "tiny_chain50"]
    for r in rows:
        assert set(r) == ROW_KEYS
        assert r["ok"] and r["max_abs_err"] < 1e-5
        assert r["eager_ms"] > 0 and r["minicomp_ms"] > 0 and r["fresh_ms"] > 0 and r["copy_gbps"] > 0
    # the cold compile's parts inside the whole first call: minicomp's own work, and LLVM's, which
    # runs in the background from the end of code generation (it may outlast the own part)
    for r in rows:
        assert 0 < r["cold_own_s"] < r["compile_s"] and 0 < r["llvm_s"] < r["compile_s"]
        if r["inductor_compile_s"]:  # the floor: the traces and one call
            want = (r["trace_s"] + r["minicomp_ms"] / 1e3) / r["inductor_compile_s"]
            assert abs(r["trace_floor"] - want) < 1e-9
    # cos_cos is one kernel and no torch call: its profiled steps say so
    assert rows[0]["torch_share"] == 0 and rows[0]["floor"] == 0
    assert rows[0]["bytes"] == 2 * 4 * (1 << 20)  # cos_cos: read x once, write the result once
    # eager holds cos(x) and cos(cos(x)) at once; the fused kernel writes only the result
    assert rows[0]["eager_peak_kib"] == 2 * 4096 and rows[0]["mc_peak_kib"] == 4096
    table = bench.format_table(rows)
    assert "cos_cos" in table and "tiny_chain50" in table and "geomean over 2 correct" in table
    # the overhead-bound case carries its per-call breakdown, measured layer by layer (minicomp.overhead)
    assert rows[1]["overhead_us"]["total"] > 0 and "tiny_chain50: " in table.split("per-call host time")[1]


def test_wrong_rows_are_marked_and_left_out_of_the_geomean():
    row = {"case": "c", "shape": "1", "eager_ms": 1.0, "minicomp_ms": 0.5, "inductor_ms": None, "vs_eager": 0.5,
           "vs_inductor": None, "gbps": 1.0, "copy_gbps": 2.0, "pct_copy": 50.0, "compile_s": 0.1,
           "recompile_s": 0.1, "own_s": 0.1, "cold_own_s": 0.1, "llvm_s": 0.05, "dynamo_s": 0.1, "trace_s": 0.1, "trace_floor": None, "inductor_compile_s": None, "compile_vs_inductor": None,
           "inductor_again_s": None, "fresh_ms": 0.6, "fresh_vs_eager": 0.6, "fresh_vs_inductor": None,
           "eager_peak_kib": 2.0, "mc_peak_kib": 1.0, "max_abs_err": 1.0, "ok": False, "notes": [],
           "torch_share": None, "floor": None}
    table = bench.format_table([row, dict(row, case="d", vs_eager=2.0, max_abs_err=0.0, ok=True)])
    assert "WRONG" in table and "geomean over 1 correct case(s): mc/eager 2.00" in table
    assert "with fresh outputs: mc/eager 0.60" in table


def test_sample_notebook_is_valid_and_up_to_date():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(str(ROOT / "samples" / "eager_vs_compiled.ipynb"), as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "samples" / "make_notebooks.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    assert [c.source for c in nb.cells] == [c.source for c in maker.EAGER_VS_COMPILED], \
        "notebook out of date: run python samples/make_notebooks.py"


def test_time_split_separates_torch_calls_from_kernels():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch_s, kernel_s = bench.time_split(lambda x, y: torch.relu(x @ y) * 2, (a, b), "cpu", reps=4)
    assert torch_s > 0 and kernel_s > 0  # the matmul is a torch call, relu * 2 one kernel


def test_warm_traces_run_both_compilers_tables(monkeypatch):
    """The untimed traces before a cold compile: Dynamo alone, then AOTAutograd with minicomp's and
    with Inductor's decompositions; a trace that fails is skipped, and Dynamo is reset after them."""
    from torch._dynamo.testing import CompileCounter

    from minicomp import bench_traces
    calls, tables = [], []
    real = bench_traces.trace_only

    def trace_only(decompositions=None):
        tables.append(decompositions)
        return real(decompositions)
    monkeypatch.setattr(bench_traces, "trace_only", trace_only)

    def step(backend):
        calls.append(backend)
        if len(calls) == 2:
            raise RuntimeError("this table cannot trace it")
        torch.compile(lambda x: torch.nn.functional.silu(x) * 2, backend=backend)(torch.randn(8))
    bench_traces.warm_traces(step)
    assert len(calls) == 3 and calls[0] == "eager"
    assert tables[0] is None and tables[1] == bench_traces.inductor_decompositions()
    counter = CompileCounter()
    torch.compile(lambda x: x + 1, backend=counter)(torch.randn(2))
    assert counter.frame_count == 1


def test_cold_caches_give_each_compile_empty_caches_of_its_own(monkeypatch, tmp_path):
    """A cold sample in the benchmark: minicomp finds nothing on disk or in memory from the compile
    before (no graph-cache hit, machine code compiled again), Inductor gets a cache folder of its own,
    and both folders are put back and the cold ones removed after."""
    import os

    from minicomp import bench_traces
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "mc"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ind"))

    def f(x):
        return torch.cos(x).sum(-1) * 2
    x = torch.randn(4, 8)
    seen, reports = [], []
    for _ in range(2):
        torch._dynamo.reset()
        with torch.no_grad(), bench_traces.cold_caches():
            seen.append((os.environ["MINICOMP_CACHE_DIR"], os.environ["TORCHINDUCTOR_CACHE_DIR"]))
            c = minicomp.compile(f, backend="cpu")
            torch.testing.assert_close(c(x), f(x))
            reports.append(c.report())
    assert os.environ["MINICOMP_CACHE_DIR"] == str(tmp_path / "mc")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "ind")
    assert len({d for pair in seen for d in pair}) == 4 and not any(os.path.exists(d) for pair in seen for d in pair)
    for r in reports:  # each compiled from scratch: lowered, and its machine code built by LLVM
        assert [g.detail.get("graph_cache") for g in r.graphs] == [None]
        assert r.graphs[0].phases_ms.get("lower", 0) > 0 and r.graphs[0].phases_ms.get("llvm_jit", 0) > 0
