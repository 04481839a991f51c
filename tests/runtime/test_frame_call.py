"""frame_call.py: a compiled frame's code run with Dynamo's guards, without Dynamo's Python wrapper.
Each test makes the guards matter (a global, a module attribute, a stance, a reset, a graph
break, side effects, keywords, autograd) and checks the results against eager, and whether the
call took the direct path (a spy on the torch.compile callable it steps aside to)."""
from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.frame_call import MISS

SCALE = 2.0
SEEN: list = []


def _scaled(x):
    return (x * SCALE).sin() + 1


def _spy(compiled):
    """The FrameCall of `compiled`'s last program, and a list that grows with each call that goes
    through Dynamo's wrapper (the torch.compile callable)."""
    run = compiled._fast.program
    calls, program = [], run.program

    def spy(*args, **kwargs):
        calls.append(1)
        return program(*args, **kwargs)
    run.program = spy
    return run, calls


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_direct_calls_match_eager_and_skip_the_wrapper(backend):
    c = minicomp.compile(_scaled, backend=backend)
    x = torch.randn(5, 3)
    c(x)
    run, calls = _spy(c)
    assert run.entry is not None
    for _ in range(3):
        x = torch.randn(5, 3)
        torch.testing.assert_close(c(x), _scaled(x))
    assert calls == []
    y = torch.randn(4, 3)  # another size: the guards fail, the signature table compiles another program
    torch.testing.assert_close(c(y), _scaled(y))
    assert run.attempt((y,)) is MISS and run.check((x,)) and not run.check((y,))


def test_a_changed_global_recompiles(monkeypatch):
    c = minicomp.compile(_scaled, backend="cpu")
    x = torch.randn(8)
    torch.testing.assert_close(c(x), _scaled(x))
    run, calls = _spy(c)
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    torch.testing.assert_close(c(x), (x * 3.0).sin() + 1)
    assert calls == [1]  # Dynamo's guard on SCALE failed here too: its own path recompiled
    torch.testing.assert_close(c(x), (x * 3.0).sin() + 1)
    assert calls == [1]  # and the new entry runs directly
    monkeypatch.setitem(globals(), "SCALE", 2.0)
    torch.testing.assert_close(c(x), _scaled(x))


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = 2.0

    def forward(self, x, shift=None):
        y = self.lin(x) * self.scale
        return y if shift is None else y + shift


def test_module_attributes_and_weights_are_guarded():
    m = _Scaled()
    c = minicomp.compile(m, backend="cpu")
    x = torch.randn(3, 4)
    with torch.no_grad():
        c(x)
        run, calls = _spy(c)
        m.scale = 5.0
        torch.testing.assert_close(c(x), m(x))
        m.lin.weight = torch.nn.Parameter(torch.randn(4, 4))
        torch.testing.assert_close(c(x), m(x))
        m.lin.weight.mul_(2)
        torch.testing.assert_close(c(x), m(x))
        shift = torch.randn(4)
        torch.testing.assert_close(c(x, shift=shift), m(x, shift=shift))
        n = len(calls)
        torch.testing.assert_close(c(x, shift=shift * 2), m(x, shift=shift * 2))  # keywords: direct too
        assert len(calls) == n


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_stance_reset_and_tracing_step_aside():
    c = minicomp.compile(_scaled, backend="cpu")
    x = torch.randn(6)
    c(x)
    run, calls = _spy(c)
    with torch.compiler.set_stance("force_eager"):
        assert run.attempt((x,)) is MISS
        torch.testing.assert_close(c(x), _scaled(x))
    assert calls == [1]
    torch._dynamo.reset()  # drops every entry: their guards no longer count
    assert run.attempt((x,)) is MISS
    torch.testing.assert_close(c(x), _scaled(x))
    assert run.entry is not None and run.attempt((x,)) is not MISS  # Dynamo's new entry, picked up
    with pytest.raises(RuntimeError, match="jit.trace"):  # Dynamo's own answer to torch.jit.trace
        torch.jit.trace(lambda t: c(t), (x,), check_trace=False)


def _logs(x):
    SEEN.append(x.shape[0])  # a side effect Dynamo replays after the graph
    return x.cos()


def _breaks(x):
    y = x.cos()
    print("", end="")  # a graph break: the frame resumes in a function Dynamo compiles when it runs
    return y * 2


def test_side_effects_once_per_call_and_graph_breaks_keep_dynamo():
    SEEN.clear()
    c = minicomp.compile(_logs, backend="cpu")
    for n in (3, 3, 3):
        torch.testing.assert_close(c(torch.ones(n)), torch.ones(n).cos())
    assert SEEN == [3, 3, 3] and c._fast.program.entry is not None
    b = minicomp.compile(_breaks, backend="cpu")
    x = torch.randn(5)
    for _ in range(3):
        torch.testing.assert_close(b(x), _breaks(x))
    assert b._programs and all(run.entry is None for run, _ in b._programs.values())
    assert b.report().graphs  # the callee's frame still compiled (Dynamo's path)


def test_training_calls_run_directly():
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    c = minicomp.compile(m, backend="cpu")
    x = torch.randn(5, 4, requires_grad=True)
    c(x).sum().backward()
    run, calls = _spy(c)
    for _ in range(2):
        m.zero_grad()
        x.grad = None
        c(x).square().sum().backward()
        got = [p.grad.clone() for p in m.parameters()] + [x.grad.clone()]
        m.zero_grad()
        x.grad = None
        m(x).square().sum().backward()
        want = [p.grad for p in m.parameters()] + [x.grad]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    assert calls == []


def test_profiled_calls_keep_their_marks():
    c = minicomp.compile(_scaled, backend="cpu")
    x = torch.randn(7)
    c(x)
    with torch.profiler.profile() as prof:
        torch.testing.assert_close(c(x), _scaled(x))
    assert any(e.name == "Pregraph bytecode" for e in prof.events())
