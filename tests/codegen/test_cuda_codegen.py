"""The CUDA C generator: which layout each kernel gets, its signature, index width and launch sizes.

CASES are the representative graphs the CUDA tests share: NVRTC compiles all their kernels
(test_nvrtc.py) and cuda_emu runs them against eager (tests/runtime/test_cuda_emu.py). Each is
traced straight to core ATen with make_fx (no Dynamo: a few ms a graph) and fused as the
cuda_emu backend would.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.func import functionalize

from minicomp.codegen.cuda import generate
from minicomp.backends.cuda import prelude_headers
from minicomp.compiler.capture import make_context
from minicomp.compiler.frontend import lower
from minicomp.compiler.pipeline import run_passes
from minicomp.codegen.cuda_ops import SUPPORTED_OPS
from minicomp.ir import OPS, TensorType, parse
from minicomp.options import Options

_DECOMP = dict(core_aten_decompositions())
DTYPES_ALL = ("f32", "f16", "bf16", "f64", "i64", "i32", "i16", "i8", "u8", "b8")


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _ties(*shape):
    return (torch.randn(*shape) * 2).round()  # repeated values: argmax must pick the first


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _gather_cat(x, i, j):  # (12, 10): gathers, a cat of views, a reshape that does not collapse
    parts = torch.cat([x.t()[1:], x.t()[:1] * 2], 0)
    return x.gather(1, i), x.index_select(0, j), parts.reshape(5, 24)[:, 3:], x.expand(2, 12, 10).permute(2, 0, 1)


# name -> (fn, () -> inputs)
CASES = {
    "pointwise_chain": (lambda x, b: torch.tanh(x * 2 + b).sigmoid() - x.abs().sqrt(),
                        lambda: (_x(64, 1000), _x(1000))),
    "pointwise_tail": (lambda x: F.gelu(x) * x.exp(), lambda: (_x(1003),)),
    "broadcast_odd": (lambda x, y: x * y + 1, lambda: (_x(7, 1, 13), _x(5, 13))),
    "softmax_short": (lambda x: F.softmax(x, -1), lambda: (_x(50, 7),)),
    "softmax_warp": (lambda x: F.softmax(x, -1), lambda: (_x(33, 100),)),
    "softmax_block": (lambda x: F.softmax(x, -1), lambda: (_x(3, 3000),)),
    "log_softmax_middle": (lambda x: F.log_softmax(x, 1), lambda: (_x(4, 200, 3),)),
    "layer_norm": (_layer_norm, lambda: (_x(5, 7, 96), _x(96), _x(96))),
    "layer_norm_long": (_layer_norm, lambda: (_x(2, 2500), _x(2500), _x(2500))),
    "rms_norm": (lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), lambda: (_x(9, 130), _x(130))),
    "reductions": (lambda x: (x.sum(0), x.sum(1), x.sum(2), x.sum((0, 2)), x.sum(), x.amax(1), x.amin(0),
                              x.prod(2), x.mean((1, 2))), lambda: (_x(6, 7, 40),)),
    "arg_reductions": (lambda x: (x.argmax(0), x.argmax(1), x.argmin(2), x.max(-1).values, x.argmax()),
                       lambda: (_ties(6, 7, 40),)),
    "column_sum": (lambda x: (x * 2).sum(0), lambda: (_x(64, 2048),)),  # x.sum(0) alone runs in torch
    "gather_cat_views": (_gather_cat, lambda: (_x(12, 10), torch.randint(0, 10, (12, 4)), torch.tensor([3, 9, 0, 11]))),
    "f16_softmax": (lambda x: F.softmax(x, -1), lambda: (_x(16, 300, dtype=torch.float16),)),
    "bf16_layer_norm": (_layer_norm, lambda: (_x(8, 64, dtype=torch.bfloat16), _x(64, dtype=torch.bfloat16),
                                              _x(64, dtype=torch.bfloat16))),
    "int_ops": (lambda a, b: (a * b + 3, a // b, a % b, (a > b).sum(1), a.amax(0), a.to(torch.int64).sum()),
                lambda: (torch.randint(-50, 50, (33, 17), dtype=torch.int32),
                         torch.randint(1, 9, (33, 17), dtype=torch.int32))),
    "bool_ops": (lambda m, x: (m & (x > 0), m.any(1), m.all(0), torch.where(m, x, -x)),
                 lambda: (torch.rand(21, 30) > 0.5, _x(21, 30))),
    "iota_mask": (lambda x: torch.where(torch.arange(9) <= torch.arange(9)[:, None], x, 0.0).cumsum(0),
                  lambda: (_x(9, 9),)),
}


def flat(fn):
    """fn returning a list of its output tensors (graphs return a flat tuple, as AOTAutograd's do)."""
    return lambda *xs: list(pytree.tree_leaves(fn(*xs)))


def op_table_graph(dtype: str, shape=(37, 19)) -> str:
    """IR text applying every pointwise op the CUDA generator has to %x (and %y; where picks by %c)."""
    lines, outs = [], []
    for op in sorted(o for o in SUPPORTED_OPS if OPS[o].category == "pointwise" and o != "cast"):
        d = OPS[op]
        args = ["%c", "%x", "%y"] if op == "where" else ["%x", "%y"][:d.arity]
        types = tuple(TensorType(shape, "b8" if a == "%c" else dtype) for a in args)
        attrs = {"approximate": "tanh" if dtype == "f32" else "none"} if op == "gelu" else {}
        try:
            t = d.infer(types, attrs)
        except TypeError:  # not defined for this dtype
            continue
        attr_text = f' [approximate="{attrs["approximate"]}"]' if attrs else ""
        lines.append(f"  %{len(outs)}: {t} = {op} {' '.join(args)}{attr_text}")
        outs.append((f"%{len(outs)}", str(t), op))
    s = ",".join(map(str, shape))
    head = f"graph ops_{dtype}(%x: {dtype}[{s}], %y: {dtype}[{s}], %c: b8[{s}]) -> ({', '.join(t for _, t, _ in outs)})"
    return head + " {\n" + "\n".join(lines) + f"\n  return {', '.join(n for n, _, _ in outs)}\n}}\n"


def cast_graph(dtypes=DTYPES_ALL) -> str:
    """IR text casting %x of each dtype to every other dtype."""
    ins = ", ".join(f"%{d}: {d}[300]" for d in dtypes)
    lines = [f"  %c{i}: {b}[300] = cast %{a} [dtype={b}]" for i, (a, b) in enumerate(
        (a, b) for a in dtypes for b in dtypes if a != b)]
    outs = [ln.split(":")[0].strip() for ln in lines]
    types = ", ".join(ln.split(": ")[1].split(" =")[0] for ln in lines)
    return f"graph casts({ins}) -> ({types}) {{\n" + "\n".join(lines) + f"\n  return {', '.join(outs)}\n}}\n"


def reduction_graph(dtype: str) -> str:
    """IR text: every reduction op that takes `dtype`, along both axes of a (3, 1500) and a (40, 50)
    input: rows for a block, for a warp, and columns for a thread each."""
    lines = []
    arg_ops = ("argmax", "argmin") if dtype != "b8" else ()  # torch has no argmax of bools
    for op in ("sum", "prod", "amax", "amin") + arg_ops:
        for x, shape in (("%x", (3, 1500)), ("%y", (40, 50))):
            for dim in (0, 1):
                attrs = {"dim": dim, "keepdim": False} if op.startswith("arg") else {"dims": (dim,), "keepdim": False}
                try:
                    t = OPS[op].infer((TensorType(shape, dtype),), attrs)
                except TypeError:
                    continue
                text = ", ".join(f"{k}={'false' if v is False else v}" for k, v in attrs.items())
                lines.append(f"  %{len(lines)}: {t} = {op} {x} [{text}]")
    types = ", ".join(ln.split(": ")[1].split(" =")[0] for ln in lines)
    return (f"graph reduce_{dtype}(%x: {dtype}[3,1500], %y: {dtype}[40,50]) -> ({types}) {{\n" + "\n".join(lines)
            + f"\n  return {', '.join(f'%{i}' for i in range(len(lines)))}\n}}\n")


def trace(fn, inputs):
    """A functional core-ATen fx graph of fn, as AOTAutograd would give it (decompositions may emit
    in-place ops like `add_`: such a graph is traced once more through functionalization)."""
    gm = make_fx(flat(fn), decomposition_table=_DECOMP, tracing_mode="fake")(*inputs)
    if any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in gm.graph.nodes):
        gm = make_fx(functionalize(gm), tracing_mode="fake")(*inputs)
    return gm


