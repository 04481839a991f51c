"""User options of `minicomp.compile`, resolved once (environment variables included)."""
from __future__ import annotations

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

    @staticmethod
    def make(backend: str = "auto", debug: Union[bool, int, str] = False, remat: bool = True,
             cuda_graphs: bool = True, strict: bool = False, max_programs: int = 8,
             recycle_outputs: bool = True, remat_budget: Optional[float] = None) -> "Options":
        if backend not in BACKENDS:
            raise ValueError(f"minicomp: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if remat_budget is not None and (isinstance(remat_budget, bool) or not isinstance(remat_budget, (int, float))
                                         or not 0 < remat_budget <= 1):
            raise ValueError(f"minicomp: remat_budget={remat_budget!r}: want a fraction of remat=False's saved "
                             "bytes in (0, 1], or None")
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
                       os.environ.get("MINICOMP_PROFILE", "") == "1")
