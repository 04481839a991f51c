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

    @staticmethod
    def make(backend: str = "auto", debug: Union[bool, int, str] = False, remat: bool = True,
             cuda_graphs: bool = True, strict: bool = False, max_programs: int = 8,
             recycle_outputs: bool = True) -> "Options":
        if backend not in BACKENDS:
            raise ValueError(f"minicomp: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        level = int(os.environ.get("MINICOMP_DEBUG", "0") or 0)
        dump_dir = os.environ.get("MINICOMP_DUMP_DIR") or None
        if isinstance(debug, str):
            dump_dir, level = debug, max(level, 1)
        elif debug is True:
            level = max(level, 1)
        elif isinstance(debug, int) and not isinstance(debug, bool):
            level = max(level, debug)
        verify = level > 0 or os.environ.get("MINICOMP_VERIFY", "") == "1"
        return Options(backend, level, dump_dir, remat, cuda_graphs, strict, max_programs, verify, recycle_outputs)
