"""Kernels the tests generate, compiled by NVRTC to CUBIN and checked to launch (runtime/cubin.py).

`recording()` collects every Kernel the CUDA generator is handed while a block runs (the cuda_emu
backend builds the exact source the cuda backend would, so these are the kernels a GPU would get);
`compile_and_check(kernels)` puts the distinct ones into one translation unit per architecture,
generated as the cuda backend does (planned blocks, no emulation caps), compiles it, and raises
LaunchResourceError naming any kernel whose block would not fit. Used by test_nvrtc.py (the model
zoo) and tests/e2e/test_opinfo.py (the OpInfo sweep).
"""
from __future__ import annotations

import contextlib
import dataclasses
from concurrent.futures import ThreadPoolExecutor

from minicomp.codegen import cuda as cuda_codegen

ARCHS = ("sm_80", "sm_90")


@contextlib.contextmanager
def recording():
    """Yields a list that fills with every kernel generate() is called with (backends/cuda.py looks the
    function up on each build, so wrapping the module attribute catches every graph)."""
    seen: list = []
    original = cuda_codegen.generate

    def generate(kernels, **kw):
        kernels = list(kernels)
        seen.extend(kernels)
        return original(kernels, **kw)
    cuda_codegen.generate = generate
    try:
        yield seen
    finally:
        cuda_codegen.generate = original


def distinct(kernels, prefix="k"):
    """The kernels whose CUDA C differs (the text with the kernel's own name blanked), renamed
    <prefix><i> so they share a translation unit."""
    out, seen = [], set()
    for k in kernels:
        text = cuda_codegen.generate([dataclasses.replace(k, name="KERNEL")])[0]
        if text not in seen:
            seen.add(text)
            out.append(dataclasses.replace(k, name=f"{prefix}{len(out)}"))
    return out


def compile_and_check(kernels, archs=ARCHS) -> dict:
    """{arch: {kernel name: cubin.Resources}} for kernels already distinctly named (distinct());
    raises NvrtcError if one does not compile, LaunchResourceError if one would not launch."""
    from minicomp.backends.cuda import prelude_headers
    from minicomp.runtime import cubin, nvrtc
    source, launches = cuda_codegen.generate(kernels)

    def one(arch):
        binary = nvrtc.compile(source, arch, prelude_headers())
        assert binary.kind == "cubin", f"NVRTC gave {binary.kind} for {arch}"
        return cubin.check(binary.data, launches, arch)
    with ThreadPoolExecutor(len(archs)) as pool:  # NVRTC releases the GIL
        return dict(zip(archs, pool.map(one, archs)))
