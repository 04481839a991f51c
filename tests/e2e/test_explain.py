"""minicomp.explain: each kernel and torch call against this machine's roofline, the totals against
eager, the files .save() writes, and compiled steps by name in torch.profiler traces."""
from __future__ import annotations

import importlib
import os

import pytest
import torch

import minicomp
from minicomp import roofline
from minicomp.models import Block

explain_mod = importlib.import_module("minicomp.explain")  # the module: `minicomp.explain` is the function


@pytest.fixture(scope="module")
def roof():
    """Measured now, not taken from a cache another day filled: on a shared machine the roofs move."""
    return roofline.measure("cpu", quick=True)


def _within_roof(e, roof):
    """e's rows judged against the roof; when one is above it, against the better of that roof and one
    measured again now -- explain()'s own rule for a cached roof: two timings minutes apart on a shared
    machine differ, and what is still above a fresh roof is a byte or flop count below the truth."""
    if all(r.roof_fraction <= 1.0 for r in e.rows):
        return e.rows
    again = roofline.best(roof, roofline.measure("cpu", quick=True))
    return explain_mod._rows(e.report.steps, again)


def _only(e, kind):
    rows = [r for r in e.rows if r.kind == kind]
    assert rows, f"no {kind} step in {e}"
    return rows


def test_cos_cos_is_one_kernel_moving_the_minimum(roof):
    n = 1 << 16
    e = minicomp.explain(lambda x: torch.cos(torch.cos(x)), torch.randn(n), backend="cpu", roofline=roof, reps=5)
    k, = e.rows
    assert k.kind == "kernel" and k.ops == ["cos", "cos"] and k.bytes == 2 * 4 * n
    assert e.totals.min_bytes == 2 * 4 * n == e.totals.bytes
    assert e.totals.eager_bytes == 4 * 4 * n and e.totals.eager_launches == 2  # eager writes and reads cos(x)


def test_large_pointwise_is_memory_bound(roof):
    e = minicomp.explain(lambda x: x + 1.0, torch.randn(1 << 24), backend="cpu", roofline=roof, reps=5)
    k, = _only(e, "kernel")
    k, = [r for r in _within_roof(e, roof) if r.kind == "kernel"]
    assert k.bound == "memory" and 0 < k.roof_fraction <= 1.0, k


def test_large_matmul_is_compute_bound(roof):
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    e = minicomp.explain(lambda a, b: a @ b, a, b, backend="cpu", roofline=roof, reps=3)
    mm, = _only(e, "torch")
    assert mm.label == "matmul" and mm.flops == 2 * 1024 ** 3
    mm, = [r for r in _within_roof(e, roof) if r.kind == "torch"]
    # the flop count is exact (above); a roof at the FMA peak still moves a few percent with the clock
    assert mm.bound == "compute" and 0 < mm.roof_fraction <= 1.05, mm


def test_tiny_graph_is_overhead_bound(roof):
    e = minicomp.explain(lambda x: (x * 2 + 1).abs(), torch.randn(8), backend="cpu", roofline=roof, reps=10)
    k, = _only(e, "kernel")
    assert k.bound == "overhead"


def test_training_gpt_block_never_above_a_roof_and_saves_files(roof, tmp_path):
    torch.manual_seed(0)
    e = minicomp.explain(Block(64, 4, 32), torch.randn(2, 32, 64, requires_grad=True), backend="cpu",
                         training=True, roofline=roof, reps=5)
    graphs = {r.graph.split("_")[0] for r in e.rows}
    assert graphs == {"forward", "backward"}
    assert all(r.roof_fraction <= 1.0 for r in _within_roof(e, roof)), "\n" + str(e)  # above a roof: a byte or flop count is wrong
    assert {"memory", "compute", "overhead"} >= {r.bound for r in e.rows}
    assert e.totals.min_bytes <= e.totals.bytes and e.totals.eager_launches > 0 and e.totals.eager_time_s > 0
    text = str(e)
    assert "bound" in text and "not fused" in text and "roofline of" in text
    folder = e.save(str(tmp_path / "explain"))
    files = set(os.listdir(folder))
    assert {"report.md", "roofline.png", "stages"} <= files and ({"graph.svg"} & files or {"graph.png"} & files)
    from PIL import Image
    for name in ("roofline.png", "graph.png"):
        if name in files:
            with Image.open(os.path.join(folder, name)) as im:
                assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
    stages = os.listdir(os.path.join(folder, "stages"))
    assert any("forward" in s for s in stages) and any("backward" in s for s in stages)
    assert "| step |" in open(os.path.join(folder, "report.md")).read()


