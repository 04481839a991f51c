"""runtime/cuda_graph.py on the CPU: GraphReplay over a cuda_emu Program (the exact CUDA C of the
cuda backend, run by the emulator) with a recording stand-in for torch.cuda.CUDAGraph
(tests/runtime/fake_cuda.py): the capture records the call and fills its outputs with NaN, a
replay reruns it on the captured arguments and writes into the captured outputs -- what a real
graph does with the addresses it was captured with. Values are compared with eager every call."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from minicomp.backends import build
from minicomp.compiler.capture import make_context
from minicomp.compiler.frontend import lower
from minicomp.compiler.pipeline import run_passes
from minicomp.options import Options
from minicomp.report import GraphReport, Report
from minicomp.runtime.cuda_graph import GraphReplay
from tests.codegen.test_cuda_codegen import trace
from tests.runtime.fake_cuda import FakeCuda, FakeDriver, FakeStream, RecordingProgram

if shutil.which(os.environ.get("CXX", "g++")) is None:
    pytest.skip("cuda_emu needs a host C++20 compiler (g++)", allow_module_level=True)


def layer(x, w, b):
    return [torch.relu(x @ w + b) * 2, (x * x).sum(-1)]


def replayed(fn, *inputs):
    """(GraphReplay over fn's cuda_emu program, the stand-in torch.cuda, the recording program)."""
    graph, _ = lower(trace(fn, inputs), "t")
    ctx = make_context(Options(backend="cuda_emu", verify=True), "t", "cuda_emu", Report())
    program, _ = build(run_passes(graph, ctx), ctx, "cuda_emu")
    fake = FakeCuda(FakeDriver())
    fake.drv.Device(0).retain_primary_context().push()  # a graph launches in a context
    rec = RecordingProgram(program, fake)
    return GraphReplay(rec, FakeStream("ours"), {}, api=fake), fake, rec


def close(got, want):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_warm_up_capture_replay_with_new_values():
    w, b = torch.randn(16, 8), torch.randn(8)
    replay, fake, rec = replayed(layer, torch.randn(4, 16), w, b)
    held = []
    for i in range(5):
        x = torch.randn(4, 16)
        out = replay(x, w, b)
        close(out, layer(x, w, b))
        held.append((out, layer(x, w, b)))
        graph = fake.captures and replay.graph
        assert (graph is not None and graph.replays == i) if i else not fake.captures, i
    assert rec.calls == 2, "one warm-up call, one capture; every later call is a replay"
    assert [(s, mode) for s, mode, _ in fake.captures] == [("ours", "thread_local")]
    for out, want in held:  # no later replay overwrote an output handed out earlier
        close(out, want)


def test_inputs_at_their_capture_address_are_not_copied():
    x, w, b = torch.randn(4, 16), torch.randn(16, 8), torch.randn(8)
    replay, _, _ = replayed(layer, x, w, b)
    for _ in range(3):
        close(replay(x, w, b), layer(x, w, b))
    out_bytes = 4 * 8 * 4 + 4 * 4
    assert replay.detail == {"replay_bytes": out_bytes, "replay_copies": 0, "captures": 1}
    x.mul_(-1)  # new values at the same address: the graph reads them in place
    w.add_(1)
    close(replay(x, w, b), layer(x, w, b))
    # an activation autograd hands back: a new tensor each call, in a block the allocator recycled
    block = torch.empty(2, 4, 16)
    replay, _, _ = replayed(layer, block[0], w, b)
    for i in range(4):
        a = block[0]
        a.copy_(torch.randn(4, 16))
        close(replay(a, w, b), layer(a, w, b))
    assert replay.detail["replay_copies"] == 0 and replay.detail["captures"] == 1


def test_moving_inputs_are_copied_and_counted():
    w, b = torch.randn(16, 8), torch.randn(8)
    replay, _, _ = replayed(layer, torch.randn(4, 16), w, b)
    for _ in range(3):
        x = torch.randn(4, 16)
        close(replay(x, w, b), layer(x, w, b))
    assert replay.detail == {"replay_bytes": 4 * 16 * 4 + 4 * 8 * 4 + 4 * 4, "replay_copies": 1, "captures": 1}
    report = Report(graphs=[GraphReport("forward_0", "forward", "cuda", 3, 3, [], 0.0, replay.detail)])
    assert report.replay_bytes == 4 * 16 * 4 + 4 * 8 * 4 + 4 * 4
    assert f"CUDA Graph replay copies {report.replay_bytes:,} B per call" in str(report)


def test_a_replaced_parameter_is_captured_again():
    x, w, b = torch.randn(4, 16), torch.nn.Parameter(torch.randn(16, 8)), torch.randn(8)
    replay, fake, rec = replayed(layer, x, w, b)
    with torch.no_grad():
        for _ in range(3):
            close(replay(x, w, b), layer(x, w, b))
        w = torch.nn.Parameter(torch.randn(16, 8))  # model.weight = nn.Parameter(...): a new address
        close(replay(x, w, b), layer(x, w, b))
        assert replay.detail["captures"] == 2 and replay.detail["replay_copies"] == 0, "read in place again"
        close(replay(x, w, b), layer(x, w, b))
        w = torch.nn.Parameter(torch.randn(16, 8))  # it moves again: copied from now on
        close(replay(x, w, b), layer(x, w, b))
        assert replay.detail["captures"] == 3 and replay.detail["replay_copies"] == 1
        w2 = torch.nn.Parameter(torch.randn(16, 8))
        close(replay(x, w2, b), layer(x, w2, b))
        assert replay.detail["captures"] == 3, "a copied input moving needs no new capture"
    assert rec.calls == 1 + 3


def test_capture_alone_computes_nothing():
    """The stand-in's capture leaves NaN in the outputs: the value of the capturing call comes from
    the replay that follows it (a real capture runs no kernel)."""
    x, w, b = torch.randn(4, 16), torch.randn(16, 8), torch.randn(8)
    replay, fake, _ = replayed(layer, x, w, b)
    replay(x, w, b)
    out = replay(x, w, b)  # the capture
    assert replay.graph.replays == 1 and not any(o.isnan().any() for o in out)


def test_a_host_scalar_is_frozen_into_the_graph_so_a_new_value_captures_again():
    """A CPU scalar a torch op reads is a kernel argument in the captured graph, not an address."""
    seen = []

    class Program:  # a meta-device program that says which scalar each run (or replay) used
        device = "meta"

        def __call__(self, x, s):
            seen.append(s.item())
            return [x * s.item()]

        def release(self):
            pass
    fake = FakeCuda(FakeDriver())
    fake.drv.Device(0).retain_primary_context().push()
    replay = GraphReplay(RecordingProgram(Program(), fake), FakeStream("ours"), {}, api=fake)
    x = torch.empty(3, device="meta")
    for value in (2.0, 2.0, 2.0, 3.0, 3.0):
        replay(x, torch.tensor(value))
    assert replay.detail["captures"] == 2 and replay.detail["replay_copies"] == 0
    assert seen[-1] == 3.0, "the replay after the new value ran with it"
