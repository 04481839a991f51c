"""cuda_emu runs the exact CUDA C of the cuda backend on the CPU: the op table in every dtype, casts,
reductions along every layout, the representative graphs, NaN/Inf, odd sizes -- all against eager
(the op table's torch references, or the torch function itself). Plus the emulation's own promises:
half/bfloat16 rounding, barriers and shuffles, results that do not depend on the launch size."""
from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil

import pytest
import torch

from minicomp.backends import build
from minicomp.backends.cuda import prelude_headers
from minicomp.codegen.cuda import generate
from minicomp.compiler.capture import compile_fx_graph, make_context
from minicomp.ir import DTYPES, interpret, parse
from minicomp.options import Options
from minicomp.report import Report
from minicomp.runtime.cuda_emu import EmuCompileError, EmuLaunch, EmuModule
from tests.helpers import gelu_at_inf
from tests.codegen.test_cuda_codegen import (CASES, DTYPES_ALL, case_kernels, cast_graph, flat, fuse,
                                             op_table_graph, reduction_graph, trace)

if shutil.which(os.environ.get("CXX", "g++")) is None:
    pytest.skip("cuda_emu needs a host C++20 compiler (g++)", allow_module_level=True)

TOLS = {"f16": (2e-3, 2e-3), "bf16": (1.6e-2, 1.6e-2), "f32": (1e-5, 1e-5), "f64": (1e-7, 1e-7)}
SPECIAL = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 0.5, 1.0, -2.5, 65504.0, 1e-6]


def _launch(launch, bufs) -> None:
    """One emulated launch on `bufs` (its slots index them), as a program's generated call makes it."""
    for i, slot in enumerate(launch.slots):
        launch.values[i] = bufs[slot].data_ptr()
    launch.launch()


def emu_program(text):
    """A cuda_emu program for IR text, built as compile_fx_graph would after lowering."""
    graph = fuse(parse(text))
    opts = Options(backend="cuda_emu", verify=True)
    program, detail = build(graph, make_context(opts, "t", "cuda_emu"), "cuda_emu")
    return program, detail


def assert_like_interpret(text, inputs, names=None):
    program, detail = emu_program(text)
    got = program(*inputs)
    want = interpret(parse(text), *inputs)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        what = names[i] if names else f"output {i}"
        if what == "gelu":
            w = gelu_at_inf(inputs[0], w)
        assert g.dtype == w.dtype and g.shape == w.shape, what
        rtol, atol = TOLS.get(parse(text).outputs[i].type.dtype, (0, 0))
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    return detail


def _floats(shape, gen, dtype):
    x = torch.randn(shape, generator=gen) * 3
    x.view(-1)[:len(SPECIAL)] = torch.tensor(SPECIAL)
    return x.to(DTYPES[dtype])


def op_inputs(dtype, shape=(37, 19), seed=0):
    gen = torch.Generator().manual_seed(seed)
    c = torch.rand(shape, generator=gen) > 0.5
    if dtype in ("f32", "f16", "bf16", "f64"):
        return [_floats(shape, gen, dtype), _floats(shape, gen, dtype).flip(0), c]
    if dtype == "b8":
        return [torch.rand(shape, generator=gen) > 0.5, torch.rand(shape, generator=gen) > 0.5, c]
    lo = 0 if dtype == "u8" else -7  # divisors and exponents stay positive: torch refuses the others
    return [torch.randint(lo, 8, shape, generator=gen).to(DTYPES[dtype]),
            torch.randint(1, 5, shape, generator=gen).to(DTYPES[dtype]), c]


@pytest.mark.parametrize("dtype", DTYPES_ALL)
def test_op_table(dtype):
    text = op_table_graph(dtype)
    names = [ln.split("= ")[1].split(" ")[0] for ln in text.splitlines()[1:-2]]
    detail = assert_like_interpret(text, op_inputs(dtype), names)
    assert detail["kernels"] == 1


def test_signed_division_and_remainder_with_negative_divisors():
    types = "i32[64], i32[64], i64[64], i64[64], i32[64], i32[64]"
    text = "graph f(%x: i32[64], %y: i32[64], %a: i64[64], %b: i64[64]) -> (" + types + """) {
  %0: i32[64] = div_floor %x %y
  %1: i32[64] = remainder %x %y
  %2: i64[64] = div_floor %a %b
  %3: i64[64] = remainder %a %b
  %4: i32[64] = div_trunc %x %y
  %5: i32[64] = fmod %x %y
  return %0, %1, %2, %3, %4, %5
}
"""
    x = torch.arange(-32, 32, dtype=torch.int32)
    y = torch.tensor([-3, -2, -1, 1, 2, 3, 5, -7] * 8, dtype=torch.int32)
    assert_like_interpret(text, [x, y, x.long() * 1_000_000_007, y.long()])


