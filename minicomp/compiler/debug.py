"""Debug output by levels (MINICOMP_DEBUG=1..3) and the dump folder (MINICOMP_DUMP_DIR or debug="path").

The dump folder gets one numbered folder per compiled graph (000_forward_0, 001_backward_1, ...,
numbered from what the folder already holds), and inside it one numbered file per stage: 00_fx.txt,
01_ir.txt, 02_ir_after_simplify_views.txt, ... and later kernel sources. The IR files parse back
with `minicomp.ir.parse`.
"""
from __future__ import annotations

import itertools
import logging
import os
import re
import sys
import time

log = logging.getLogger("minicomp")
PROGRESS_AFTER_S = 2.0  # a compile running longer logs each stage as it finishes


def _next_number(folder: str) -> int:
    taken = [int(m.group(1)) for d in os.listdir(folder) if (m := re.match(r"(\d+)_", d))]
    return max(taken, default=-1) + 1


class Dumper:
    def __init__(self, options, graph_name: str):
        self.level = options.debug_level
        self.dir = None
        self.step = itertools.count()
        self.graph_name = graph_name
        if options.dump_dir:
            os.makedirs(options.dump_dir, exist_ok=True)
            self.dir = os.path.join(options.dump_dir, f"{_next_number(options.dump_dir):03d}_{graph_name}")
            os.makedirs(self.dir, exist_ok=True)

    def stage(self, name: str, text, level: int = 2) -> None:
        """Record one stage's text (a string, or a function that makes it: only called when the
        stage is printed, at `level` and above, or written to the dump folder, always)."""
        if self.level < level and not self.dir:
            return
        if callable(text):
            text = text()
        if self.level >= level:
            print(f"--- minicomp {self.graph_name}: {name} ---\n{text}", file=sys.stderr)
        if self.dir:
            with open(os.path.join(self.dir, f"{next(self.step):02d}_{name}.txt"), "w") as f:
                f.write(text)

    def summary(self, text: str) -> None:
        if self.level >= 1:
            print(f"minicomp: {text}", file=sys.stderr)


class Progress:
    """A long compile's stages on the `minicomp` logger (INFO) as they finish, once it has run for
    PROGRESS_AFTER_S: a user who enables logging sees where a slow compile is, not silence."""

    def __init__(self, name: str):
        self.name, self.t0 = name, time.perf_counter()

    def __call__(self, what: str) -> None:
        elapsed = time.perf_counter() - self.t0
        if elapsed >= PROGRESS_AFTER_S:
            log.info("compiling %s: %s (%.1f s so far)", self.name, what, elapsed)
