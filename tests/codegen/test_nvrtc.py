"""NVRTC compiles every kernel the CUDA generator emits for the representative graphs and for the
model zoo (forward and backward), for sm_80 and sm_90, to CUBIN -- no GPU needed -- and each CUBIN
shows its kernels launch at their planned block sizes: registers x threads within an SM's 65536,
at most 1024 threads and within __launch_bounds__, static shared memory within 48 KiB
(runtime/cubin.py). All kernels go into one translation unit per architecture (one NVRTC call
each: parsing cuda_fp16.h dominates a small compile)."""
import dataclasses
import logging
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

nvrtc_bindings = pytest.importorskip("cuda.bindings.nvrtc", reason="needs the [cuda] extras (cuda-bindings)")

from minicomp.codegen.cuda import generate  # noqa: E402
from minicomp.backends.cuda import prelude_headers  # noqa: E402
from minicomp.errors import MinicompError  # noqa: E402
from minicomp.runtime import cubin, nvrtc  # noqa: E402
from tests.codegen import launch_check  # noqa: E402
from tests.codegen.test_cuda_codegen import (CASES, DTYPES_ALL, case_kernels, cast_graph, op_table_graph,  # noqa: E402
                                             reduction_graph, text_kernels)

try:
    nvrtc.include_dirs()
except MinicompError as e:
    pytest.skip(str(e), allow_module_level=True)

HUGE = ("graph huge(%x: f32[3,1073741824]) -> (f32[3]) {\n  %0: f32[3] = sum %x [dims=(1,), keepdim=false]\n"
        "  return %0\n}\n")


def _long_rows(length, dtype):
    """The heaviest row kernels at 512 and 1024 threads a block: softmax, layer_norm (its mean and
    rstd too) and argmax of rows this long."""
    t = f"{dtype}[4,{length}]"
    return text_kernels(
        f"graph rows(%x: {t}, %w: {dtype}[{length}]) -> ({t}, {t}, i64[4]) {{\n"
        f"  %0: {dtype}[4,1] = amax %x [dims=(1,), keepdim=true]\n  %1: {t} = sub %x %0\n  %2: {t} = exp %1\n"
        f"  %3: {dtype}[4,1] = sum %2 [dims=(1,), keepdim=true]\n  %4: {t} = div %2 %3\n"
        f"  %n: {dtype}[] = full [dtype={dtype}, shape=(), value={length}.0]\n"
        f"  %s: {dtype}[4,1] = sum %x [dims=(1,), keepdim=true]\n  %5: {dtype}[4,1] = div %s %n\n"
        f"  %6: {t} = sub %x %5\n  %7: {t} = mul %6 %6\n"
        f"  %v: {dtype}[4,1] = sum %7 [dims=(1,), keepdim=true]\n  %8: {dtype}[4,1] = div %v %n\n"
        f"  %e: {dtype}[] = full [dtype={dtype}, shape=(), value=1e-05]\n  %9: {dtype}[4,1] = add %8 %e\n"
        f"  %10: {dtype}[4,1] = rsqrt %9\n  %11: {t} = mul %6 %10\n  %12: {t} = mul %11 %w\n"
        f"  %13: i64[4] = argmax %x [dim=1, keepdim=false]\n  return %4, %12, %13\n}}\n")


def all_kernels():
    """Every representative kernel, renamed <graph>_<kernel> so they share a translation unit."""
    groups = {name: case_kernels(name) for name in CASES}
    for length in (10000, 20000):
        for d in ("f32", "f64", "f16"):
            groups[f"rows{length}_{d}"] = _long_rows(length, d)
    for d in DTYPES_ALL:
        groups[f"ops_{d}"] = text_kernels(op_table_graph(d))
        groups[f"reduce_{d}"] = text_kernels(reduction_graph(d))
    groups["casts"] = text_kernels(cast_graph())
    groups["huge"] = text_kernels(HUGE)
    return [dataclasses.replace(k, name=f"{g}_{k.name}") for g, ks in groups.items() for k in ks]


ARCHS = ("sm_80", "sm_90")