def test_casts_between_every_pair_of_dtypes():
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(300, generator=gen) * 100
    base[:6] = torch.tensor([0.0, 0.5, 1.5, 2.5, 99.99, 1.0 + 2 ** -11])  # ties round to even
    inputs = [(base if DTYPES[d].is_floating_point else base.floor()).to(DTYPES[d]) for d in DTYPES_ALL[:-1]]
    assert_like_interpret(cast_graph(), inputs + [base > 50])


def reduction_inputs(dtype, seed=0):
    """Exact values (so any summation order agrees), many ties (argmax picks the first), and a NaN
    row and column in the float inputs."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape in ((3, 1500), (40, 50)):
        if dtype == "b8":
            out.append(torch.rand(shape, generator=gen) > 0.3)
            continue
        pick = torch.randint(0, 6, shape, generator=gen)
        if dtype in ("f32", "f16", "bf16", "f64"):  # +-1 but for a few: products stay within f16's range
            x = torch.tensor([-1.0, 1.0])[pick % 2]
            x[:, ::151] *= 2
            x[:, 5::173] *= 0.5
            x[1, 7] = float("nan")
            x[2, 3] = float("inf")
        else:
            x = pick - (0 if dtype == "u8" else 3)
        out.append(x.to(DTYPES[dtype]))
    return out


@pytest.mark.parametrize("dtype", DTYPES_ALL)
def test_reductions_along_rows_and_columns(dtype):
    detail = assert_like_interpret(reduction_graph(dtype), reduction_inputs(dtype))
    assert sorted(detail["strategies"]) == ["block", "thread", "warp", "warp"]


@pytest.mark.parametrize("name", CASES)
def test_representative_graphs_match_eager(name):
    fn, make = CASES[name]
    torch.manual_seed(0)
    inputs = make()
    run = compile_fx_graph(trace(fn, inputs), inputs, Options.make("cuda_emu"), Report(), "inference")
    got = run([x.clone() for x in inputs])
    want = flat(fn)(*inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, **({} if w.dtype in (torch.float16, torch.bfloat16)
                                                             else {"rtol": 1e-5, "atol": 1e-5}))


def _eager_vs_emu(fn, *inputs):
    run = compile_fx_graph(trace(fn, inputs), inputs, Options.make("cuda_emu"), Report(), "inference")
    for g, w in zip(run(list(inputs)), flat(fn)(*inputs), strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_softmax_and_layer_norm_with_nan_and_inf_rows():
    x = torch.randn(6, 300)
    x[1, 17] = float("nan")
    x[2] = -float("inf")              # softmax of an all -inf row is NaN
    x[3, 5] = float("inf")            # and of a row with +inf too
    x[4, :150] = -float("inf")        # half masked, as in causal attention
    _eager_vs_emu(lambda t: (torch.softmax(t, -1), torch.log_softmax(t, -1), t.amax(-1), t.argmax(-1)), x)
    _eager_vs_emu(lambda t: torch.nn.functional.layer_norm(t, (300,)), x)


def test_misaligned_inputs_take_the_scalar_path():
    base = torch.randn(1004)
    x = base[1:]  # contiguous, but 4 bytes past a 16-byte boundary
    assert x.data_ptr() % 16 != 0
    _eager_vs_emu(lambda t: torch.exp(t) * 2 + 1, x)


def test_results_do_not_depend_on_the_launch_size():
    kernels = case_kernels("layer_norm_long") + case_kernels("softmax_warp") + case_kernels("pointwise_tail")
    kernels = [dataclasses.replace(k, name=f"k{i}") for i, k in enumerate(kernels)]
    source, _ = generate(kernels)
    module = EmuModule(source, [k.name for k in kernels], prelude_headers())
    gen = torch.Generator().manual_seed(0)
    inputs = [[torch.randn(b.numel, generator=gen).to(DTYPES[b.dtype]) if i in k.reads
               else torch.zeros(b.numel, dtype=DTYPES[b.dtype]) for i, b in enumerate(k.buffers)] for k in kernels]
    results = []
    for grid, block in ((1, 32), (3, 96), (2, 1024)):
        bufs = [[t.clone() for t in ts] for ts in inputs]
        for k, ts in zip(kernels, bufs):
            _launch(EmuLaunch(module, k.name, grid, block, 0, list(range(len(ts)))), ts)
        results.append(bufs)
    for other in results[1:]:
        for ts_a, ts_b in zip(results[0], other):
            for a, b in zip(ts_a, ts_b):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


HEADER_PROBE = r'''
#include "prelude.cuh"
extern "C" __global__ void to_half(const float* __restrict__ x, __half* __restrict__ h,
                                   __nv_bfloat16* __restrict__ b, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    h[i] = __float2half_rn(x[i]);
    b[i] = __float2bfloat16_rn(x[i]);
  }
}
// every thread passes its id to the next thread through shared memory, then reduces it in a warp and a block
extern "C" __global__ void exchange(int* __restrict__ next, int* __restrict__ warp_sum,
                                    long long* __restrict__ block_max) {
  __shared__ int ids[1024];
  __shared__ long long partials[32];
  const int t = threadIdx.x, n = blockDim.x;
  ids[t] = t + 1000 * blockIdx.x;
  __syncthreads();
  next[blockIdx.x * n + t] = ids[(t + 1) % n];
  warp_sum[blockIdx.x * n + t] = mc_warp_reduce(t, mc_op_sum());
  const long long m = mc_block_reduce((long long)(t * 7 % n), mc_op_max(), (long long)-1, partials);
  if (t == 0) block_max[blockIdx.x] = m;
}
'''


@pytest.fixture(scope="module")
def probe():
    return EmuModule(HEADER_PROBE, ["to_half", "exchange"], prelude_headers())


def _call(module, name, grid, block, args):
    """Launch with explicit arguments: tensors by pointer, ints by value."""
    vals = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int(a) for a in args]
    ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    cfg = (ctypes.c_uint * 7)(grid, 1, 1, block, 1, 1, 0)
    assert module.function(name)(ctypes.addressof(cfg), ctypes.addressof(ptrs)) == 0


def test_half_and_bfloat16_round_to_nearest_even(probe):
    gen = torch.Generator().manual_seed(0)
    ties = [1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 2 ** -24, 2 ** -25, 3 * 2 ** -26]
    x = torch.cat([torch.tensor(ties + [65504.0, 65519.0, 65520.0, 1e-8, -0.0, float("inf"), 3.4e38]),
                   torch.randn(2000, generator=gen) * torch.logspace(-30, 30, 2000)])
    h, b = torch.empty(len(x), dtype=torch.float16), torch.empty(len(x), dtype=torch.bfloat16)
    _call(probe, "to_half", 2, 64, [x, h, b, len(x)])
    assert torch.equal(h.view(torch.int16), x.half().view(torch.int16))
    assert torch.equal(b.view(torch.int16), x.bfloat16().view(torch.int16))
    nan = torch.tensor([float("nan")] * 2)
    _call(probe, "to_half", 1, 32, [nan, h, b, 2])
    assert h[:2].isnan().all() and b[:2].isnan().all()


@pytest.mark.parametrize("block", [32, 96, 1024])
def test_barriers_and_shuffles(probe, block):
    grid = 2
    nxt = torch.zeros(grid * block, dtype=torch.int32)
    wsum = torch.zeros(grid * block, dtype=torch.int32)
    bmax = torch.zeros(grid, dtype=torch.int64)
    _call(probe, "exchange", grid, block, [nxt, wsum, bmax])
    t = torch.arange(block)
    for g in range(grid):
        assert torch.equal(nxt[g * block:(g + 1) * block], ((t + 1) % block + 1000 * g).int())
        assert torch.equal(wsum[g * block:(g + 1) * block], (t // 32 * 32 * 32 + 496).int())
    assert torch.equal(bmax, torch.full((grid,), int((t * 7 % block).max())))


def test_what_is_not_emulated_fails_to_compile_with_its_name():
    src = 'extern "C" __global__ void k(float* __restrict__ x) { atomicAdd(x, 1.0f); }\n'
    with pytest.raises(EmuCompileError, match="atomicAdd is not emulated"):
        EmuModule(src, ["k"], {})


def test_refused_launches_raise(probe):
    bufs = [torch.zeros(4), torch.zeros(4, dtype=torch.float16), torch.zeros(4, dtype=torch.bfloat16)]
    with pytest.raises(RuntimeError, match="refused"):
        _launch(EmuLaunch(probe, "exchange", 1, 32, 128, [0, 1, 2]), bufs)  # dynamic shared memory
    with pytest.raises(RuntimeError, match="refused"):
        _launch(EmuLaunch(probe, "exchange", 1, 2048, 0, [0, 1, 2]), bufs)  # more threads than a block holds


def test_out_of_bounds_index_fails_the_launch():
    src = ('#include "prelude.cuh"\nextern "C" __global__ void k(float* __restrict__ b0) {\n'
           '  b0[MC_IN(threadIdx.x + 1, 32)] = 1.0f;\n}\n')
    module = EmuModule(src, ["k"], prelude_headers())
    where = r"kernel k: index 32 outside \[0, 32\) in block \(0, 0, 0\), thread \(31, 0, 0\)"
    with pytest.raises(RuntimeError, match=where):
        _launch(EmuLaunch(module, "k", 1, 32, 0, [0]), [torch.zeros(32)])


EARLY_EXIT = r'''
#include "prelude.cuh"
// the upper half of the block returns before the barriers; the rest meet at them three times, the
// last time after a warp reduction, and each sees the others' shared writes
extern "C" __global__ void early(int* __restrict__ out) {
  __shared__ int seen[1024];
  const int t = threadIdx.x, n = blockDim.x;
  if (t >= n / 2) return;
  seen[t] = t;
  __syncthreads();
  int s = seen[(t + 1) % (n / 2)];
  __syncthreads();
  seen[t] = s * 2;
  __syncthreads();
  out[blockIdx.x * n + t] = seen[(t + 1) % (n / 2)] + mc_warp_reduce(1, mc_op_sum());
}
extern "C" __global__ void split(int* __restrict__ out) {  // lane 0 at __syncthreads, its warp at a shuffle
  if (threadIdx.x == 0) __syncthreads();
  else out[threadIdx.x] = mc_warp_reduce(1, mc_op_sum());
}
'''


@pytest.mark.parametrize("block", [64, 128, 1024])
def test_threads_that_return_hold_up_no_barrier(block):
    """A CUDA thread that has returned is out of every later barrier, as on a GPU: the rest meet
    without it, block after block (each block's fibers start afresh)."""
    module = EmuModule(EARLY_EXIT, ["early", "split"], prelude_headers())
    out = torch.full((3 * block,), -1, dtype=torch.int32)
    _call(module, "early", 3, block, [out])
    half = block // 2
    t = torch.arange(half)
    for g in range(3):
        got = out[g * block:(g + 1) * block]
        assert torch.equal(got[:half], (((t + 2) % half) * 2 + 32).int())
        assert (got[half:] == -1).all()


def test_threads_at_different_barriers_abort_with_a_message(tmp_path):
    """Lane 0 waits at __syncthreads while its warp waits for it in a shuffle: a GPU hangs; the emulator
    ends the process saying why, where OS threads per CUDA thread hung the test run."""
    script = tmp_path / "split.py"
    script.write_text(
        "import ctypes, torch\n"
        "from minicomp.backends.cuda import prelude_headers\n"
        "from minicomp.runtime.cuda_emu import EmuModule\n"
        f"m = EmuModule({EARLY_EXIT!r}, ['early', 'split'], prelude_headers())\n"
        "out = torch.zeros(32, dtype=torch.int32)\n"
        "v = ctypes.c_void_p(out.data_ptr()); ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(v))\n"
        "cfg = (ctypes.c_uint * 7)(1, 1, 1, 32, 1, 1, 0)\n"
        "m.function('split')(ctypes.addressof(cfg), ctypes.addressof(ptrs))\n")
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode != 0 and "wait at different barriers" in proc.stderr, proc.stderr[-2000:]


def test_kernel_libraries_compile_against_precompiled_headers(monkeypatch, tmp_path):
    """A kernel library's compile starts from cuda_emu.h precompiled once per process; a precompiled
    form g++ cannot use (here: overwritten) costs time, never a wrong or failed build."""
    from minicomp.runtime import cuda_emu
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))  # nothing cached: every library compiles
    src = ('#include "prelude.cuh"\nextern "C" __global__ void k(float* __restrict__ b0) {\n'
           '  b0[MC_IN(threadIdx.x, 32)] = mc_warp_reduce((float)threadIdx.x, mc_op_sum()) + SCALE;\n}\n')
    with open(cuda_emu.HEADER) as f:
        folder = cuda_emu._precompiled(f.read())
    assert folder and os.path.getsize(os.path.join(folder, "cuda_emu.h.gch")) > 0
    gch = os.path.join(folder, "cuda_emu.h.gch")
    with open(gch, "rb") as f:
        good = f.read()
    try:
        for scale in (1, 2):
            out = torch.zeros(32)
            module = EmuModule(f"#define SCALE {scale}\n" + src, ["k"], prelude_headers())
            _launch(EmuLaunch(module, "k", 1, 32, 0, [0]), [out])
            assert torch.equal(out, torch.full((32,), 496.0 + scale))
            with open(gch, "wb") as f:
                f.write(b"not a precompiled header")
    finally:  # the rest of this process compiles from it too
        with open(gch, "wb") as f:
            f.write(good)
