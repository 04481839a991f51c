"""User options of `minicomp.compile`, resolved once, and every environment variable minicomp reads.

Nothing else in the package reads the environment: the compiler's options are fields of Options
(resolved by Options.make), and the settings of the runtime and the backends are the functions
below, read at each use (tests and users set them in a running process).

| variable | read by | meaning |
|---|---|---|
| `MINICOMP_DEBUG=1..4` | Options.debug_level | debug output by levels (1: summary, 2: IR after each pass, 3: kernels, 4: source) |
| `MINICOMP_DUMP_DIR=folder` | Options.dump_dir | one numbered folder per graph, one numbered file per stage |
| `MINICOMP_VERIFY=1` | Options.verify | verify the IR after every pass (on with any debug level) |
| `MINICOMP_PROFILE=1` | Options.profile | time every step of every program |
| `MINICOMP_CACHE_DIR=folder` | cache_dir() | the disk cache of compiled artifacts and lowered graphs |
| `XDG_CACHE_HOME=folder` | cache_dir() | without MINICOMP_CACHE_DIR: the cache is its `minicomp/` |
| `MINICOMP_CACHE_MAX_MB=n` | cache_max_bytes() | the disk cache's size limit (default 1024) |
| `MINICOMP_GRAPH_CACHE=0` | graph_cache() | turn off the cache of lowered graphs |
| `MINICOMP_COMPILE_WORKERS=n` | compile_workers() | LLVM compile worker processes (default: cores - 1, at most 3; 0: none) |
| `MINICOMP_OPENMP=0` | openmp() | split CPU kernels on minicomp's own thread pool, not torch's OpenMP threads |
| `MINICOMP_SM_COUNT=n` | sm_count() | plan CUDA launches for n streaming multiprocessors, not the current GPU's |
| `CXX` | cxx() | the host C++ compiler cuda_emu builds kernels with (default g++) |
| `CUDA_HOME`, `CUDA_PATH` | cuda_home() | a CUDA toolkit whose headers NVRTC may use, after the installed wheels' |
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Optional, Union

BACKENDS = ("auto", "interpret", "cpu", "cuda", "cuda_emu")


@dataclass(frozen=True)
class Options:
    backend: str = "auto"
    debug_level: int = 0            # 1: summary per graph, 2: + IR after each pass, 3: + kernel sources
    dump_dir: Optional[str] = None  # numbered files per graph and stage
    remat: bool = True
    cuda_graphs: bool = True
    strict: bool = False
    max_programs: int = 8           # programs per compiled callable before it runs eagerly
    verify: bool = False            # verify the IR after every pass (on in debug mode and in tests)
    recycle_outputs: bool = True    # CPU: reuse a big output's memory once the caller drops it
    remat_budget: Optional[float] = None  # training: saved activations at most this fraction of remat=False's
    profile: bool = False           # time every step of every program (MINICOMP_PROFILE=1; explain())
    dynamic: Union[bool, str] = "auto"  # "auto": static first, a changing size makes its dimension symbolic

    @staticmethod
    def checked(options: dict) -> dict:
        """A `torch.compile(..., options={...})` dict whose every key make() takes."""
        known = [k for k in inspect.signature(Options.make).parameters]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"minicomp: unknown option(s) {', '.join(map(repr, unknown))}; the options are "
                             f"{', '.join(known)}")
        return options

    @staticmethod
    def make(backend: str = "auto", debug: Union[bool, int, str] = False, remat: bool = True,
             cuda_graphs: bool = True, strict: bool = False, max_programs: int = 8,
             recycle_outputs: bool = True, remat_budget: Optional[float] = None,
             dynamic: Union[bool, str] = "auto") -> "Options":
        if backend not in BACKENDS:
            raise ValueError(f"minicomp: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        for name, value in (("remat", remat), ("cuda_graphs", cuda_graphs), ("strict", strict),
                            ("recycle_outputs", recycle_outputs)):
            if not isinstance(value, bool):
                raise ValueError(f"minicomp: {name}={value!r}: want True or False")
        if isinstance(max_programs, bool) or not isinstance(max_programs, int) or max_programs < 1:
            raise ValueError(f"minicomp: max_programs={max_programs!r}: want an int >= 1")
        if remat_budget is not None and (isinstance(remat_budget, bool) or not isinstance(remat_budget, (int, float))
                                         or not 0 < remat_budget <= 1):
            raise ValueError(f"minicomp: remat_budget={remat_budget!r}: want a fraction of remat=False's saved "
                             "bytes in (0, 1], or None")
        if dynamic not in (True, False, "auto"):
            raise ValueError(f"minicomp: dynamic={dynamic!r}: want \"auto\", True or False")
        if remat_budget is not None and not remat:
            raise ValueError("minicomp: remat_budget asks for rematerialization; it cannot go with remat=False")
        level = int(os.environ.get("MINICOMP_DEBUG", "0") or 0)
        dump_dir = os.environ.get("MINICOMP_DUMP_DIR") or None
        if isinstance(debug, str):
            dump_dir, level = debug, max(level, 1)
        elif debug is True:
            level = max(level, 1)
        elif isinstance(debug, int) and not isinstance(debug, bool):
            level = max(level, debug)
        verify = level > 0 or os.environ.get("MINICOMP_VERIFY", "") == "1"
        return Options(backend, level, dump_dir, remat, cuda_graphs, strict, max_programs, verify, recycle_outputs,
                       None if remat_budget is None else float(remat_budget),
                       os.environ.get("MINICOMP_PROFILE", "") == "1", dynamic)


DEFAULT_CACHE_MAX_MB = 1024


def cache_dir() -> str:
    """$MINICOMP_CACHE_DIR, else $XDG_CACHE_HOME/minicomp, else ~/.cache/minicomp."""
    d = os.environ.get("MINICOMP_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "minicomp")
    return d


def cache_max_bytes() -> int:
    """The disk cache's limit: $MINICOMP_CACHE_MAX_MB megabytes (a value that is not a number: the default)."""
    try:
        return int(float(os.environ.get("MINICOMP_CACHE_MAX_MB", DEFAULT_CACHE_MAX_MB)) * (1 << 20))
    except ValueError:
        return DEFAULT_CACHE_MAX_MB << 20


def graph_cache() -> bool:
    """Whether lowered graphs are cached on disk (MINICOMP_GRAPH_CACHE=0 turns it off)."""
    return os.environ.get("MINICOMP_GRAPH_CACHE", "1") != "0"


def openmp() -> bool:
    """Whether split CPU kernels may run on torch's OpenMP threads (MINICOMP_OPENMP=0: never)."""
    return os.environ.get("MINICOMP_OPENMP", "1") != "0"


def compile_workers():
    """$MINICOMP_COMPILE_WORKERS as an int (0: LLVM only in process), or None when unset or not a number."""
    try:
        return max(0, int(os.environ["MINICOMP_COMPILE_WORKERS"]))
    except (KeyError, ValueError):
        return None


def sm_count():
    """$MINICOMP_SM_COUNT as an int, or None when unset."""
    value = os.environ.get("MINICOMP_SM_COUNT")
    return int(value) if value else None


def cxx() -> str:
    """The host C++ compiler: $CXX, else g++."""
    return os.environ.get("CXX", "g++")


def cuda_home():
    """$CUDA_HOME, else $CUDA_PATH, else None."""
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or None