def fuse(graph):
    """Run the pass pipeline as the cuda_emu backend does; returns the fused graph."""
    opts = Options(backend="cuda_emu", verify=True)
    return run_passes(graph, make_context(opts, graph.name, "cuda_emu"))


def case_kernels(name):
    fn, make = CASES[name]
    torch.manual_seed(0)
    graph, _ = lower(trace(fn, make()), name)
    return [n.meta["kernel"] for n in fuse(graph).nodes if n.op == "kernel"]


def text_kernels(text):
    return [n.meta["kernel"] for n in fuse(parse(text)).nodes if n.op == "kernel"]


def strategies(name, **kw):
    return [launch.strategy for launch in generate(case_kernels(name), **kw)[1]]


@pytest.mark.parametrize("name, want", [
    ("softmax_short", "thread"), ("softmax_warp", "warp"), ("softmax_block", "block"), ("column_sum", "thread"),
    ("layer_norm", "warp"), ("layer_norm_long", "block"), ("rms_norm", "warp")])
def test_row_kernel_layout(name, want):
    assert strategies(name) == [want]


def test_warp_row_limit_is_a_knob():
    assert strategies("softmax_warp", warp_row_max=64) == ["block"]


def test_pointwise_vector_width_follows_the_widest_contiguous_buffer():
    assert strategies("pointwise_chain") == ["pointwise-vec4"]  # f32: float4
    f16 = text_kernels("graph f(%x: f16[40,64]) -> (f16[40,64]) {\n  %0: f16[40,64] = exp %x\n  return %0\n}\n")
    assert [launch.strategy for launch in generate(f16)[1]] == ["pointwise-vec8"]  # 8 halves = 16 bytes
    # a 13-wide broadcast row cannot be split into aligned groups of 4
    assert strategies("broadcast_odd") == ["pointwise"]


