"""NVRTC: CUDA C source -> CUBIN for the exact GPU (or PTX for the driver to JIT), cached on disk.

`compile(source, arch, headers)` asks for `-arch=sm_XX` and returns the CUBIN. When this NVRTC
cannot target sm_XX (a GPU newer than it), it compiles for the newest virtual architecture it has
and returns PTX instead. cuda_fp16.h and cuda_bf16.h come from the nvidia-cuda-runtime wheel (or
$CUDA_HOME). A compile error raises with the NVRTC log and the numbered source. No GPU is needed.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from ..errors import MinicompError
from . import cache

VERSION = "minicomp-nvrtc-2"
OPTIONS = ("-std=c++17", "-default-device", "--fmad=true")


class NvrtcError(MinicompError):
    pass


@dataclass(frozen=True)
class Binary:
    kind: str   # "cubin" | "ptx"
    arch: str   # what it was compiled for: sm_90, or compute_90 for PTX
    data: bytes


def _nvrtc():
    from cuda.bindings import nvrtc  # the [cuda] extras
    return nvrtc


def _check(result, what: str):
    """cuda-bindings calls return (error, *values): raise on an error, else the value(s)."""
    err, *rest = result
    if int(err) != 0:
        raise NvrtcError(f"nvrtc: {what} failed: {_nvrtc().nvrtcGetErrorString(err)[1].decode()}")
    return rest[0] if len(rest) == 1 else (rest or None)


def version() -> str:
    major, minor = _check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return f"{major}.{minor}"


def include_dirs() -> list[str]:
    """Folders holding cuda_fp16.h: the installed nvidia wheels (any CUDA major), then $CUDA_HOME."""
    found = []
    try:
        import nvidia
        for root in nvidia.__path__:
            found += [os.path.dirname(p) for p in sorted(glob.glob(os.path.join(root, "*", "include", "cuda_fp16.h")))]
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "include", "cuda_fp16.h")):
        found.append(os.path.join(home, "include"))
    if not found:
        raise NvrtcError("nvrtc: cuda_fp16.h not found; install nvidia-cuda-runtime (pip) or set CUDA_HOME")
    return found[:1]


def target(arch: str) -> tuple[str, str]:
    """('-arch=...' value, kind) for a GPU of compute capability `arch` (e.g. 'sm_90')."""
    want = int(arch.removeprefix("sm_"))
    have = _check(_nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    if want in have:
        return f"sm_{want}", "cubin"
    older = [a for a in have if a <= want]
    return f"compute_{max(older) if older else min(have)}", "ptx"


def numbered(source: str) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(source.splitlines(), 1))


def compile(source: str, arch: str = "sm_90", headers: dict | None = None, name: str = "minicomp.cu") -> Binary:
    """`headers`: include name -> text, for the files `source` includes (the prelude)."""
    nv = _nvrtc()
    headers = headers or {}
    arch_opt, kind = target(arch)
    options = [f"-arch={arch_opt}", *OPTIONS, *(f"-I{d}" for d in include_dirs())]
    key = cache.key(VERSION, version(), " ".join(options[:-1]),  # not the include folder: a machine's path
                    *[f"{n}\0{t}" for n, t in sorted(headers.items())], source)
    hit = cache.get("nvrtc", key)
    if hit is not None:
        return Binary(kind, arch_opt, hit)
    names = sorted(headers)
    prog = _check(nv.nvrtcCreateProgram(source.encode(), name.encode(), len(names),
                                        [headers[n].encode() for n in names], [n.encode() for n in names]),
                  "nvrtcCreateProgram")
    try:
        err, = nv.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        size = _check(nv.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = b" " * size
        _check(nv.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        if int(err) != 0:
            log = log.decode(errors="replace").rstrip("\0")
            raise NvrtcError(f"nvrtc could not compile {name} for {arch_opt}:\n{log}\nsource:\n{numbered(source)}")
        get_size, get = ((nv.nvrtcGetCUBINSize, nv.nvrtcGetCUBIN) if kind == "cubin"
                         else (nv.nvrtcGetPTXSize, nv.nvrtcGetPTX))
        data = b" " * _check(get_size(prog), f"sizing the {kind}")
        _check(get(prog, data), f"getting the {kind}")
    finally:
        nv.nvrtcDestroyProgram(prog)
    cache.put("nvrtc", key, data)
    return Binary(kind, arch_opt, data)
