"""Fusion, rematerialization and memory planning: IR text in, fused IR text out, and the fused
graph (run through the kernel interpreter) agrees with the original graph under `interpret`."""
import gc

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.backends.cpu import kernel_ops as cpu_kernel_ops
from minicomp.compiler.capture import make_context
from minicomp.compiler.passes.fuse import conservative_schedule
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import interpret, parse
from minicomp.options import Options
from tests.passes.check import random_inputs


def compile_text(text, remat=True):
    opts = Options(backend="cpu", remat=remat, verify=True)
    ctx = make_context(opts, "t", "cpu")
    return run_passes(parse(text), ctx), ctx


def agree(text, fused):
    g = parse(text)
    ins = random_inputs(g)
    for want, got in zip(interpret(g, *ins), interpret(fused, *ins)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def kernels(graph):
    return [n for n in graph.nodes if n.op == "kernel"]


SOFTMAX = """graph softmax(%x: f32[8,16]) -> (f32[8,16]) {
  %0: f32[8,1] = amax %x [dims=(1,), keepdim=true]
  %1: f32[8,16] = sub %x %0
  %2: f32[8,16] = exp %1
  %3: f32[8,1] = sum %2 [dims=(1,), keepdim=true]
  %4: f32[8,16] = div %2 %3
  return %4
}
"""


def test_softmax_is_one_row_kernel_text():
    fused, _ = compile_text(SOFTMAX)
    assert str(fused) == """graph softmax(%x: f32[8,16]) -> (f32[8,16]) {
  %0: (f32[8,16]) = kernel %x [bytes=1024, domain="8 x [16]", fused="amax sub exp sum div", kind="row", name="k0"] {
    domain (i0: 8) x [i1: 16]
    flops 2816
    b0: f32[128] = %x [name="x"]
    b1: f32[128] = out 0 [name="div"]
    stage 0:
      t0: f32 = load b0[16*i0 + i1]
      r0: f32 = amax t0
    stage 1:
      t1: f32 = acc r0
      t2: f32 = sub t0 t1
      t3: f32 = exp t2
      r1: f32 = sum t3
    inner stores:
      t4: f32 = acc r1
      t5: f32 = div t3 t4
      b1[16*i0 + i1] = t5
  }
  %1: f32[8,16] = getitem %0 [index=0]
  return %1
}
"""
    agree(SOFTMAX, fused)


COS_COS = """graph f(%x: f32[4,5]) -> (f32[4,5]) {
  %0: f32[4,5] = cos %x
  %1: f32[4,5] = cos %0
  return %1
}
"""


def test_cos_cos_is_one_pointwise_kernel_text():
    fused, _ = compile_text(COS_COS)
    assert str(fused) == """graph f(%x: f32[4,5]) -> (f32[4,5]) {
  %0: (f32[4,5]) = kernel %x [bytes=160, domain="4x5", fused="cos cos", kind="pointwise", name="k0"] {
    domain (i0: 4, i1: 5)
    flops 320
    b0: f32[20] = %x [name="x"]
    b1: f32[20] = out 0 [name="cos"]
    outer stores:
      t0: f32 = load b0[5*i0 + i1]
      t1: f32 = cos t0
      t2: f32 = cos t1
      b1[5*i0 + i1] = t2
  }
  %1: f32[4,5] = getitem %0 [index=0]
  return %1
}
"""
    agree(COS_COS, fused)


VIEWS = """graph f(%x: f32[6,8], %y: f32[4]) -> (f32[8,4]) {
  %0: f32[8,6] = permute %x [dims=(1, 0)]
  %1: f32[8,4] = slice %0 [dim=1, end=5, start=1, step=1]
  %2: f32[8,4] = expand %y [shape=(8, 4)]
  %3: f32[8,4] = mul %1 %2
  return %3
}
"""


def test_views_become_index_math_not_copies():
    fused, _ = compile_text(VIEWS)
    ks = kernels(fused)
    assert len(ks) == 1
    k = ks[0].meta["kernel"]
    assert [b.name for b in k.buffers][:2] == ["x", "y"]  # reads the inputs themselves, no copied views
    agree(VIEWS, fused)


RESHAPES = """graph f(%x: f32[4,6]) -> (f32[3,8]) {
  %0: f32[2,2,6] = reshape %x [shape=(2, 2, 6)]
  %1: f32[2,6,2] = permute %0 [dims=(0, 2, 1)]
  %2: f32[3,8] = reshape %1 [shape=(3, 8)]
  %3: f32[3,8] = exp %2
  return %3
}
"""


def test_reshape_permute_reshape_index_math():
    fused, _ = compile_text(RESHAPES)
    assert len(kernels(fused)) == 1
    agree(RESHAPES, fused)


SHARED = """graph f(%x: f32[64,32]) -> (f32[64], f32[32]) {
  %0: f32[64,32] = mul %x %x
  %1: f32[64] = sum %0 [dims=(1,), keepdim=false]
  %2: f32[32] = sum %0 [dims=(0,), keepdim=false]
  return %1, %2
}
"""


def test_rematerialize_recomputes_cheap_shared_value():
    fused, ctx = compile_text(SHARED)
    assert len(kernels(fused)) == 2
    written = [b.name for n in kernels(fused) for i, b in enumerate(n.meta["kernel"].buffers)
               if i in n.meta["kernel"].writes]
    assert "mul" not in written  # x*x is recomputed by both reductions, never stored
    assert ctx.remat_bytes_saved > 0
    agree(SHARED, fused)


def test_without_remat_the_shared_value_is_stored_once():
    fused, ctx = compile_text(SHARED, remat=False)
    assert len(kernels(fused)) == 2  # x*x is stored by the first row kernel, read by the second
    written = [b.name for n in kernels(fused) for i, b in enumerate(n.meta["kernel"].buffers)
               if i in n.meta["kernel"].writes]
    assert "mul" in written
    assert ctx.remat_bytes_saved == 0
    assert ctx.arena_bytes >= 64 * 32 * 4
    agree(SHARED, fused)


CHAIN = """graph f(%x: f32[16,16]) -> (f32[16]) {
  %0: f32[16] = sum %x [dims=(1,), keepdim=false]
  %1: f32[16,16] = permute %x [dims=(1, 0)]
  %2: f32[16,16] = add %1 %0
  %3: f32[16] = amax %2 [dims=(0,), keepdim=false]
  %4: f32[16,16] = mul %2 %3
  %5: f32[16] = sum %4 [dims=(1,), keepdim=false]
  return %5
}
"""


def test_reduction_used_at_another_rows_index_is_stored_and_planned():
    fused, ctx = compile_text(CHAIN)
    assert len(kernels(fused)) >= 2
    offsets = [n.meta["arena_offset"] for n in fused.nodes if "arena_offset" in n.meta]
    assert offsets and ctx.arena_bytes > 0
    agree(CHAIN, fused)


CAT = """graph f(%x: f32[4,3], %y: f32[4,5]) -> (f32[4,8]) {
  %0: f32[4,8] = cat %x %y [dim=1]
  %1: f32[4,8] = neg %0
  return %1
}
"""


def test_cat_is_a_guarded_select_inside_one_kernel():
    fused, _ = compile_text(CAT)
    assert len(kernels(fused)) == 1
    agree(CAT, fused)


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_cat_part_that_cannot_fuse_leaves_no_guard_behind(backend):
    """A cat part that reads a reduction of another kernel fails to fuse, and the kernel is built
    again around the stored sum: the part's guard (its columns of the cat) must not stay on the
    loads built next. It stayed, and column 0 of t3 * 3 read as 0 (the backward of x.repeat(1, 3)
    and a broadcast x[:, 1:].sum() too)."""
    def f(t1, t2, t3):
        return t3 * 3 + torch.cat([torch.zeros(4, 1), t2.sum().expand(4, 4)], 1) + t1.view(4, 3, 5).sum(1)
    xs = (torch.randn(4, 15), torch.randn(4, 5), torch.arange(20.).view(4, 5))
    torch.testing.assert_close(minicomp.compile(f, backend=backend)(*xs), f(*xs))

    def g(x):
        return x.repeat(1, 3), x[:, 1:].sum() * torch.ones(4, 5), x * 3
    x = torch.randn(4, 5, requires_grad=True)
    grads = [torch.randn(4, 15), torch.randn(4, 5), torch.randn(4, 5)]
    want, = torch.autograd.grad(g(x), x, grads)
    got, = torch.autograd.grad(minicomp.compile(g, backend=backend)(x), x, grads)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_contiguous_view_of_a_value_is_returned_as_a_view_not_copied(backend):
    """An output that is a reshape of a matmul's result (a bias gradient's view of a sum) is that
    view of the value's buffer: no kernel copies it into a buffer of its own. (Only where no other
    output is that value: see the sharing test below.)"""
    def f(x, w):
        y = x @ w
        return y.reshape(-1), torch.sigmoid(y)
    x, w = torch.randn(6, 8), torch.randn(8, 4)
    c = minicomp.compile(f, backend=backend)
    got, want = c(x, w), f(x, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert [k.ops for k in c.report().kernels] == [["sigmoid"]]
    again = c(x, w)  # fresh outputs each call: the caller's first results stay as they were
    assert again[0].data_ptr() != got[0].data_ptr() and torch.equal(got[0], want[0])


def _kernel_count(fn, *xs):
    c = minicomp.compile(fn, backend="cpu")
    with torch.no_grad():
        out = c(*xs)
        ref = fn(*xs)
    for a, b in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    return len(c.report().kernels), c


@pytest.mark.parametrize("case", ["cos_cos", "softmax", "layer_norm_gelu", "rms_norm_residual", "views"])
def test_one_kernel_each(case):
    x = torch.randn(32, 64)
    w, b = torch.randn(64), torch.randn(64)
    fns = {
        "cos_cos": (lambda x: torch.cos(torch.cos(x)), (x,)),
        "softmax": (lambda x: torch.softmax(x, -1), (x,)),
        "layer_norm_gelu": (lambda x, w, b: F.gelu(F.layer_norm(x, (64,), w, b)), (x, w, b)),
        "rms_norm_residual": (lambda x, r, w: (lambda h: (h, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True)
                                                                             + 1e-6) * w))(x + r),
                              (x, torch.randn(32, 64), w)),
        "views": (lambda x, y: x.t()[:, 1:5] + y.expand(64, 4) * 2, (x, torch.randn(4))),
    }
    fn, args = fns[case]
    n, _ = _kernel_count(fn, *args)
    assert n == 1