def test_vector_path_checks_alignment_and_keeps_a_scalar_tail():
    src, _ = generate(case_kernels("pointwise_tail"))
    assert "% 16 == 0" in src and "mc_vec<float, 4>" in src
    assert "for (int g = done + start; g < n; g += stride)" in src  # tail and misaligned fallback


def test_signature_and_comment():
    src, launches = generate(case_kernels("layer_norm"))
    k = re.search(r'extern "C" __global__ void __launch_bounds__\(256\) (k\d+)\(([^)]*)\)', src)
    params = k.group(2).split(", ")
    assert params[0].startswith("const float* __restrict__ b0")
    assert all(re.fullmatch(r"(const )?\w[\w ]*\* __restrict__ b\d+", p) for p in params)
    assert any(not p.startswith("const") for p in params)  # the outputs
    head = src[:src.index('extern "C"')]
    assert "row kernel over 35 x [96], a warp per row" in head
    assert "fused: " in head and "b0 = " in head and "f32[5,7,96] (read)" in head
    assert launches[0].name == k.group(1) and launches[0].shared_bytes == 0


def test_block_rows_use_shuffles_and_shared_memory():
    src, _ = generate(case_kernels("layer_norm_long"))
    assert "mc_block_reduce(" in src and "__shared__ float" in src
    prelude = prelude_headers()["prelude.cuh"]
    assert "__shfl_xor_sync" in prelude and "__syncthreads" in prelude


def test_index_width():
    small, _ = generate(case_kernels("pointwise_tail"))
    assert "const int n = 1003;" in small and "for (int q = start;" in small  # 32-bit index math
    huge = text_kernels("graph f(%x: f32[3,1073741824]) -> (f32[3,1073741824]) {\n"
                        "  %0: f32[3,1073741824] = neg %x\n  return %0\n}\n")
    src, _ = generate(huge)
    assert "const long long n = 3221225472LL;" in src


def test_launch_sizes():
    big = text_kernels("graph f(%x: f32[4096,1024]) -> (f32[4096,1024]) {\n  %0: f32[4096,1024] = neg %x\n"
                       "  return %0\n}\n")
    # 2^20 float4 groups: one wave of 2048 threads an SM, grid-stride for the rest
    assert [(la.grid, la.block) for la in generate(big, sm_count=132)[1]] == [(132 * 8, 256)]
    assert [(la.grid, la.block) for la in generate(big, sm_count=2)[1]] == [(16, 256)]
    _, cols = generate(case_kernels("column_sum"), sm_count=132)
    assert cols[0].grid == 8  # 2048 rows, a thread each
    _, rows = generate(case_kernels("softmax_warp"), sm_count=132)
    assert rows[0].block == 256 and rows[0].grid == 5  # 33 rows, 8 warps a block
    _, capped = generate(case_kernels("softmax_block"), max_grid=2, max_block=100)
    assert (capped[0].grid, capped[0].block) == (2, 96)  # blocks stay whole warps
    _, wide = generate(case_kernels("layer_norm_long"))
    assert wide[0].grid == 2 and wide[0].block == 256


def test_sm_count_follows_the_environment(monkeypatch):
    from minicomp.backends.cuda import DEFAULT_SM_COUNT, sm_count
    monkeypatch.delenv("MINICOMP_SM_COUNT", raising=False)
    if not torch.cuda.is_available():
        assert sm_count() == DEFAULT_SM_COUNT
    monkeypatch.setenv("MINICOMP_SM_COUNT", "2")
    assert sm_count() == 2


