"""runtime/cuda.py without a GPU: pycuda replaced by a driver with pycuda's thread-local context
stacks (tests/runtime/fake_cuda.py), torch.cuda's calls by a recorder, programs run on `meta`
tensors. Every entry point -- module load, launch, capture, replay -- must work from any thread,
leave no context pushed behind, and run on the inputs' device; constants and inputs a kernel reads
must be on the program's device."""
from __future__ import annotations

import pytest
import torch

from minicomp.backends import build
from minicomp.compiler.capture import make_context
from minicomp.compiler.frontend import lower
from minicomp.compiler.pipeline import run_passes
from minicomp.errors import MinicompError
from minicomp.options import Options
from minicomp.report import Report
from minicomp.runtime import cuda
from tests.codegen.test_cuda_codegen import trace
from tests.runtime.fake_cuda import install, meta, run_in_thread


def cuda_program(fn, *inputs, graphs=True):
    """fn compiled for backend='cuda' as compile_fx_graph would (NVRTC really compiles it), with
    whatever pycuda and torch.cuda the test installed. Returns (callable, report detail, report)."""
    graph, _ = lower(trace(fn, inputs), "t")
    report = Report()
    ctx = make_context(Options(backend="cuda", verify=True, cuda_graphs=graphs), "t", "cuda", report)
    run, detail = build(run_passes(graph, ctx), ctx, "cuda")
    return run, detail, report


def mlp(x, w):
    return [torch.relu(x @ w) * 2 + x.sum(-1, keepdim=True)]


def test_the_fake_driver_has_pycudas_per_thread_contexts(monkeypatch):
    drv, _ = install(monkeypatch)
    ctx = drv.Device(0).retain_primary_context()
    ctx.push()
    drv.module_from_buffer(b"x")  # fine: current on this thread
    with pytest.raises(RuntimeError, match="no currently active context"):
        run_in_thread(drv.module_from_buffer, b"x")  # another thread has an empty stack
    drv.Context.pop()
    with pytest.raises(RuntimeError, match="cannot pop"):
        drv.Context.pop()


@pytest.mark.parametrize("graphs", [True, False])
def test_every_entry_point_works_from_any_thread(monkeypatch, graphs):
    drv, fake = install(monkeypatch)
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    run, detail, _ = cuda_program(mlp, x, w, graphs=graphs)
    # first call (device setup, module load, warm-up) on one thread, the capture on another, replays on a third
    outs = [run_in_thread(run, *meta(x, w), name=f"t{i}") for i in range(3)] + [run(*meta(x, w))]
    assert all(o[0].shape == (8, 16) and o[0].device.type == "meta" for o in outs)
    assert drv.depth() == 0, "a context was left pushed on the main thread"
    kernels = {name for name, _, _ in drv.launches}
    assert kernels and {t for _, _, t in drv.launches} == {"t0", "t1", "t2", "MainThread"}
    loads = [e for e in drv.events if e[0] == "load"]
    assert [t for _, t, _ in loads] == ["t0"], "the module is loaded once, on the first caller's thread"
    pushes = [e for e in drv.events if e[0] == "push"]
    assert len(pushes) == len([e for e in drv.events if e[0] == "pop"]), "every push is popped"
    if graphs:
        assert [(mode, t) for _, mode, t in fake.captures] == [("thread_local", "t1")]
        assert detail["captures"] == 1
    else:
        assert not fake.captures
    run.release()
    import gc
    gc.collect()
    assert drv.unloads == 1 and drv.bad_unloads == 0, "the module was not unloaded, or not in its context"



def test_release_keeping_the_code_drops_the_graph_and_captures_again(monkeypatch):
    """A backward's release (api._release, keep_code): the captured graph and the arena go, the
    module stays loaded, and the next calls warm up and capture again; a full release unloads."""
    import gc
    drv, fake = install(monkeypatch)
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    run, detail, _ = cuda_program(mlp, x, w)
    for _ in range(3):  # warm-up, capture, replay
        run(*meta(x, w))
    assert len(fake.captures) == 1
    run.release(keep_code=True)
    gc.collect()
    assert run.run.graph is None and not run.program._first and drv.unloads == 0
    for _ in range(3):
        out = run(*meta(x, w))
    assert out[0].shape == (8, 16) and len(fake.captures) == 2 and detail["captures"] == 2
    assert [t for e, t, _ in drv.events if e == "load"] == ["MainThread"]  # loaded once
    run.release()
    gc.collect()
    assert drv.unloads == 1

def test_a_symbolic_graph_loads_one_module_and_captures_each_size(monkeypatch):
    """One module for every size; each size's launches pass its values after the pointers (as the
    kernels' `long long` parameters), and each size is a program instance of its own CUDA Graph."""
    from minicomp.ir import parse
    from tests.codegen.test_symbolic_kernels import TEXT, _inputs
    drv, fake = install(monkeypatch)
    graph = parse(TEXT)
    ctx = make_context(Options(backend="cuda", verify=True), "t", "cuda", Report())
    run, detail = build(run_passes(graph, ctx), ctx, "cuda")
    for n in (3, 3, 3, 700, 700):  # per size: warm-up, then a capture (and its replay), then replays
        out = run(*meta(*_inputs(n)))
        assert out[0].shape == (n, 24) and out[3].shape == (24, n)
    assert [t for e, t, _ in drv.events if e == "load"] == ["MainThread"]
    assert {args[-1] for _, args, _ in drv.launches} == {3, 700}
    assert len(fake.captures) == 2 and run.program.built == 2