LINEAR_GELU = """graph f(%x: f32[8,16], %b: f32[16]) -> (f32[8,16], f32[2,4,16]) {
  %0: f32[8,16] = add %x %b
  %1: f32[2,4,16] = reshape %0 [shape=(2, 4, 16)]
  %2: f32[2,4,16] = gelu %1 [approximate="none"]
  return %0, %2
}
"""


def test_a_value_and_a_reshape_of_it_share_one_loop_nest():
    """A Linear's [B*T, C] result (stored: the backward needs it) and the GELU of its [B, T, C] view:
    one kernel over one domain, the reshape being index math on the outer loops only."""
    fused, _ = compile_text(LINEAR_GELU)
    ks = kernels(fused)
    assert len(ks) == 1 and ks[0].meta["kernel"].ops == ["add", "gelu"]
    agree(LINEAR_GELU, fused)


@pytest.mark.parametrize("a, b, ok", [
    ((256, 512), (4, 64, 512), True), ((8, 4, 16), (32, 16), True), ((64, 16, 256), (8, 128, 256), True),
    ((8, 64, 128), (8, 128, 64), False),  # a transpose in disguise: the innermost dim differs
    ((4, 6), (6, 4), False), ((0, 4), (0, 4, 1), False), ((12,), (3, 4), False)])
