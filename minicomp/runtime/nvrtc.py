"""NVRTC: CUDA C source -> CUBIN for the exact GPU (or PTX for the driver to JIT), cached on disk.

`compile(source, arch, headers, driver)` asks for `-arch=sm_XX` and returns the CUBIN. When this
NVRTC cannot target sm_XX (a GPU newer than it), it compiles for the newest virtual architecture it
has and returns PTX instead. Which one also depends on the driver (`target`): a driver of an older
major CUDA version than NVRTC's loads neither; one of the same major but an older minor loads the
CUBIN (minor version compatibility) but cannot JIT the newer PTX -- a clear error then, not a
failure at module load. cuda_fp16.h and cuda_bf16.h come from the folder whose headers match this
NVRTC's version (the nvidia-cuda-runtime wheel of the same CUDA, or $CUDA_HOME). A compile error
raises with the NVRTC log and the numbered source. No GPU is needed.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from .. import options
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


def _pair(v) -> tuple:
    """'13.5' or (13, 5) -> (13, 5); a driver's 12040 -> (12, 4)."""
    if isinstance(v, int):
        return v // 1000, v % 1000 // 10
    return tuple(int(p) for p in v.split(".")[:2]) if isinstance(v, str) else tuple(v)


def header_version(folder: str):
    """(major, minor) of the CUDA headers in `folder`, from CUDART_VERSION or CUDA_VERSION; None if unknown."""
    for name, macro in (("cuda_runtime_api.h", "CUDART_VERSION"), ("cuda.h", "CUDA_VERSION")):
        try:
            with open(os.path.join(folder, name)) as f:
                m = re.search(rf"#define\s+{macro}\s+(\d+)", f.read())
        except OSError:
            continue
        if m:
            return _pair(int(m.group(1)))
    return None


def candidate_dirs() -> list[str]:
    """Folders holding cuda_fp16.h: the installed nvidia wheels (any CUDA major), then $CUDA_HOME."""
    found = []
    try:
        import nvidia
        for root in nvidia.__path__:
            found += [os.path.dirname(p) for p in sorted(glob.glob(os.path.join(root, "*", "include", "cuda_fp16.h")))]
    except ImportError:
        pass
    home = options.cuda_home()
    if home and os.path.exists(os.path.join(home, "include", "cuda_fp16.h")):
        found.append(os.path.join(home, "include"))
    return found


def pick_include(candidates: list[str], want) -> str:
    """The folder whose headers are NVRTC `want`'s version: the same major and minor, else the same
    major's newest minor not above it, else the same major's oldest; never another major."""
    want = _pair(want)
    if not candidates:
        raise NvrtcError("nvrtc: cuda_fp16.h not found; install nvidia-cuda-runtime (pip) or set CUDA_HOME")
    versions = {d: header_version(d) for d in candidates}
    same = sorted((v, d) for d, v in versions.items() if v is not None and v[0] == want[0])
    if not same:
        seen = ", ".join(f"{d} ({'.'.join(map(str, v)) if v else 'version unknown'})" for d, v in versions.items())
        raise NvrtcError(f"nvrtc: NVRTC is CUDA {want[0]}.{want[1]} but no CUDA {want[0]} headers were found "
                         f"(found {seen}); install nvidia-cuda-runtime for CUDA {want[0]} or set CUDA_HOME")
    below = [(v, d) for v, d in same if v <= want]
    return (below[-1] if below else same[0])[1]


def include_dirs() -> list[str]:
    return [pick_include(candidate_dirs(), version())]


def target(arch: str, driver=None) -> tuple[str, str]:
    """('-arch=...' value, kind) for a GPU of compute capability `arch` (e.g. 'sm_90') under a
    driver of CUDA version `driver` (cuDriverGetVersion's 12040, or '12.4'; None: not checked)."""
    have = _check(_nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return choose_target(arch, list(have), _pair(version()), None if driver is None else _pair(driver))


def choose_target(arch: str, have: list, nvrtc: tuple, driver: tuple | None) -> tuple[str, str]:
    want, n = int(arch.removeprefix("sm_")), ".".join(map(str, nvrtc))
    if driver is not None and driver[0] < nvrtc[0]:
        d = ".".join(map(str, driver))
        raise NvrtcError(f"nvrtc: the driver supports CUDA {d}, older than this NVRTC's major version ({n}): "
                         f"nothing it compiles would load. Update the driver, or install NVRTC for CUDA {driver[0]} "
                         f"(nvidia-cuda-nvrtc and cuda-bindings {driver[0]}.x)")
    if want in have:
        return f"sm_{want}", "cubin"  # loads on any driver of NVRTC's major version
    older = [a for a in have if a <= want]
    if not older:
        raise NvrtcError(f"nvrtc: the GPU ({arch}) is older than anything NVRTC {n} targets (sm_{min(have)} "
                         "and up); install an older NVRTC")
    if driver is not None and driver < nvrtc:
        d = ".".join(map(str, driver))
        raise NvrtcError(f"nvrtc: NVRTC {n} has no CUBIN target for the GPU ({arch}), and the PTX it would make "
                         f"instead needs a driver of CUDA {n} or newer to compile; this one is CUDA {d}. Update "
                         "the driver or install an NVRTC that targets " + arch)
    return f"compute_{max(older)}", "ptx"


def numbered(source: str) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(source.splitlines(), 1))


def compile(source: str, arch: str = "sm_90", headers: dict | None = None, name: str = "minicomp.cu",
            driver=None) -> Binary:
    """`headers`: include name -> text, for the files `source` includes (the prelude); `driver`: the
    CUDA version of the driver that will load the result (see `target`)."""
    nv = _nvrtc()
    headers = headers or {}
    arch_opt, kind = target(arch, driver)
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