@pytest.fixture(scope="module")
def compiled():
    """(source, {arch: Binary}); NVRTC releases the GIL, so the two architectures compile at once."""
    src, launches = generate(all_kernels())
    strategies = {la.strategy.rstrip("0123456789") for la in launches}
    assert strategies == {"pointwise", "pointwise-vec", "thread", "warp", "block"}
    assert "const long long rows = 3, len = 1073741824;" in src  # 64-bit index math
    with ThreadPoolExecutor(len(ARCHS)) as pool:
        return src, dict(zip(ARCHS, pool.map(lambda a: nvrtc.compile(src, a, prelude_headers()), ARCHS)))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_to_cubin(compiled, arch):
    source, binaries = compiled
    binary = binaries[arch]
    assert binary.kind == "cubin" and binary.arch == arch
    assert binary.data[:4] == b"\x7fELF" and len(binary.data) > 10_000
    names = re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", source)
    assert len(names) == source.count("__global__") > 50
    for name in names:
        assert name.encode() in binary.data  # extern "C": unmangled entry points


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_fits_its_block(compiled, arch):
    """Every kernel's planned block fits (cubin.check raises naming any that does not), and the CUBIN
    carries each kernel's __launch_bounds__: ptxas compiled it for that block."""
    source, binaries = compiled
    _, launches = generate(all_kernels())
    found = cubin.check(binaries[arch].data, launches, arch)
    assert set(found) == {la.name for la in launches}
    for la in launches:
        r = found[la.name]
        assert r.max_threads == la.block and 0 < r.registers <= 65536 // la.block
    assert {la.block for la in launches} == {256, 512, 1024}


TINY = 'extern "C" __global__ void k(float* __restrict__ b0) { b0[threadIdx.x] = mc_round_f16(1.0f / 3.0f); }\n'


def test_cache_hit_returns_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    src = '#include "prelude.cuh"\n' + TINY
    first = nvrtc.compile(src, "sm_90", prelude_headers())
    entries = list((tmp_path / "nvrtc").iterdir())
    assert len(entries) == 1
    assert nvrtc.compile(src, "sm_90", prelude_headers()) == first
    assert nvrtc.compile(src, "sm_80", prelude_headers()) != first  # the target is part of the key


def test_unknown_newer_gpu_gets_ptx():
    arch, kind = nvrtc.target("sm_999")
    assert kind == "ptx" and arch.startswith("compute_")
    binary = nvrtc.compile('#include "prelude.cuh"\n' + TINY, "sm_999", prelude_headers())
    assert binary.kind == "ptx" and b".entry k(" in binary.data


def test_compile_error_shows_log_and_numbered_source():
    bad = '#include "prelude.cuh"\nextern "C" __global__ void k(float* b0) {\n  b0[0] = undefined_thing;\n}\n'
    with pytest.raises(nvrtc.NvrtcError) as info:
        nvrtc.compile(bad, "sm_90", prelude_headers())
    msg = str(info.value)
    assert "undefined_thing" in msg and "error" in msg
    assert '   3    b0[0] = undefined_thing;' in msg


# -- the launch check itself ---------------------------------------------------------------------------

HEAVY = """#include "prelude.cuh"
// 32 doubles held across a loop whose trip count is known only at run time: ptxas needs > 64 registers
extern "C" __global__ void DECL heavy(double* __restrict__ b0, const int* __restrict__ n) {
  double a[32];
#pragma unroll
  for (int i = 0; i < 32; i++) a[i] = b0[i * 1024 + threadIdx.x];
  double s = 0;
  for (int j = 0; j < n[0]; j++) {
#pragma unroll
    for (int i = 0; i < 32; i++) { s += a[i] * a[(i + 7) % 32]; a[i] = a[i] * s + (double)j; }
  }
  b0[threadIdx.x] = s;
}
extern "C" __global__ void __launch_bounds__(1024) light(float* __restrict__ b0) {
  __shared__ float s[300];
  s[threadIdx.x % 300] = b0[threadIdx.x];
  __syncthreads();
  b0[threadIdx.x] = s[(threadIdx.x + 1) % 300];
}
"""


def _ptxas_log(source, arch):
    """NVRTC with ptxas' verbose report: per kernel, 'Used N registers' and 'N bytes smem'."""
    nv = nvrtc_bindings
    headers = prelude_headers()
    names = sorted(headers)
    err, prog = nv.nvrtcCreateProgram(source.encode(), b"heavy.cu", len(names), [headers[n].encode() for n in names],
                                      [n.encode() for n in names])
    opts = [f"-arch={arch}", *nvrtc.OPTIONS, "--ptxas-options=-v", *(f"-I{d}" for d in nvrtc.include_dirs())]
    try:
        err, = nv.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, size = nv.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nv.nvrtcGetProgramLog(prog, log)
        assert int(err) == 0, log.decode()
    finally:
        nv.nvrtcDestroyProgram(prog)
    out, name = {}, None
    for line in log.decode(errors="replace").splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", line)
        if m and name:
            out[name] = (int(m.group(1)), int(m.group(2) or 0))
    return out


