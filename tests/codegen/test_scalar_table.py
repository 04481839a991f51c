"""Every entry of every backend's per-op table against the scalar op table's torch reference, for
every dtype the row takes: `cpu` (codegen/llvm_ops.py), `cuda_emu` (codegen/cuda_ops.py, the CUDA C
compiled for the CPU) and `interpret` (fused kernels run by ir/kernel_interpret.py through the rows'
own references).

Each program is one IR graph holding many ops (one per dtype for the pointwise rows, one for every
cast, one for the reductions and the kernel-level ops), compiled through the passes and the backend
as a user's program would be: cuda_emu compiles a few programs with g++, not one per op. Integers,
casts, comparisons and the correctly rounded float ops must match bit for bit (NaN where eager has
NaN, and -0.0 where it has -0.0); transcendentals within TOLS. Inputs carry NaN, +-Inf, +-0.0,
halves, subnormals, huge values and integers at their limits (so arithmetic overflows and wraps).
"""
from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import pytest
import torch

from minicomp.codegen import cuda_ops, llvm_ops
from minicomp.backends import build
from minicomp.compiler.capture import make_context
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import DTYPES, OPS, Graph, Node, TensorType, dtype_name, interpret
from minicomp.ir.scalar import COMPOSITES, SCALAR, takes
from minicomp.ir.types import FLOATS, INTS
from minicomp.options import Options
from tests.helpers import gelu_at_inf

ALL = FLOATS + INTS + ("b8",)
BACKENDS = {"cpu": llvm_ops.SUPPORTED_OPS, "cuda_emu": cuda_ops.SUPPORTED_OPS, "interpret": llvm_ops.SUPPORTED_OPS}
N = 263  # odd: vector loops and their scalar tails both run
# float ops torch rounds once (or not at all): the backends must give its very bits
EXACT = {"add", "sub", "mul", "div", "neg", "abs", "floor", "ceil", "round", "trunc", "frac", "maximum", "minimum",
         "sign", "relu", "where", "fmod", "remainder", "div_trunc", "div_floor", "copy", "reciprocal", "cast"}
TOLS = {"f64": 1e-7, "f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
NEEDS_GXX = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                               reason="cuda_emu needs a host C++20 compiler (g++)")
params = [pytest.param(b, marks=NEEDS_GXX) if b == "cuda_emu" else b for b in BACKENDS]


# ---- programs ------------------------------------------------------------------------------------------

def program(backend: str, specs, inputs):
    """Compile one graph of `specs` ((label, op, input positions, attrs)) over `inputs` for `backend`;
    returns its results by label."""
    types = [TensorType.of(x) for x in inputs]
    ins = [Node("input", (), type=t, name=f"x{i}") for i, t in enumerate(types)]
    nodes = [Node(op, [ins[i] for i in idx], attrs, OPS[op].infer(tuple(types[i] for i in idx), attrs))
             for _, op, idx, attrs in specs]
    graph = Graph("table", ins, nodes, nodes)
    fuser = "cpu" if backend == "interpret" else backend  # interpret runs the kernels the cpu backend makes
    ctx = make_context(Options.make(fuser), "table", fuser)
    fused = run_passes(graph, ctx)
    assert any(n.op == "kernel" for n in fused.nodes)
    if backend == "interpret":  # the fused graph's kernels, run by the kernel interpreter
        got = interpret(fused, *[x.clone() for x in inputs])
    else:
        run, _ = build(fused, ctx, backend)
        got = run(*[x.clone() for x in inputs])
    return dict(zip([s[0] for s in specs], got, strict=True))


def reference(specs, inputs) -> dict:
    """Each spec's result by its row's torch reference (a composite: its tensor op's)."""
    env = SimpleNamespace(device="cpu", ndim=1)
    out = {}
    for label, op, idx, attrs in specs:
        xs = [inputs[i] for i in idx]
        if op in SCALAR and SCALAR[op].kind == "pointwise":
            want = SCALAR[op].ref(xs, attrs, env, OPS[op].infer(tuple(TensorType.of(x) for x in xs), attrs).dtype)
        else:
            want = OPS[op].ref(xs, attrs, "cpu")
        out[label] = gelu_at_inf(xs[0], want) if op == "gelu" else want
    return out


