"""runtime/program.py: big CPU outputs reuse the memory of outputs the caller has dropped, and never
the memory of one that anything still references (a tensor, a view, a storage, an autograd save)."""
from __future__ import annotations

import copy
import re

import pytest
import torch

import minicomp
from minicomp.runtime.program import RECYCLE_KEEP, RECYCLE_MIN_BYTES, Recycler

N = RECYCLE_MIN_BYTES // 4 + 3  # floats: just above the threshold, not a multiple of a vector


def _compiled():
    return minicomp.compile(lambda x: torch.cos(x) * 2 + 1, backend="cpu")


def _want(x):
    return torch.cos(x) * 2 + 1


def test_a_dropped_output_is_recycled_and_holds_the_new_values():
    f = _compiled()
    x1, x2 = torch.randn(N), torch.randn(N)
    y = f(x1)
    ptr = y.data_ptr()
    del y
    y = f(x2)
    assert y.data_ptr() == ptr
    torch.testing.assert_close(y, _want(x2))


def test_the_loop_idiom_settles_on_two_buffers():
    """`y = f(x)` keeps the previous output alive while the next is computed."""
    f = _compiled()
    xs = [torch.randn(N) for _ in range(6)]
    ptrs = set()
    y = None
    for x in xs:
        y = f(x)
        ptrs.add(y.data_ptr())
        torch.testing.assert_close(y, _want(x))
    assert len(ptrs) == RECYCLE_KEEP


def test_outputs_still_referenced_are_never_overwritten():
    f = _compiled()
    x = torch.randn(N)
    kept = [f(x)]                       # the tensor itself
    view = f(x)[5:]                     # only a view survives
    storage = f(x).untyped_storage()    # only a storage object survives
    for _ in range(4):
        f(torch.randn(N))
    torch.testing.assert_close(kept[0], _want(x))
    torch.testing.assert_close(view, _want(x)[5:])
    got = torch.empty(0).set_(storage, 0, (N,), (1,))
    torch.testing.assert_close(got, _want(x))


def test_outputs_saved_for_backward_are_not_recycled_before_backward():
    f = minicomp.compile(lambda x: torch.exp(x * 0.5), backend="cpu")  # exp saves its output
    x1 = torch.randn(N, requires_grad=True)
    y1 = f(x1)
    loss = y1.sum()
    del y1
    for _ in range(3):
        f(torch.randn(N, requires_grad=True)).sum().backward()
    loss.backward()
    torch.testing.assert_close(x1.grad, torch.exp(x1.detach() * 0.5) * 0.5)


def test_a_resized_storage_is_not_taken_back():
    r = Recycler((N,), torch.float32, "cpu")
    t = r()
    t.resize_(2 * N)  # the caller grew the storage, then dropped it
    del t
    u = r()
    assert u.shape == (N,) and u.untyped_storage().nbytes() == r.nbytes


# ---- views of values whose layout is known: one as_strided each -----------------------------------------

VIEWS = """graph v(%x: f32[6,8], %w: f32[8,4], %b: f32[1,4], %y: f32[3,2,5]) -> (f32[6,6], f32[3,8,5], f32[4,4], f32[8,4]) {
  %0: f32[6,4] = mm %x %w
  %1: f32[4,6] = permute %0 [dims=(1, 0)]
  %2: f32[6,8] = exp %x
  %3: f32[3,2,8] = reshape %2 [shape=(3, 2, 8)]
  %4: f32[3,8,2] = permute %3 [dims=(0, 2, 1)]
  %5: f32[3,8,5] = bmm %4 %y
  %6: f32[6,4] = expand %b [shape=(6, 4)]
  %7: f32[4,6] = permute %6 [dims=(1, 0)]
  %8: f32[6,6] = mm %0 %7
  %9: f32[4,4] = mm %1 %0
  %10: f32[8,6] = permute %x [dims=(1, 0)]
  %11: f32[8,4] = mm %10 %0
  return %8, %5, %9, %11
}
"""


def _program(text):
    from minicomp.backends import build
    from minicomp.compiler.capture import make_context
    from minicomp.compiler.pipeline import run_passes
    from minicomp.ir import parse
    from minicomp.options import Options
    ctx = make_context(Options(backend="cpu", verify=True), "t", "cpu")
    program, _ = build(run_passes(parse(text), ctx), ctx, "cpu")
    return program