def test_prefix_reshape(a, b, ok):
    from minicomp.compiler.kernelize import prefix_reshape
    assert prefix_reshape(a, b) is ok and prefix_reshape(b, a) is ok


def _unread_kernel_results(graph):
    read = {a for n in graph.nodes for a in n.args} | {o for o in graph.outputs if o is not None}
    return [f"{n.args[0].attrs['name']}[{n.attrs['index']}]" for n in graph.nodes
            if n.op == "getitem" and n.args[0].op == "kernel" and n not in read]


@pytest.mark.parametrize("name", ["norm_stack", "gpt_block", "mixer"])
def test_no_kernel_writes_a_value_nobody_reads(name, monkeypatch):
    """Values stored so other kernels could read them, whose readers all end up in the kernel that
    computes them (the fixed point merged them), are not written: two LayerNorms with a GELU between
    them once wrote their means, variances and centred values (4x the bytes)."""
    from minicomp.compiler import capture, pipeline
    from minicomp.models import Block, MixerBlock, NormStack
    model, x = {"norm_stack": (NormStack(64, 3), torch.randn(4, 32, 64)),
                "gpt_block": (Block(64, 4, 32), torch.randn(2, 32, 64)),
                "mixer": (MixerBlock(32, 64), torch.randn(2, 32, 64))}[name]
    seen = []

    def spy(graph, ctx):
        seen.append(graph)
        return graph
    monkeypatch.setattr(pipeline, "KERNEL_PASSES", pipeline.KERNEL_PASSES + [("spy", spy)])
    monkeypatch.setattr(capture, "_built", type(capture._built)())  # no memo of an earlier build
    compiled = minicomp.compile(model.eval(), backend="cpu")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert seen and all(not _unread_kernel_results(g) for g in seen), [_unread_kernel_results(g) for g in seen]