def test_lazy_backward_on_autograd_worker_thread(monkeypatch):
    """AOTAutograd compiles the backward at the first backward(), on autograd's device thread: here
    the backward program is built and first run inside backward() called from a new thread."""
    drv, _ = install(monkeypatch)
    x = torch.randn(4, 8)
    forward, _, _ = cuda_program(lambda a: [torch.exp(a) * 3], x)
    lazy = {}

    class Compiled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return forward(a)[0]

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            if "bw" not in lazy:  # built on this (the autograd worker's) thread
                lazy["bw"] = cuda_program(lambda a, g: [torch.exp(a) * 3 * g], x, x)[0]
            return lazy["bw"](a, g)[0]

    a = meta(x)[0].requires_grad_()
    for step in range(3):  # warm-up, capture, replay of both programs
        y = Compiled.apply(a)
        (grad,) = run_in_thread(torch.autograd.grad, y, a, torch.ones_like(y), name=f"autograd{step}")
        assert grad.shape == a.shape and grad.device.type == "meta"
    threads = {t for _, _, t in drv.launches}
    assert {"MainThread", "autograd0", "autograd2"} <= threads
    assert drv.depth() == 0


def test_runs_on_its_inputs_device_not_the_current_one(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode
    drv, fake = install(monkeypatch)
    with FakeTensorMode():
        x = torch.empty(3, device="cuda:1")
        scalar = torch.empty((), device="cpu")
    assert cuda.input_device([scalar, x]) == torch.device("cuda", 1)
    assert cuda.input_device([2.0]) == torch.device("cuda", 0)  # no tensor: the current device
    seen = []

    def bind(where, dev, inputs):
        seen.append((where, dev.index, drv.Context.get_current().device))
        return lambda *xs: ["ran"]
    run = cuda.CudaRunner(bind, {}, graphs=False, arena_bytes=0)
    assert fake.current_device() == 0 and run(scalar, x) == ["ran"]
    assert seen == [(torch.device("cuda", 1), 1, 1)], "bound to cuda:1 in cuda:1's primary context"
    assert run.device.torch_stream.device == torch.device("cuda", 1)


def test_our_stream_is_non_blocking_and_ordered_with_the_callers(monkeypatch):
    drv, fake = install(monkeypatch)
    x = torch.randn(4, 4)
    run, _, _ = cuda_program(lambda a: [a * 2], x, graphs=False)
    run(*meta(x))
    assert [flags for what, _, flags in drv.events if what == "stream"] == [cuda.NON_BLOCKING]
    ours = run.device.torch_stream
    assert ours.waits == ["default 0"], "our stream waits for the caller's before the call"


def test_cpu_constant_is_moved_to_the_programs_device(monkeypatch):
    install(monkeypatch)
    x = torch.randn(5)
    run, _, _ = cuda_program(lambda a: [a * torch.tensor(2.0) + torch.tensor([1.0, 2, 3, 4, 5])], x)
    run(*meta(x))
    constants = run.program.constants
    assert len(constants) == 2 and all(c.device.type == "meta" for c in constants)


def test_a_buffer_on_another_device_is_refused_by_name(monkeypatch):
    install(monkeypatch)
    x, s = torch.randn(5), torch.tensor(3.0)
    run, _, _ = cuda_program(lambda a, b: [a * b], x, s)
    with pytest.raises(MinicompError, match=r"input 1 \(\(\), torch.float32\) is on cpu, but the program runs on meta"):
        run(meta(x)[0], s)  # a CPU scalar tensor a kernel would read through a host pointer

    from minicomp.backends import cuda as cuda_backend
    monkeypatch.setattr(cuda_backend, "on_device", lambda graph, device: graph)  # as before: constants not moved
    run, _, _ = cuda_program(lambda a: [a * torch.tensor(2.0)], x)
    with pytest.raises(MinicompError, match=r"constant \S+ \(\(\), torch.float32\) is on cpu, but the program runs on meta"):
        run(*meta(x))


def test_the_torch_cuda_stand_in_matches_torch_cuda():
    """Every torch.cuda call the runtime makes exists in this torch, with the keywords passed."""
    import inspect
    for name in ("init", "current_device", "get_device_capability", "ExternalStream", "current_stream", "stream",
                 "CUDAGraph", "graph"):
        assert hasattr(torch.cuda, name), name
    assert {"stream", "capture_error_mode"} <= set(inspect.signature(torch.cuda.graph.__init__).parameters)
    assert "device" in inspect.signature(torch.cuda.ExternalStream).parameters
    assert hasattr(torch.cuda.Stream, "wait_stream") and hasattr(torch.cuda.CUDAGraph, "replay")


def test_the_drivers_version_is_checked_at_first_use(monkeypatch):
    from minicomp.runtime import nvrtc
    install(monkeypatch, driver_version=12080)  # a CUDA 12.8 driver under this machine's NVRTC 13
    x = torch.randn(4)
    run, _, _ = cuda_program(lambda a: [a + 1], x)
    if nvrtc._pair(nvrtc.version())[0] <= 12:
        pytest.skip("this NVRTC is not newer than the fake driver")
    with pytest.raises(nvrtc.NvrtcError, match="the driver supports CUDA 12.8, older than this NVRTC's major"):
        run(*meta(x))