def test_view_chains_of_known_layouts_are_one_as_strided_each():
    """Views of an mm result, of a stored kernel result and of an input at a storage offset: each
    chain is one AsStrided step (views only other views read are skipped). An input no kernel reads
    (w, b, y: only matmuls take them) is not made contiguous: its views are guarded, one as_strided
    while it is contiguous and the torch ops otherwise, on whatever layout it comes in: b with any
    stride on its size-1 dim, and transposed."""
    from minicomp.ir import interpret, parse
    from minicomp.runtime.program import AsStrided
    program = _program(VIEWS)
    views = {(s.size, s.stride): s.fallback is not None for s in program.steps if isinstance(s, AsStrided)}
    assert views == {((4, 6), (1, 4)): False,          # %1: mm result, transposed
                     ((3, 8, 2), (16, 1, 8)): False,   # %4: exp's buffer, reshaped and transposed
                     ((8, 6), (1, 8)): False,          # %10: x transposed
                     ((4, 6), (1, 0)): True}           # %7: b expanded and transposed, b's layout checked
    assert program.contiguous_inputs == (0,), "only x, which the exp kernel reads, must be contiguous"
    x = torch.randn(100)[3:51].view(6, 8)  # contiguous, at storage offset 3
    w, y = torch.randn(8, 4), torch.randn(3, 2, 5)
    for b in (torch.randn(1, 4), torch.randn(4).as_strided((1, 4), (77, 1)), torch.randn(4, 1).t(),
              torch.randn(1, 8)[:, ::2]):
        for got, want in zip(program(x, w, b, y), interpret(parse(VIEWS), x, w, b, y), strict=True):
            torch.testing.assert_close(got, want)


GUARDED = """graph g(%x: f32[6,8], %w: f32[8,4]) -> (f32[6,8], f32[4,4]) {
  %0: f32[4,8] = permute %w [dims=(1, 0)]
  %1: f32[6,4] = mm %x %w
  %2: f32[6,8] = mm %1 %0
  %3: f32[4] = sum %1 [dims=(0,), keepdim=false]
  %4: f32[4,1] = reshape %3 [shape=(4, 1)]
  %5: f32[1,4] = permute %4 [dims=(1, 0)]
  %6: f32[4,4] = mm %4 %5
  return %2, %6
}
"""


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_views_of_a_root_of_unknown_layout_are_checked_at_each_call(backend):
    """A free input (w: only matmuls and views read it) and a torch result no kernel reads (a column
    sum) come in whatever layout the caller or torch gives: their views are one as_strided while
    the root is contiguous, the chain of torch ops otherwise. Both paths give the interpreter's
    results: w contiguous, at a storage offset, transposed, strided."""
    from minicomp.backends import build
    from minicomp.compiler.capture import make_context
    from minicomp.compiler.pipeline import run_passes
    from minicomp.ir import interpret, parse
    from minicomp.options import Options
    from minicomp.runtime.program import AsStrided
    ctx = make_context(Options(backend=backend, verify=True), "t", "cpu")
    program, _ = build(run_passes(parse(GUARDED), ctx), ctx, backend)
    views = {(s.size, s.stride): s.fallback is not None for s in program.steps if isinstance(s, AsStrided)}
    assert views == {((4, 8), (1, 4)): True,   # %0: w transposed
                     ((4, 1), (1, 1)): True,   # %4: the sum's reshape
                     ((1, 4), (1, 1)): True}   # %5: and its transpose
    x = torch.randn(6, 8)
    for w in (torch.randn(8, 4), torch.randn(4, 8).t(), torch.randn(8, 8)[:, 1::2], torch.randn(100)[7:39].view(8, 4)):
        for got, want in zip(program(x, w), interpret(parse(GUARDED), x, w), strict=True):
            torch.testing.assert_close(got, want)