def same_bits(got, want) -> bool:
    """Equal values, NaN where want has NaN, and the sign of zero kept."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if not want.is_floating_point():
        return torch.equal(got, want)
    g, w = got.double(), want.double()
    nan = w.isnan()
    return bool(torch.equal(g.isnan(), nan) and torch.equal(g[~nan], w[~nan])
                and torch.equal(g[~nan].signbit(), w[~nan].signbit()))


def check(got: dict, want: dict, exact=lambda label: True):
    bad = []
    for label, w in want.items():
        g = got[label]
        if exact(label) or not w.is_floating_point():
            if not same_bits(g, w):
                diff = (g.double() != w.double()) & ~(g.double().isnan() & w.double().isnan()) if g.shape == w.shape else None
                i = int(diff.nonzero()[0]) if diff is not None and diff.any() else 0
                bad.append(f"{label}: got {g.reshape(-1)[i].item()!r} ({g.dtype}), eager {w.reshape(-1)[i].item()!r} "
                           f"({w.dtype}) at element {i}")
            continue
        t = TOLS[dtype_name(w.dtype)]
        try:
            torch.testing.assert_close(g, w, rtol=t, atol=t, equal_nan=True)
        except AssertionError as e:
            bad.append(f"{label}: {str(e).strip().splitlines()[0]}")
    assert not bad, "\n".join(bad)


# ---- inputs --------------------------------------------------------------------------------------------

FLOAT_EDGES = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 3.0,
               1e-3, 1e-40, -1e-40, 100.0, -100.0, 65504.0, 70000.0, 3e9, -3e9, 1e30, -1e30, 127.9, -128.9,
               255.5, 300.7, -300.7, 2.0 ** 31, -2.0 ** 31 - 1000, 3000000007.0, -2147483649.0, 2.0 ** 63]


def values(dtype: str, seed: int, divisor=False) -> torch.Tensor:
    """N values of `dtype`: its edge cases, then random ones (integers across their whole range
    too, so sums, products and powers overflow). A divisor has no integer zeros (torch raises)."""
    gen = torch.Generator().manual_seed(seed)
    td = DTYPES[dtype]
    if dtype == "b8":
        return torch.rand(N, generator=gen) > 0.5
    if dtype in FLOATS:
        x = (torch.randn(N, generator=gen, dtype=torch.float64) * 3).to(td)
        edge = torch.tensor(FLOAT_EDGES, dtype=torch.float64).to(td)
    else:
        info = torch.iinfo(td)
        small = torch.randint(max(info.min, -9), min(info.max, 9) + 1, (N // 2,), generator=gen)
        wide = torch.randint(info.min, info.max, (N - N // 2,), generator=gen, dtype=torch.int64)
        x = torch.cat([small, wide]).to(td)
        edge = torch.tensor([info.min, info.max, info.min + 1, info.max - 1, 0, 1, -1, 2, 3, 7, -7],
                            dtype=torch.int64).to(td)
    x[:len(edge)] = edge.roll(seed)
    x = x[torch.randperm(N, generator=gen)] if seed else x
    if divisor and dtype in INTS:
        x = torch.where(x == 0, torch.full_like(x, -1), x)
    if divisor and dtype in FLOATS:  # eager's own fmod differs between its vector and scalar loops there
        x = torch.where((x != 0) & (x.abs() < 1e-30), torch.full_like(x, 1e-3), x)
    return x


def pointwise_specs(backend: str, dtype: str):
    """Every pointwise op the backend fuses that takes `dtype` operands (x0, x1; x2 a divisor without
    zeros, x3 a b8 condition, x4 a small exponent)."""
    specs = []
    for op in sorted(o for o in BACKENDS[backend] if OPS[o].category == "pointwise" and o != "cast"):
        arity = OPS[op].arity
        idx = {1: (0,), 2: (0, 2) if op.startswith(("div", "fmod", "remainder")) else (0, 4) if op == "pow" else (0, 1),
               3: (3, 0, 1)}[arity]
        for attrs in ([{"approximate": "none"}, {"approximate": "tanh"}] if op == "gelu" else [{}]):
            dts = tuple("b8" if i == 3 else dtype for i in idx)
            if (takes(op, dts, attrs) if op in SCALAR else takes_tensor(op, dts, attrs)):
                specs.append((op + "".join(f"[{v}]" for v in attrs.values()), op, idx, attrs))
    return specs


def takes_tensor(op, dts, attrs):
    try:
        OPS[op].infer(tuple(TensorType((), d) for d in dts), attrs)
        return True
    except TypeError:
        return False


def pointwise_inputs(dtype: str):
    x, y, d = values(dtype, 0), values(dtype, 1), values(dtype, 2, divisor=True)
    if dtype in INTS:  # exponents: up to 40 (overflows), and negative ones (torch: 0, 1 or -1)
        e = torch.randint(-3, 41, (N,), generator=torch.Generator().manual_seed(3)).to(DTYPES[dtype])
        e = e.abs() if dtype == "u8" else e
    else:
        e = values(dtype, 4)
    return [x, y, d, values("b8", 3), e]


# ---- the tests -----------------------------------------------------------------------------------------

def test_every_backend_entry_is_a_row_and_every_row_is_lowered_or_left_to_torch():
    assert set(llvm_ops.LOWER) <= set(SCALAR) and set(cuda_ops.LOWER) <= set(SCALAR)
    for table, left in ((llvm_ops.LOWER, llvm_ops.LEFT_TO_TORCH), (cuda_ops.LOWER, cuda_ops.LEFT_TO_TORCH)):
        for op, row in SCALAR.items():
            assert (op in table) != (op in left), op
    for name, (_, uses) in COMPOSITES.items():
        assert name not in SCALAR and uses <= set(SCALAR)
    assert {r.kind for r in SCALAR.values()} == {"leaf", "index", "pointwise", "reduction"}


def test_backend_tables_are_checked_when_they_load():
    from minicomp.ir.scalar import backend_ops
    with pytest.raises(ValueError, match=r"\['bogus'\]"):
        backend_ops("test", {**llvm_ops.LOWER, "bogus": None})
    no_exp = {k: v for k, v in llvm_ops.LOWER.items() if k != "exp"}
    with pytest.raises(ValueError, match=r"no recipe for \['exp'\]"):
        backend_ops("test", no_exp, llvm_ops.LEFT_TO_TORCH)
    no_load = {k: v for k, v in llvm_ops.LOWER.items() if k != "load"}
    with pytest.raises(ValueError, match=r"kernel-level ops \['load'\]"):
        backend_ops("test", no_load, llvm_ops.LEFT_TO_TORCH)
    # a composite is fused where its rows all are: without tanh, gelu is left to torch
    no_tanh = {k: v for k, v in llvm_ops.LOWER.items() if k != "tanh"}
    assert "gelu" not in backend_ops("test", no_tanh, llvm_ops.LEFT_TO_TORCH + ("tanh", "gelu"))


def test_nan_rules_state_what_torch_does():
    """Each pointwise row's `nan` says what its torch reference gives for NaN operands."""
    env = SimpleNamespace(device="cpu", ndim=1)

    def ref(op, v):
        return SCALAR[op].ref([torch.tensor([v])] * OPS[op].arity, {}, env, None)[0]
    for op, row in SCALAR.items():
        if row.kind != "pointwise" or op in ("cast", "where") or not takes(op, ("f32",) * OPS[op].arity):
            continue
        got = ref(op, float("nan"))
        rule = row.nan.split(" (")[0].split(",")[0]
        if rule == "true as an operand":  # NaN is a true value, as 1.0 is
            assert got.item() == ref(op, 1.0).item(), op
        elif rule == "propagates":
            assert got.isnan().item(), op
        else:
            assert got.item() == {"false": False, "true": True, "0": 0.0}[rule], op
    assert ref("pow", 1.0).item() == 1.0 and SCALAR["pow"].ref(
        [torch.tensor([float("nan")]), torch.tensor([0.0])], {}, env, None).item() == 1.0  # pow's exceptions


