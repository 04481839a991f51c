"""Kernels over a symbolic extent (ir/sym.py, codegen/llvm.py, runtime/sized.py): one compile runs at
every size -- 1, 2, a prime, a multiple of the vector width, a size past the thread-split threshold --
on `cpu` and `cuda_emu` (the CUDA C a GPU runs, its sizes and grids passed per call), against eager;
NVRTC compiles the symbolic CUDA kernels of that graph and of a GPT block traced with dynamic shapes."""
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
    _, run = _compile(backend)
    assert isinstance(run, SizedProgram)
    module = run.keepalive  # the machine code (cpu: the JIT; cuda_emu: the kernels' library)
    for n in SIZES + [7]:  # 7 again: its instance is reused
        got = run(*_inputs(n))
        for a, b in zip(got, _eager(*_inputs(n))):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert run.keepalive is module
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


def test_cuda_emu_launches_take_the_sizes_and_a_grid_for_them():
    pytest.importorskip("minicomp.runtime.cuda_emu")
    fused, run = _compile("cuda_emu")
    module = run.keepalive
    grids = {}
    for n in (3, 5003):
        run(*_inputs(n))
        launches = [s for s in run.last.steps if hasattr(s, "sizes")]
        assert launches and all(s.module is module and s.sizes == (n,) for s in launches)
        grids[n] = [s.cfg[0] for s in launches]
    assert grids[3] != grids[5003]  # the pointwise kernel's grid follows the size (capped at EMU_MAX_GRID)


def _nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs the [cuda] extras (cuda-bindings)")
    from minicomp.errors import MinicompError
    from minicomp.runtime import nvrtc
    try:
        nvrtc.include_dirs()
    except MinicompError as e:
        pytest.skip(str(e))
    return nvrtc


def test_nvrtc_compiles_symbolic_kernels():
    from minicomp.backends.cuda import prelude_headers
    from minicomp.codegen.cuda import generate
    from minicomp.ir import sym
    from minicomp.runtime import cubin
    nvrtc = _nvrtc()
    fused, _ = _compile("cuda_emu")
    with sym.scope(fused.sizes):
        source, launches = generate([n.meta["kernel"] for n in fused.nodes if n.op == "kernel"])
    assert all(la.symbols == ("s0",) for la in launches) and "const long long s0)" in source
    binary = nvrtc.compile(source, "sm_90", prelude_headers())
    assert binary.kind == "cubin"
    cubin.check(binary.data, launches, "sm_90")  # every kernel launches at its planned block


def test_nvrtc_compiles_a_dynamic_gpt_block_forward_and_backward(tmp_path):
    """The CUDA sources cuda_emu generated (dumped per graph) for a GPT block trained with a symbolic
    sequence length: the block runs against eager, and NVRTC compiles every source."""
    import copy

    import minicomp
    from minicomp.backends.cuda import prelude_headers
    from minicomp.models import Block
    nvrtc = _nvrtc()
    pytest.importorskip("minicomp.runtime.cuda_emu")
    torch.manual_seed(0)
    m = Block(32, 4, 64)
    ref = copy.deepcopy(m)
    c = minicomp.compile(m, backend="cuda_emu", dynamic=True, debug=str(tmp_path))
    for T in (5, 9):
        x = torch.randn(2, T, 32)
        out, want = c(x), ref(x)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        out.square().mean().backward()
        want.square().mean().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    graphs = c.report().graphs
    assert [g.kind for g in graphs] == ["forward", "backward"] and all(g.detail["symbolic"] for g in graphs)
    sources = [f.read_text() for f in sorted(tmp_path.rglob("*_cuda.txt"))]
    assert len(sources) == 2 and all("const long long s" in src for src in sources)
    for src in sources:
        assert nvrtc.compile(src, "sm_90", prelude_headers()).kind == "cubin"


SIZE_EXPRESSIONS = ["(-3)%s0", "(-3)//s0", "(-7)//s0 + (-7)%s0", "(s0 - 9)//4", "(s0 - 9)%4", "(2 - s0)//s0"]


def test_size_division_rounds_toward_minus_infinity_in_both_generators():
    """A size expression's // and % round as Python's do (ir/sym.py evaluates them so, for guards and
    grids): LLVM's sdiv/srem and C's / and % truncate toward zero, which made (-1) % T read row -1
    where x[:, -1] at a symbolic T wanted row T - 1."""
    import ctypes

    import llvmlite.ir as lir

    from minicomp.codegen import cuda_ops
    from minicomp.backends.cuda import prelude_headers
    from minicomp.codegen.llvm_values import I64, emit_sym
    from minicomp.ir import sym, sym_read
    from minicomp.runtime.llvm_jit import JitModule
    from minicomp.runtime.cuda_emu import _shared_library

    exprs = [sym_read.parse(t) for t in SIZE_EXPRESSIONS]
    module = lir.Module()
    for i, x in enumerate(exprs):
        fn = lir.Function(module, lir.FunctionType(I64, [I64]), f"size{i}")
        b = lir.IRBuilder(fn.append_basic_block())
        b.ret(emit_sym(b, x, {"s0": fn.args[0]}))
    jit = JitModule(str(module))
    source = '#include "prelude.cuh"\n' + "".join(
        f'extern "C" long long size{i}(long long s0) {{ return {cuda_ops.size(x)}; }}\n' for i, x in enumerate(exprs))
    lib = _shared_library('#include "cuda_emu.h"\n' + source, prelude_headers())
    for i, x in enumerate(exprs):
        llvm_fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(jit.address(f"size{i}"))
        c_fn = getattr(lib, f"size{i}")
        c_fn.restype, c_fn.argtypes = ctypes.c_longlong, [ctypes.c_longlong]
        for s0 in (1, 2, 3, 5, 8, 13):
            want = sym.evaluate(x, {"s0": s0})
            assert llvm_fn(s0) == want and c_fn(s0) == want, (SIZE_EXPRESSIONS[i], s0, llvm_fn(s0), c_fn(s0), want)
