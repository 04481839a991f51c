"""NVRTC compiles every kernel the CUDA generator emits for the representative graphs, for sm_80 and
sm_90, to CUBIN -- no GPU needed. All kernels go into one translation unit per architecture (one
NVRTC call each: parsing cuda_fp16.h dominates a small compile)."""
import dataclasses
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

nvrtc_bindings = pytest.importorskip("cuda.bindings.nvrtc", reason="needs the [cuda] extras (cuda-bindings)")

from minicomp.codegen.cuda import generate  # noqa: E402
from minicomp.compiler.backend_cuda import prelude_headers  # noqa: E402
from minicomp.errors import MinicompError  # noqa: E402
from minicomp.runtime import nvrtc  # noqa: E402
from tests.codegen.test_cuda_codegen import (CASES, DTYPES_ALL, case_kernels, cast_graph, op_table_graph,  # noqa: E402
                                             reduction_graph, text_kernels)

try:
    nvrtc.include_dirs()
except MinicompError as e:
    pytest.skip(str(e), allow_module_level=True)

HUGE = ("graph huge(%x: f32[3,1073741824]) -> (f32[3]) {\n  %0: f32[3] = sum %x [dims=(1,), keepdim=false]\n"
        "  return %0\n}\n")


def all_kernels():
    """Every representative kernel, renamed <graph>_<kernel> so they share a translation unit."""
    groups = {name: case_kernels(name) for name in CASES}
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
    for name in re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", source):
        assert name.encode() in binary.data  # extern "C": unmangled entry points


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