NOT_CONTIGUOUS = """graph g(%w: f32[4,6]) -> (f32[2,4]) {
  %0: f32[6,4] = extern %w [args=($0, 0, 1), target="aten.transpose.int"]
  %1: f32[2,4] = slice %0 [dim=0, start=0, end=2, step=1]
  %2: f32[2,4] = exp %1
  return %2
}
"""


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_kernel_reads_a_view_of_a_torch_result_contiguous_whatever_its_layout(backend):
    """A slice of a torch result is contiguous when the result is, but this one (a transpose) is
    not: the slice's torch path makes it contiguous before the exp kernel reads it."""
    from minicomp.backends import build
    from minicomp.compiler.capture import make_context
    from minicomp.compiler.pipeline import run_passes
    from minicomp.ir import interpret, parse
    from minicomp.options import Options
    ctx = make_context(Options(backend=backend, verify=True), "t", "cpu")
    program, _ = build(run_passes(parse(NOT_CONTIGUOUS), ctx), ctx, backend)
    w = torch.randn(4, 6)
    for got, want in zip(program(w), interpret(parse(NOT_CONTIGUOUS), w), strict=True):
        torch.testing.assert_close(got, want)


def test_a_guarded_view_a_kernel_reads_is_contiguous_on_either_path():
    """Were the slice a kernel's operand itself (not folded into its index math), it would be a
    guarded view: contiguous on the as_strided path (the layout says so), and made contiguous on
    the torch path, whose slice of the transposed result is not."""
    from minicomp.backends.assemble import _view_chain
    from minicomp.backends.layout import static_views
    from minicomp.ir import parse
    graph = parse(NOT_CONTIGUOUS)
    t, view = graph.nodes[0], graph.nodes[1]
    root, size, stride, offset, guarded = static_views(graph, {view})[view]
    assert root is t and guarded and (size, stride) == ((2, 4), (4, 1))
    got = _view_chain(view, t, "cpu", contiguous=True)(torch.randn(4, 6).t())
    assert got.is_contiguous() and got.shape == (2, 4)


def _without_timers(source: str) -> str:
    """A generated call with its profiling lines taken out: clock reads and what gets their seconds."""
    return "".join(ln for ln in source.splitlines(keepends=True)
                   if ln.strip() != "t = clock()" and not re.fullmatch(r"\s*D\d+\(clock\(\) - t\)\n?", ln))


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_profiled_program_runs_the_same_steps_as_the_plain_one(monkeypatch, backend):
    """A program's call is generated code, one line a step (Executor._generate). With
    MINICOMP_PROFILE=1 it is the same code with a clock read before and after each kernel and torch
    call, and nothing else: what is timed is what runs unprofiled. The report has every call's
    seconds per step and the mean per kernel; both give eager's results."""
    def f(x, w):
        return torch.softmax(x @ w, -1).t().contiguous() + 1
    x, w = torch.randn(64, 32), torch.randn(32, 16)
    compiled = minicomp.compile(f, backend=backend)  # kept: a deleted callable releases its programs
    plain = _program_of(compiled, x, w).primary()
    assert plain.run.__name__ == "run" and plain.run.__code__.co_filename == "<minicomp program>"
    assert "clock" not in plain.source
    monkeypatch.setenv("MINICOMP_PROFILE", "1")
    c = minicomp.compile(f, backend=backend)
    program = _program_of(c, x, w)
    profiled = program.primary()
    assert profiled.run.__code__.co_filename == "<minicomp program>"
    timed = sum(t is not None for t in program.timers)
    assert timed == len(c.report().steps) >= 3 and profiled.source.count("clock()") == 2 * timed
    assert _without_timers(profiled.source) == plain.source
    for _ in range(3):
        torch.testing.assert_close(c(x, w), f(x, w))
    assert all(len(s.samples) == 4 for s in c.report().steps)  # the call in _program_of, and three
    assert c.report().kernels and all(k.time_s > 0 for k in c.report().kernels)


def test_a_traced_call_runs_the_same_steps_inside_record_functions():
    """Under torch.profiler a program takes the same generated steps, each inside a record_function
    of its name, so a trace shows each kernel and torch call."""
    from torch.profiler import ProfilerActivity, profile

    def f(x, w):
        return torch.softmax(x @ w, -1) + 1
    x, w = torch.randn(64, 32), torch.randn(32, 16)
    c = minicomp.compile(f, backend="cpu")
    program = _program_of(c, x, w)
    ex = program.primary()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.testing.assert_close(c(x, w), f(x, w))
    names = [e.name for e in prof.events()]
    assert [n for n in names if n.startswith("minicomp ")] == program.names and len(program.names) >= 2
    lines = ex.traced_source.splitlines(keepends=True)
    assert sum(re.fullmatch(r"    with record_function\(N\d+\):\n", ln) is not None for ln in lines) == len(program.names)
    untraced = "".join(ln[4:] if ln.startswith("        ") else ln for ln in lines
                       if not re.fullmatch(r"    with record_function\(N\d+\):\n", ln))
    assert untraced == ex.source