def test_a_kernel_split_over_every_thread_stays_under_the_vector_roof(roof):
    """layer_norm(gelu(x)) over 65,536 elements is compute-bound and big enough to split across the
    threads (runtime/cpu.py PARALLEL_MIN_WORK); the vector roof's chains ran over 16,384 elements,
    on one thread, and such a kernel read 120-150% of it. The roof's chains now split too."""
    from minicomp.runtime.cpu import PARALLEL_MIN_WORK
    assert roofline.VECTOR_ELEMENTS["cpu"] >= 2 * PARALLEL_MIN_WORK
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    e = minicomp.explain(lambda x: torch.nn.functional.layer_norm(torch.nn.functional.gelu(x), (256,)), x,
                         backend="cpu", roofline=roof, reps=10)
    k, = _only(e, "kernel")
    assert k.bound == "compute", "\n" + str(e)
    assert all(r.roof_fraction <= 1.0 for r in _within_roof(e, roof)), "\n" + str(e)


def test_copy_kernels_are_named_for_what_they_do():
    """A kernel that only moves data says how: a transposed copy, a broadcast, a copy."""
    c = minicomp.compile(lambda x, b: (x.t().contiguous(), b.expand(4, 8).contiguous(), x.clone()), backend="cpu")
    x, b = torch.randn(8, 4), torch.randn(8)
    for got, want in zip(c(x, b), (x.t().contiguous(), b.expand(4, 8).contiguous(), x.clone())):
        torch.testing.assert_close(got, want)
    labels = sorted(k.label for k in c.report().kernels)
    assert labels == ["broadcast", "copy", "transpose"], labels
    assert all(k.label in str(k) for k in c.report().kernels)


def test_kernels_appear_by_name_in_a_profiler_trace():
    from torch.profiler import profile
    c = minicomp.compile(lambda x, w: torch.relu(x @ w) * 2, backend="cpu")
    x, w = torch.randn(32, 16), torch.randn(16, 8)
    c(x, w)
    with profile() as prof:
        c(x, w)
    names = [ev.name for ev in prof.events()]
    assert any(n.startswith("minicomp inference_") and " k0 (" in n for n in names), names
    assert any(n.startswith("minicomp inference_") and " mm (matmul)" in n for n in names), names


