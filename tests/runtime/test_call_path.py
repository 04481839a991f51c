"""The per-call path (runtime/program.py, runtime/cpu.py PlanRun) and its measured breakdown
(minicomp/overhead.py): a program of plain kernels runs as one native call however many inputs
it has, fixed pointers are bound once, and every guard still holds."""
from __future__ import annotations

import threading

import torch

import minicomp
from minicomp.bench_cases import make_case
from minicomp.overhead import breakdown, format_breakdown

from .test_program import _program_of


def _kernels100(x):
    y = x * 2
    for i in range(6):  # each step reduces along the other dim: kernels that cannot fuse
        y = y - y.mean(i % 2, keepdim=True)
    return y


def test_a_program_of_kernels_runs_as_one_native_call():
    x = torch.randn(32, 16)
    c = minicomp.compile(_kernels100, backend="cpu")
    ex = _program_of(c, x).primary()
    assert "PLAN_RUN(" in ex.source and "R1()" not in ex.source and ".data_ptr()" in ex.source
    assert "C" not in "".join(ln for ln in ex.source.splitlines() if "data_ptr" in ln)  # arena: bound once
    for _ in range(3):
        x = torch.randn(32, 16)
        torch.testing.assert_close(c(x), _kernels100(x))
    xt = torch.randn(16, 32).t()  # strides the program was not compiled for: a new signature, still right
    torch.testing.assert_close(c(xt), _kernels100(xt))


def test_calls_side_by_side_take_their_own_tables():
    """A second call in flight gets a private executor (per-step launches, tables of its own)."""
    c = minicomp.compile(_kernels100, backend="cpu")
    xs = [torch.randn(32, 16) for _ in range(8)]
    c(xs[0])
    errors = []

    def work(x):
        try:
            for _ in range(20):
                torch.testing.assert_close(c(x), _kernels100(x))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_the_26_input_chain_binds_its_inputs_in_one_call():
    case = make_case("chain50_26in", quick=True)
    assert len(case.inputs) == 26
    c = minicomp.compile(case.fn, backend="cpu")
    with torch.no_grad():
        torch.testing.assert_close(c(*case.inputs), case.fn(*case.inputs))
        (program,) = c.report().runs
        ex = program.primary()
        assert ex.source.count("R0(K0)") + ex.source.count("PLAN_RUN(") == 1  # one native call
        odd = [torch.randn(32)[::2] if i == 3 else torch.randn(16) for i in range(26)]
        torch.testing.assert_close(c(*odd), case.fn(*odd))  # a strided input: made contiguous, still right


def test_the_breakdown_measures_every_layer_and_leaves_the_call_as_it_was():
    case = make_case("tiny_chain50", quick=True)
    c = minicomp.compile(case.fn, backend="cpu")
    with torch.no_grad():
        c(*case.inputs)
        us = breakdown(c, case.inputs, reps=3)
        assert {"total", "guards", "dynamo + aot", "program", "kernels", "other"} <= set(us)
        assert "input checks" not in us  # the one input's strides are Dynamo's guards' to check
        assert us["total"] > 0 and us["kernels"] > 0
        assert abs(us["total"] - sum(v for k, v in us.items() if k != "total")) < 1e-6
        assert format_breakdown("tiny_chain50", us).startswith("tiny_chain50: ")
        x = torch.randn(16)
        torch.testing.assert_close(c(x), case.fn(x))
        assert c.report().runs[0].primary().run.__name__ == "run"


def test_the_breakdown_counts_each_launch_as_kernels_when_a_slot_dies_after_it():
    """Between torch calls each kernel launches on its own; when its launch is the last use of a
    value the call drops that value after it (`del`). The phased twin put the `del` last and the
    launch among the pointer lines, so a layer_norm kernel's 20 us read as pointer binding."""
    import torch.nn.functional as F
    f = lambda x, w1, w2: (F.layer_norm(F.gelu(x @ w1), (32,)) @ w2).relu()  # noqa: E731
    x, w1, w2 = torch.randn(8, 16), torch.randn(16, 32), torch.randn(32, 4)
    c = minicomp.compile(f, backend="cpu")
    with torch.no_grad():
        torch.testing.assert_close(c(x, w1, w2), f(x, w1, w2))
        ex = c.report().runs[0].primary()
        run, _, _ = ex.phased()
        lines = ex.phased_source.splitlines()
        closes = {i: int(ln.split("ACC[")[1].split("]")[0]) for i, ln in enumerate(lines) if "ACC[" in ln}
        launches = [i for i, ln in enumerate(lines) if ln.strip().startswith("R") and "(K" in ln]
        assert launches and "del " in ex.phased_source
        for i in launches:  # the phase a launch's line is timed in: the first clock read after it
            assert closes[min(j for j in closes if j > i)] == run.phases["kernels"], ex.phased_source
        torch.testing.assert_close(run(x, w1, w2)[0], f(x, w1, w2))


def test_profiled_and_traced_calls_take_the_one_native_call_apart(monkeypatch):
    """Per-step timers and a torch.profiler trace see each kernel: such calls run step by step."""
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(32, 16)
    c = minicomp.compile(_kernels100, backend="cpu")
    program = _program_of(c, x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.testing.assert_close(c(x), _kernels100(x))
    names = [e.name for e in prof.events() if e.name.startswith("minicomp ")]
    assert names == program.names and len(names) >= 6
    assert "PLAN_RUN(" not in program.primary().traced_source
    monkeypatch.setenv("MINICOMP_PROFILE", "1")
    p = minicomp.compile(_kernels100, backend="cpu")
    profiled = _program_of(p, x)
    assert "PLAN_RUN(" not in profiled.primary().source and all(t is not None for t in profiled.timers)
    torch.testing.assert_close(p(x), _kernels100(x))


def test_inputs_dynamo_guards_skip_the_contiguity_check_and_parameters_keep_it():
    """A tensor the frame gets directly has every stride checked by Dynamo's guards before each call:
    its program checks no contiguity. A parameter keeps its check (Dynamo may skip guards on an
    unchanged module dict), so `p.data = q.t()` still gives eager's answer."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.randn(16, 16))

        def forward(self, x, y):
            return torch.relu(x * y + self.p)
    m = M()
    c = minicomp.compile(m, backend="cpu")
    x, y = torch.randn(16, 16), torch.randn(16, 16)
    with torch.no_grad():
        torch.testing.assert_close(c(x, y), m(x, y))
        (program,) = c.report().runs
        assert len(program.contiguous_inputs) == 1  # the parameter; x and y are Dynamo's to check
        assert program.primary().source.count("is_contiguous()") == 1
        xt = torch.randn(16, 16).t()  # strides the guards were not made for: another graph, still right
        torch.testing.assert_close(c(xt, y), m(xt, y))
        m.p.data = torch.randn(16, 16).t()
        torch.testing.assert_close(c(x, y), m(x, y))