def _program_of(compiled, *inputs):
    """The Program behind a compiled callable's one graph (through the capture hook)."""
    from minicomp.compiler import capture
    from minicomp.runtime.program import Program
    seen = []
    orig = capture.compile_fx_graph

    def spy(*a, **k):
        boxed = orig(*a, **k)
        seen.append(boxed)
        return boxed
    capture.compile_fx_graph = spy
    try:
        out = compiled(*inputs)
    finally:
        capture.compile_fx_graph = orig
    torch.testing.assert_close(out, compiled.model(*inputs))
    (boxed,) = seen
    (program,) = [c.cell_contents for c in boxed.__closure__ if isinstance(c.cell_contents, Program)]
    return program


def test_an_output_a_torch_op_makes_as_a_view_of_a_kernel_result_is_never_overwritten():
    """as_strided runs in torch and returns a view of a kernel's buffer: that buffer is not an
    intermediate in the arena the next call overwrites (plan_memory gives it fresh memory, so nothing
    is copied out), and earlier results stay put."""
    def f(x):
        return torch.as_strided(torch.exp(x) + 1, (2, 2), (1, 4))
    c = minicomp.compile(f, backend="cpu")
    x1, x2 = torch.randn(4, 4), torch.randn(4, 4)
    program = _program_of(c, x1)
    assert program.may_alias == (0,) and program.arena_bytes == 0
    first = c(x1)
    second = c(x2)
    torch.testing.assert_close(first, f(x1))
    torch.testing.assert_close(second, f(x2))


def test_a_training_step_copies_no_tensor():
    """The backward gets the transposed weights AOTAutograd saved (views) as they are, for mm to
    take without a copy, and the activations the forward saves (views of kernel results) are never
    in the arena, so none is copied out. (The profiler sees inside compiled code; a dispatch mode
    would make Dynamo run the model eagerly.)"""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    eager = copy.deepcopy(model)
    c = minicomp.compile(model, backend="cpu")
    x, w = torch.randn(4, 6, 16, requires_grad=True), torch.randn(4, 6, 8)
    (c(x) * w).sum().backward()  # compiles forward and backward; a contiguous incoming gradient
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (c(x) * w).sum().backward()
    ops = [e.name for e in prof.events()]
    assert "CompiledFunctionBackward" in ops and not any("gelu" in op for op in ops if op.startswith("aten::")), \
        "compiled, not eager"
    assert any(op.startswith("minicomp backward_") for op in ops)  # our steps, by name
    copies = [op for op in ops if op in ("aten::clone", "aten::copy_", "aten::contiguous")]
    assert copies == [], ops
    (eager(x) * w).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_sized_program_keeps_instances_within_its_arena_budget():
    """A symbolic program lays out an instance per size; past the arena budget the least recently
    used go (a language model's many lengths must not each keep an arena)."""
    import minicomp
    from minicomp.runtime.sized import SizedProgram

    w = torch.randn(1024, 8)

    def f(x):
        return torch.cos(torch.sin(x) @ w)  # sin(x) lives in the arena: a kernel writes it, mm reads it
    c = minicomp.compile(f, backend="cpu")
    c(torch.randn(3, 1024))
    c(torch.randn(4, 1024))
    prog = c.report().runs[-1]
    assert isinstance(prog, SizedProgram)
    prog.ARENA_BUDGET = 3 * 1024 * 4 * 100  # about three instances' worth at ~100 rows
    assert prog.last.arena_bytes > 0
    for n in range(90, 110):
        x = torch.randn(n, 1024)
        torch.testing.assert_close(c(x), f(x), rtol=1e-4, atol=1e-4)
    held = sum(p.arena_bytes for p, _ in prog.instances.values())
    assert held <= prog.ARENA_BUDGET or len(prog.instances) == 1
    assert len(prog.instances) < 20 and prog.built == 21