def test_a_refreshed_roofline_keeps_the_best_figures(monkeypatch, tmp_path):
    """Measured under load, a refresh must not lower the roof (later explains then reported kernels at
    10x their roof): each figure keeps the better of the cached and the new measurement."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    good = roofline.Roofline("m", "cpu", [1 << 20, 1 << 30], [50.0, 20.0], [40.0, 15.0], [90.0, 35.0],
                             30.0, 300.0, 1e-6, 2e-6)
    slow = roofline.Roofline("m", "cpu", [1 << 20, 1 << 30], [0.1, 25.0], [2.0, 1.0], [3.0, 40.0],
                             3.0, 30.0, 5e-6, 1e-6)
    measured = iter([good, slow])
    monkeypatch.setattr(roofline, "measure", lambda backend, **kw: next(measured))
    assert roofline.get("cpu", refresh=True) == good
    got = roofline.get("cpu", refresh=True)
    assert got.read_gbps == [50.0, 25.0] and got.copy_gbps == [90.0, 40.0] and got.write_gbps == [40.0, 15.0]
    assert (got.vector_gflops, got.matmul_gflops, got.launch_s, got.torch_call_s) == (30.0, 300.0, 1e-6, 1e-6)
    assert roofline.get("cpu") == got  # and that is what the cache now holds


def test_a_burst_of_load_cannot_sink_one_bandwidth(monkeypatch):
    """CI measured reads of 16.7, 5.7 and 40.0 GB/s over 256 KiB, 2 MiB and 16 MiB, with a 2 MiB copy
    at 48.4: the 2 MiB read's samples all fell in a burst of load, and a compute-bound kernel of that
    size came out memory-bound. The samples now go round every program, and what no memory system does
    (a read slower than a copy, a smaller working set slower than a larger) is mended upward."""
    calls = []

    def timed(cases, reps, backend):
        calls.append([fn for fn, _, _ in cases])
        out = []
        for fn, inputs, kind in cases:
            x = inputs[0]
            nbytes = x.numel() * 4
            if kind == "torch":
                out.append((2 * x.shape[0] ** 3 / 100e9 if x.dim() == 2 and x.shape[0] > 2 else 4e-6, None))
            elif fn(torch.ones(2, 2)).dim() == 1 and x.dim() == 2:   # the read: a row sum
                out.append((nbytes / {1 << 18: 16.7e9, 1 << 21: 5.7e9, 1 << 24: 40e9}[nbytes], None))
            elif x.numel() == 16:
                out.append((2e-6, None))
            elif x.numel() == roofline.VECTOR_ELEMENTS["cpu"]:
                out.append((1e-3, type("Step", (), {"flops": 30e6})()))
            else:                                                   # the copy: 2 * nbytes moved
                out.append((2 * nbytes / {1 << 15: 20.9e9, 1 << 18: 48.4e9, 1 << 21: 65.2e9}[x.numel()], None))
        return out
    monkeypatch.setattr(roofline, "_best_steps", timed)
    roof = roofline.measure("cpu", quick=True)
    assert len(calls[0]) > 6, "the bandwidth programs, the chains and the matmuls go round in one set"
    assert roof.copy_gbps == pytest.approx([65.2, 65.2, 65.2])
    assert roof.read_gbps == pytest.approx([65.2, 65.2, 65.2])  # no read slower than the copies
    assert all(w > 0 for w in roof.write_gbps) and roof.write_gbps == sorted(roof.write_gbps, reverse=True)
    assert roof.vector_gflops == pytest.approx(30.0) and roof.matmul_gflops == pytest.approx(100.0)


def test_cuda_emu_judges_torch_calls_against_the_native_roof():
    """cuda_emu's kernels are emulated (its roofs are the emulator's, milliseconds a launch), but its
    matmuls are torch's, native: against the emulator's roof they read 600-1800% of it, and explain
    re-measured that roof (minutes) hoping to fix it. Torch calls are judged against the CPU's roof."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    emu_roof = roofline.measure("cuda_emu", quick=True)
    e = minicomp.explain(model, torch.randn(16, 32), backend="cuda_emu", training=True, reps=3, roofline=emu_roof)
    torch_rows = [r for r in e.rows if r.kind == "torch" and r.label == "matmul"]
    assert torch_rows and all(r.roof_fraction < 1.5 for r in torch_rows), "\n" + str(e)


def test_explain_names_what_ran_eagerly(roof):
    """A graph break splits the function: the totals time both graphs and the code between them,
    so the table says what ran eagerly, with the user's line."""
    def f(x):
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return y.softmax(-1) + 1
    text = str(minicomp.explain(f, torch.randn(64, 64), backend="cpu", roofline=roof, reps=3))
    assert "ran eagerly (1)" in text and "test_explain.py" in text and "graph_break()" in text


def test_an_element_of_a_torch_ops_results_is_no_step_of_its_own(roof):
    """linalg.inv runs in torch and returns (inverse, info): picking the inverse is a Python index,
    which no roof judges (timed against a torch call's floor it read 300-500% of it)."""
    e = minicomp.explain(lambda x: torch.linalg.inv(x + 3 * torch.eye(3)).sum(-1) * 2, torch.randn(4, 3, 3),
                         backend="cpu", roofline=roof, reps=5)
    assert not [r for r in e.rows if "getitem" in r.name], e
    assert [r for r in e.rows if "linalg_inv" in r.name], e
    assert all(r.roof_fraction <= 1.0 for r in _within_roof(e, roof)), e
