"""Kernels over a symbolic extent (ir/sym.py, codegen/llvm.py, runtime/sized.py): one compile runs at
every size -- 1, 2, a prime, a multiple of the vector width, a size past the thread-split threshold --
on `cpu` (symbolic kernels) and `cuda_emu` (compiled again per size), against eager."""
from __future__ import annotations

import pytest
import torch

from minicomp.backends import build
from minicomp.compiler.capture import make_context
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import interpret, parse, prepare, print_graph, verify
from minicomp.options import Options
from minicomp.runtime.sized import SizedProgram

TEXT = """graph f(%x: f32[s0,24], %w: f32[24], %y: f32[24,s0]) -> (f32[s0,24], f32[s0,1], f32[1,24], f32[24,s0], f32[s0,24]) {
  sizes s0 in 1.. hint 64
  %0: f32[s0,24] = mul %x %w
  %1: f32[s0,24] = exp %0
  %2: f32[s0,1] = sum %1 [dims=(1,), keepdim=true]
  %3: f32[s0,24] = div %1 %2
  %4: f32[1,24] = sum %0 [dims=(0,), keepdim=true]
  %5: f32[24,s0] = permute %3 [dims=(1, 0)]
  %6: f32[24,s0] = add %5 %y
  %7: f32[s0,24] = permute %y [dims=(1, 0)]
  %8: f32[s0,24] = sub %3 %7
  return %3, %2, %4, %6, %8
}
"""
SIZES = [1, 2, 7, 16, 5003]


def _eager(x, w, y):
    e = torch.exp(x * w)
    s = e.sum(1, keepdim=True)
    p = e / s
    return [p, s, (x * w).sum(0, keepdim=True), p.t() + y, p - y.t()]


def _inputs(n):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, 24, generator=g), torch.randn(24, generator=g), torch.randn(24, n, generator=g)


def test_symbolic_graph_text_round_trips_and_interprets():
    g = parse(TEXT)
    verify(g)
    assert print_graph(g) == TEXT
    for n in SIZES:
        for got, want in zip(interpret(g, *_inputs(n)), _eager(*_inputs(n))):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _compile(backend):
    g = parse(TEXT)
    ctx = make_context(Options.make(backend), g.name, backend)
    fused = run_passes(g, ctx)
    return fused, build(fused, ctx, backend)[0]


def test_fused_symbolic_graph_round_trips():
    fused, _ = _compile("cpu")
    text = print_graph(fused)
    assert "domain (i0: s0) x [i1: 24]" in text  # a loop over the symbolic extent
    assert "b2[i0 + {s0}*i1]" in text  # a transposed read: its stride is the size
    assert print_graph(parse(text)) == text


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_one_program_runs_every_size(backend):
    if backend == "cuda_emu":
        pytest.importorskip("minicomp.runtime.cuda_emu")
    _, run = _compile(backend) if backend == "cpu" else (None, None)
    if backend == "cuda_emu":  # a backend without symbolic kernels: one static compile per size
        from minicomp.backends.sized import per_size_program
        g = parse(TEXT)

        def static(graph):
            c = make_context(Options.make(backend), graph.name, backend)
            return build(run_passes(graph, c), c, backend)[0]
        run, detail = per_size_program(g, static)
        assert detail["specialized_per_size"]
    assert isinstance(run, SizedProgram)
    for n in SIZES + [7]:  # 7 again: its instance is reused
        got = run(*_inputs(n))
        for a, b in zip(got, _eager(*_inputs(n))):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert run.built == len(SIZES)


def test_cpu_kernels_are_compiled_once_and_read_sizes_at_run_time():
    fused, run = _compile("cpu")
    assert sum(n.op == "kernel" for n in fused.nodes) == 3
    run(*_inputs(3))
    jit = run.keepalive
    for n in (4, 5003):
        run(*_inputs(n))
        assert run.keepalive is jit  # the same machine code for every size


GIVEN = """graph g(%x: f32[8]) -> (f32[s0]) {
  sizes s0 in 2..8 hint 4 given
  %0: f32[s0] = slice %x [dim=0, end=size("s0"), start=0, step=1]
  %1: f32[s0] = mul %0 %0
  return %1
}
"""


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_size_no_input_carries_is_passed_as_an_int(backend):
    """x[:n] after `n = t.item()`: the size arrives as an argument (`given`), not as a dimension."""
    g = parse(GIVEN)
    assert g.size_inputs == ["s0"] and print_graph(g) == GIVEN
    if backend == "interpret":
        run = prepare(g)
    else:
        ctx = make_context(Options.make(backend), g.name, backend)
        run = build(run_passes(g, ctx), ctx, backend)[0]
    x = torch.randn(8)
    for n in (2, 5, 8):
        torch.testing.assert_close(run(x, sizes=(n,))[0], x[:n] * x[:n])
