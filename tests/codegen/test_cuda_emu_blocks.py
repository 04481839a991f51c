"""cuda_emu at the block sizes a GPU runs: every reduction layout at 1024 threads a block, and the long
rows whose planned blocks are 512 and 1024 threads at exactly that size. The backend caps emulated
blocks at EMU_MAX_BLOCK (128), which hides what only a full block
shows -- 32 warps sharing a block reduction's 32 partials, warps past the row's end, the barrier
between two reductions that reuse shared memory. Compared with eager, as the other cuda_emu tests."""
from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from minicomp.codegen import cuda as cuda_codegen
from minicomp.codegen.cuda import generate
from minicomp.backends import cuda_emu as cuda_emu_backend
from minicomp.compiler.capture import compile_fx_graph
from minicomp.compiler.frontend import lower
from minicomp.options import Options
from minicomp.report import Report
from tests.codegen.test_cuda_codegen import flat, fuse, trace

if shutil.which(os.environ.get("CXX", "g++")) is None:
    pytest.skip("cuda_emu needs a host C++20 compiler (g++)", allow_module_level=True)


def _ties(*shape):
    return (torch.randn(*shape) * 2).round()  # argmax must pick the first of equal values


def _layer_norm(x):
    return F.layer_norm(x, (x.shape[-1],))


# name -> (fn, inputs, the layout its row kernel gets); rows long enough for every lane of a block
LAYOUTS = {
    "thread": (lambda x: (x.sum(1), x.amax(1), x.argmax(1)), lambda: (_ties(3000, 20),), "thread"),
    "thread_columns": (lambda x: (x * 2).sum(0), lambda: (torch.randn(64, 2100),), "thread"),
    "warp": (lambda x: (F.softmax(x, -1), x.argmin(-1), _layer_norm(x)), lambda: (_ties(70, 900),), "warp"),
    "block": (lambda x: (F.softmax(x, -1), x.argmax(-1), _layer_norm(x), x.amin(-1)),
              lambda: (_ties(3, 3000),), "block"),
}


def _kernels(fn, inputs):
    graph, _ = lower(trace(fn, inputs), "blocks")
    return [n.meta["kernel"] for n in fuse(graph).nodes if n.op == "kernel"]


def _emu_matches_eager(fn, inputs, monkeypatch, max_block=1024, block=None):
    """fn through the cuda_emu backend with its block cap lifted to `max_block`; `block` replaces
    every kernel's planned block size (generate(block=...)), so thread and warp layouts, planned at
    256 threads, run at 1024 too. Returns the launches."""
    seen = []

    def recording(kernels, **kw):
        source, launches = generate(kernels, **kw, **({"block": block} if block else {}))
        seen.extend(launches)
        return source, launches
    monkeypatch.setattr(cuda_codegen, "generate", recording)  # backends/cuda.py imports it per build
    monkeypatch.setattr(cuda_emu_backend, "EMU_MAX_BLOCK", max_block)
    run = compile_fx_graph(trace(fn, inputs), inputs, Options.make("cuda_emu"), Report(), "inference")
    got = run([x.clone() for x in inputs])
    for g, w in zip(got, flat(fn)(*inputs), strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-5, atol=1e-5)
    return seen


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_at_1024_threads(name, monkeypatch):
    fn, make, layout = LAYOUTS[name]
    torch.manual_seed(0)
    inputs = make()
    assert generate(_kernels(fn, inputs))[1][0].strategy == layout
    launches = _emu_matches_eager(fn, inputs, monkeypatch, block=1024)
    assert launches and all(la.block == la.bound == 1024 for la in launches)
    assert any(la.strategy == layout for la in launches)


@pytest.mark.parametrize("length, block", [(3000, 256), (10000, 512), (20000, 1024)])
def test_long_rows_at_their_planned_block(length, block, monkeypatch):
    """Block rows get 256, 512 or 1024 threads by their length; each runs at exactly that size, as
    the cuda backend launches it."""
    fn = lambda x: (F.softmax(x, -1), x.argmax(-1), _layer_norm(x))  # noqa: E731
    x = _ties(2, length)
    x[1, 7] = float("nan")
    launches = _emu_matches_eager(fn, (x,), monkeypatch)
    assert {la.block for la in launches if la.strategy == "block"} == {block}
    assert all(la.block == la.bound for la in launches)


# -- the smallest launches: no loop at all, or loops that never run ------------------------------------

EDGES = {
    "zero_d": (lambda x: (x.sum(), x.mean(), x.amax(), x.amin(), torch.logsumexp(x, 0), F.mse_loss(x, x * 2)),
               lambda: (torch.tensor(1.5),)),
    "size_one_dims": (lambda x, y: (F.layer_norm(x, (1,)), F.rms_norm(x, (1,)), y.amax(1, keepdim=True),
                                    torch.where(y > 0, y.amax(1, keepdim=True), y).var(0), y.argmax(1)),
                      lambda: (torch.randn(4, 1), torch.randn(5, 1))),
    "empty": (lambda x, y: (x.exp(), x.sum(1), y.sum(1), y.repeat(2, 3), F.softmax(x, -1)),
              lambda: (torch.randn(0, 3), torch.randn(3, 0))),
}


@pytest.mark.parametrize("name", EDGES)
def test_reductions_without_loops_and_empty_tensors_run(name, monkeypatch):
    """0-d reductions (a KeyError in the generator), reductions over size-1 dims (stored nothing) and
    empty tensors (divided by zero while generating), run at a full block."""
    fn, make = EDGES[name]
    _emu_matches_eager(fn, make(), monkeypatch, block=1024)