@pytest.mark.parametrize("backend", params)
def test_every_pointwise_entry_in_every_dtype(backend):
    bad = []
    for dtype in ALL:
        inputs = pointwise_inputs(dtype)
        specs = pointwise_specs(backend, dtype)
        got, want = program(backend, specs, inputs), reference(specs, inputs)
        if backend == "cpu":  # a known limit (test_cpu_ops.py, test_trig_of_huge_arguments): NaN past 2**24
            huge = inputs[0].double().abs() > 2 ** 24
            for op in ("sin", "cos", "tan"):
                if op in got:
                    got[op], want[op] = got[op].masked_fill(huge, 0), want[op].masked_fill(huge, 0)
        try:
            check(got, want,
                  exact=lambda label: label.split("[")[0] in EXACT or dtype not in FLOATS)
        except AssertionError as e:
            bad.append(f"{dtype}:\n{e}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("backend", params)
def test_every_cast(backend):
    """Every pair of dtypes, the float specials included: float -> int follows torch's CPU route for
    NaN, infinities and values out of range too (see llvm_values.py)."""
    inputs = [values(d, 5) for d in ALL]
    specs = [(f"{s}->{d}", "cast", (i,), {"dtype": d}) for i, s in enumerate(ALL) for d in ALL if s != d]
    check(program(backend, specs, inputs), reference(specs, inputs))


def _reduction_inputs(dtype):
    gen = torch.Generator().manual_seed(7)
    if dtype == "b8":
        return torch.rand(9, 41, generator=gen) > 0.3
    if dtype in FLOATS:  # +-1 and +-2: sums and products exact in any order; NaN and inf in a few rows
        x = torch.tensor([-1.0, 1.0, 2.0, -2.0])[torch.randint(0, 4, (9, 41), generator=gen)]
        x[:, 20:] = x[:, 20:].sign()
        x[1, 7], x[2, 3], x[3, 5], x[3, 9] = float("nan"), float("inf"), -float("inf"), float("nan")
        return x.to(DTYPES[dtype])
    info = torch.iinfo(DTYPES[dtype])  # the whole range: sums and products wrap
    return torch.randint(info.min, info.max, (9, 41), generator=gen, dtype=torch.int64).to(DTYPES[dtype])


@pytest.mark.parametrize("backend", params)
def test_every_reduction_and_kernel_level_op(backend):
    """sum, prod, amax, amin, argmax, argmin (their identity and combine step) along rows and columns,
    and load, const (full), index (iota), acc and clamp_index (gather, index_select) in every dtype."""
    inputs, specs = [], []
    for dtype in ALL:
        i = len(inputs)
        inputs.append(_reduction_inputs(dtype))
        for op in ("sum", "prod", "amax", "amin", "argmax", "argmin"):
            for dim in (0, 1):
                attrs = {"dim": dim, "keepdim": False} if op.startswith("arg") else {"dims": (dim,), "keepdim": dim == 0}
                if op in BACKENDS[backend] and takes(op, (dtype,)):
                    specs.append((f"{op}[{dtype},{dim}]", op, (i,), attrs))
    inputs += [torch.tensor([3, 0, 8, 40, 1, 2, 9, 0]), torch.tensor([[0, 40, 3]] * 9)]
    for dtype in ALL:
        i = ALL.index(dtype)
        specs += [(f"index_select[{dtype}]", "index_select", (i, len(ALL)), {"dim": 1}),
                  (f"gather[{dtype}]", "gather", (i, len(ALL) + 1), {"dim": 1}),
                  (f"full[{dtype}]", "full", (), {"shape": (3, 5), "value": True if dtype == "b8" else -2,
                                                  "dtype": dtype}),
                  (f"iota[{dtype}]", "iota", (), {"shape": (4, 6), "dim": 1, "start": 1, "step": 3, "dtype": dtype})]
    check(program(backend, specs, inputs), reference(specs, inputs),
          exact=lambda label: not label.startswith(("sum[f", "sum[bf", "prod[f", "prod[bf")))


# ---- the three disagreements with eager this table was made to end ----------------------------------

@pytest.mark.parametrize("backend", params)
def test_overflowing_integer_pow_wraps_like_eager(backend):
    """CUDA rounded a double pow (3 ** 40 in i32 came out as INT_MIN); torch multiplies and wraps."""
    x = torch.tensor([3, -3, 7, 2, 5, -2, 1, -1, 0, 46341], dtype=torch.int32)
    y = torch.tensor([40, 41, 13, 31, 20, 33, -2, -3, 5, 2], dtype=torch.int32)
    specs = [("pow32", "pow", (0, 1), {}), ("pow64", "pow", (2, 3), {})]
    inputs = [x, y, x.long() * 1000003, y.long()]
    check(program(backend, specs, inputs), reference(specs, inputs))


@pytest.mark.parametrize("backend", params)
def test_f16_trunc_division_rounds_the_quotient_first(backend):
    """torch truncates the f16-rounded quotient; truncating the f32 quotient differed in about a
    quarter of random samples on the CPU backend."""
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(4096, generator=gen) * 100).half()
    y = (torch.randn(4096, generator=gen) * 2).half()
    specs = [("f16", "div_trunc", (0, 1), {}), ("bf16", "div_trunc", (2, 3), {})]
    inputs = [x, y, x.bfloat16(), y.bfloat16()]
    check(program(backend, specs, inputs), reference(specs, inputs))