def test_source_is_deterministic():
    a, _ = generate(case_kernels("reductions"))
    b, _ = generate(case_kernels("reductions"))
    assert a == b


def _declared_bounds(src):
    return dict((name, int(n)) for n, name in re.findall(r"__global__ void __launch_bounds__\((\d+)\) (\w+)\(", src))


@pytest.mark.parametrize("length, block", [(100, 256), (3000, 256), (10000, 512), (20000, 1024)])
def test_every_kernel_declares_its_block_as_launch_bounds(length, block):
    """ptxas must know a kernel's block size, or a 1024-thread block of a kernel it gave more than
    64 registers a thread fails to launch (LAUNCH_OUT_OF_RESOURCES)."""
    text = (f"graph f(%x: f32[3,{length}]) -> (f32[3,{length}], f32[3,{length}]) {{\n"
            f"  %0: f32[3,1] = amax %x [dims=(1,), keepdim=true]\n  %1: f32[3,{length}] = sub %x %0\n"
            f"  %2: f32[3,{length}] = exp %1\n  %3: f32[3,{length}] = neg %x\n  return %2, %3\n}}\n")
    src, launches = generate(text_kernels(text))
    bounds = _declared_bounds(src)
    assert len(bounds) == len(launches) == src.count("__global__")
    assert all(bounds[la.name] == la.block == la.bound for la in launches)
    assert max(la.block for la in launches) == block


def test_launch_caps_leave_the_source_alone():
    """cuda_emu caps blocks (and grids) but runs the very source the cuda backend compiles: the
    bounds stay the planned block, and a capped launch stays within them."""
    kernels = case_kernels("layer_norm_long") + case_kernels("softmax_warp")
    src, planned = generate(kernels)
    capped_src, capped = generate(kernels, max_grid=2, max_block=128)
    assert capped_src == src
    assert [la.bound for la in capped] == [la.block for la in planned]
    assert all(la.block <= min(128, la.bound) for la in capped)


def test_block_knob_sets_every_launch_and_bound():
    src, launches = generate(case_kernels("reductions"), block=1024)
    assert {la.block for la in launches} == {1024} and set(_declared_bounds(src).values()) == {1024}
    with pytest.raises(ValueError, match="whole warps"):
        generate(case_kernels("reductions"), block=2048)


REDUCE_NO_LOOP = """graph f(%x: f32[], %y: f32[4,1], %i: i64[5,1]) -> (f32[], f32[], i64[4], f32[4,1], f32[4], i64[5]) {
  %0: f32[] = sum %x [dims=(), keepdim=false]
  %1: f32[] = amax %x [dims=(), keepdim=false]
  %2: i64[4] = argmax %y [dim=1, keepdim=false]
  %3: f32[4,1] = amax %y [dims=(1,), keepdim=true]
  %4: f32[4] = sum %y [dims=(1,), keepdim=false]
  %5: i64[5] = amin %i [dims=(1,), keepdim=false]
  return %0, %1, %2, %3, %4, %5
}
"""


def test_reductions_with_no_loop_are_row_kernels():
    """A reduction of a 0-d tensor or over size-1 dims has no inner loop variable (size-1 dims get
    none) but still has its reduction stage; it was taken for a pointwise kernel and its
    accumulator looked up before any stage made it (KeyError)."""
    kernels = text_kernels(REDUCE_NO_LOOP)
    assert any(k.stages and not k.inner for k in kernels)
    src, launches = generate(kernels)
    assert all(la.strategy == "thread" for la in launches if any(k.stages for k in kernels if k.name == la.name))
    assert "len = 1;" in src


EMPTY = """graph f(%x: f32[0,3], %y: f32[3,0]) -> (f32[0,3], f32[0], f32[3], f32[3,0]) {
  %0: f32[0,3] = exp %x
  %1: f32[0] = sum %x [dims=(1,), keepdim=false]
  %2: f32[3] = sum %y [dims=(1,), keepdim=false]
  %3: f32[3,0] = neg %y
  return %0, %1, %2, %3
}
"""


def test_empty_loops_generate_without_dividing_by_zero():
    """Unravelling a flat index over a loop of size 0 divided by 0 in the generator (ZeroDivisionError
    for every empty tensor); such a loop never runs, its variables are 0."""
    src, _ = generate(text_kernels(EMPTY))
    assert "/ 0" not in src and "% 0" not in src
    assert "empty loop: never reached" in src