def test_freed_neighbours_hold_a_value_twice_their_size():
    """Two 256-byte blocks freed side by side take a 512-byte value: the arena is the peak of what
    is live at once (768 B here), not the sum of every shape seen."""
    from types import SimpleNamespace

    from minicomp.compiler.passes import plan_memory
    from minicomp.ir import Graph, Node
    from minicomp.ir.types import TensorType
    x = Node("input", (), {}, TensorType((64,), "f32"), "x")

    def kern(name, args, *shapes):
        k = Node("kernel", tuple(args), {"name": name}, tuple(TensorType(s, "f32") for s in shapes))
        return [k] + [Node("getitem", (k,), {"index": i}, TensorType(s, "f32")) for i, s in enumerate(shapes)]
    k0 = kern("k0", [x], (64,), (64,))          # a, b: 256 B each
    k1 = kern("k1", k0[1:], (64,))              # c reads a, b: 256 B at 512
    k2 = kern("k2", [k1[1]], (128,))            # d, 512 B: a and b are free, adjacent
    k3 = kern("k3", [k2[1]], (64,))             # the output
    g = Graph("plan", [x], k0 + k1 + k2 + k3, [k3[1]], {})
    ctx = SimpleNamespace(kernel_ops=set())
    plan_memory.run(g, ctx)
    assert k2[1].meta["arena_offset"] == 0 and ctx.arena_bytes == 768


def test_row_kernel_flops_count_per_row_work_once_per_row():
    """rms_norm: x*x, the sum's add, x*r and *w per element; mean's div, +eps and rsqrt once per row
    (loop-invariant), not per element (which put explain() at 165% of the compute roof)."""
    import torch.nn.functional as F
    import minicomp
    rows, cols = 64, 256
    x, w = torch.randn(rows, cols), torch.randn(cols)
    c = minicomp.compile(lambda x, w: F.rms_norm(x, (cols,), w), backend="cpu")
    torch.testing.assert_close(c(x, w), F.rms_norm(x, (cols,), w))
    (k,) = c.report().kernels
    assert rows * 4 * cols < k.flops <= rows * (4 * cols + 8), k.flops  # was 8 per element


REFUSED = """graph refused(%x: f32[8,16]) -> (f32[8,16]) {
  %0: f32[8,1] = sum %x [dims=(1,), keepdim=true]
  %1: f32[1,8] = permute %0 [dims=(1,0)]
  %2: f32[8,8] = add %0 %1
  %3: f32[8,8] = exp %2
  %4: f32[8] = sum %3 [dims=(1,)]
  %5: f32[8,1] = reshape %4 [shape=(8,1)]
  %6: f32[8,16] = mul %x %5
  return %6
}"""


def test_a_dropped_schedule_is_freed_without_the_cycle_collector():
    """A refused fusion's exception kept with its traceback, or a kernel builder keeping its
    scheduler, made every schedule cyclic garbage (10-30 thousand objects per graph of HF BERT's
    training), which a collection then walked on the compile's critical path. (Other garbage may
    turn up meanwhile -- what earlier tests left to finalizers and torch's weak caches -- so only
    the compiler's and the IR's objects are counted.)"""
    g = parse(REFUSED)
    gc.collect()
    gc.collect()  # what the first one's finalizers released (earlier tests' programs)
    gc.disable()
    try:
        sch, _ = conservative_schedule(g, cpu_kernel_ops())
        assert sch.refusals and len(sch.materialized) >= 2  # refusals raised and values were stored
        del sch
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = [o for o in gc.garbage if type(o).__module__.startswith(("minicomp.compiler", "minicomp.ir"))
                or type(o).__name__ == "frame" and "minicomp" in o.f_code.co_filename]
        assert not ours, ours[:5]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