@pytest.mark.parametrize("backend", params)
def test_float_to_small_int_casts_follow_eager_out_of_range(backend):
    """torch (CPU) truncates to i8/i16 through a 32-bit int and to u8 through a 64-bit one, NaN and
    out-of-range values giving the wide int's minimum; the backends took other routes."""
    v = torch.tensor(FLOAT_EDGES + [-1.5, 256.0, 65535.0, -40000.0, 4294967596.0, -3000000007.0], dtype=torch.float64)
    inputs = [v.to(DTYPES[s]) for s in FLOATS]
    specs = [(f"{s}->{d}", "cast", (i,), {"dtype": d}) for i, s in enumerate(FLOATS) for d in INTS]
    check(program(backend, specs, inputs), reference(specs, inputs))


@pytest.mark.parametrize("src, dst", [("f32", "i8"), ("f32", "u8"), ("f64", "i32"), ("f16", "i16")])
def test_float_to_int_casts_stay_vector_code(src, dst):
    """torch's route (a range check and selects around the conversion) still vectorizes."""
    import re

    from minicomp.codegen.llvm_module import generate_module
    from minicomp.runtime import llvm_jit
    x = Node("input", (), type=TensorType((1024,), src), name="x")
    y = Node("cast", [x], {"dtype": dst}, TensorType((1024,), dst))
    fused = run_passes(Graph("cast", [x], [y], [y]), make_context(Options.make("cpu"), "cast", "cpu"))
    optimized = llvm_jit.optimize(generate_module([n.meta["kernel"] for n in fused.nodes if n.op == "kernel"])[0])
    bits = {"i8": 8, "u8": 8, "i16": 16, "i32": 32}[dst]
    assert re.search(rf"<\d+ x i{bits}>", optimized), f"{src} -> {dst} is not vector code"