@dataclasses.dataclass
class _Launch:
    name: str
    block: int
    shared_bytes: int = 0


@pytest.mark.parametrize("arch", ARCHS)
def test_resources_read_from_the_cubin_agree_with_ptxas(arch):
    """The ELF attributes cubin.py reads are what ptxas itself reports, for a heavy kernel without
    launch bounds and a light one with them."""
    source = HEAVY.replace("DECL ", "")
    found = cubin.resources(nvrtc.compile(source, arch, prelude_headers()).data)
    log = _ptxas_log(source, arch)
    assert set(found) == set(log) == {"heavy", "light"}
    for name, (regs, smem) in log.items():
        assert found[name].registers == regs
    assert found["light"].max_threads == 1024 and found["light"].max_registers == 64
    assert found["heavy"].max_threads is None and found["heavy"].registers > 64
    assert found["light"].shared_bytes >= 1200 == log["light"][1]  # sm_90 adds the 1 KiB it reserves


@pytest.mark.parametrize("arch", ARCHS)
def test_a_kernel_too_heavy_for_its_block_is_named(arch):
    """Without __launch_bounds__ ptxas gave `heavy` more than 64 registers a thread: a 1024-thread block
    of it needs more than an SM's 65536 and would fail with LAUNCH_OUT_OF_RESOURCES. The check says so
    before any GPU is involved; with launch bounds the same kernel fits (ptxas caps it at 64)."""
    image = nvrtc.compile(HEAVY.replace("DECL ", ""), arch, prelude_headers()).data
    regs = cubin.resources(image)["heavy"].registers
    assert cubin.check(image, [_Launch("heavy", 256), _Launch("light", 1024)])  # fits at 256 threads
    with pytest.raises(cubin.LaunchResourceError, match=rf"heavy: {regs} registers a thread x 1024 threads") as info:
        cubin.check(image, [_Launch("heavy", 1024), _Launch("light", 1024)], arch)
    assert "light" not in str(info.value) and arch in str(info.value)
    with pytest.raises(cubin.LaunchResourceError, match="light: 2048 threads a block"):
        cubin.check(image, [_Launch("light", 2048)])
    with pytest.raises(cubin.LaunchResourceError, match="missing: not in the image"):
        cubin.check(image, [_Launch("missing", 32)])
    bounded = nvrtc.compile(HEAVY.replace("DECL", "__launch_bounds__(1024)"), arch, prelude_headers()).data
    assert cubin.check(bounded, [_Launch("heavy", 1024)])["heavy"].registers <= 64


def test_block_registers_round_per_warp():
    assert cubin.block_registers(64, 1024) == 65536
    assert cubin.block_registers(65, 1024) == 72 * 32 * 32  # 65 x 32 = 2080 -> 2304 a warp
    assert cubin.block_registers(10, 33) == 2 * 512  # two warps of 320 -> 512
    r = cubin.Resources("k", 32, 49 * 1024, 0, None, 255)
    assert cubin.problems(r, 256) == [f"{49 * 1024} bytes of static shared memory, a block may declare {48 * 1024}"]


# -- every kernel of the model zoo, forward and backward ------------------------------------------------

@pytest.fixture(scope="module")
def zoo_kernels():
    """The zoo through minicomp.compile on cuda_emu, forward and backward, every generated kernel
    recorded (the cuda backend's source is the same)."""
    import minicomp
    from tests.e2e.models import ZOO
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("the zoo's kernels come from cuda_emu, which needs a host C++20 compiler (g++)")
    log = logging.getLogger("minicomp")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with launch_check.recording() as seen:
            for name, make in ZOO.items():
                torch.manual_seed(0)
                model, inputs = make()
                inputs = [x.requires_grad_() if x.is_floating_point() else x for x in inputs]
                torch._dynamo.reset()
                out = minicomp.compile(model, backend="cuda_emu")(*inputs)
                sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
    finally:
        log.setLevel(level)
    return seen


def test_zoo_kernels_fit_on_sm80_and_sm90(zoo_kernels):
    kernels = launch_check.distinct(zoo_kernels, "zoo")
    assert len(kernels) >= 50
    found = launch_check.compile_and_check(kernels)
    _, launches = generate(kernels)
    assert {la.strategy.rstrip("0123456789") for la in launches} >= {"pointwise", "thread", "warp"}
    for arch in launch_check.ARCHS:
        assert len(found[arch]) == len(kernels)
        assert all(found[arch][la.name].max_threads == la.block for la in launches)
