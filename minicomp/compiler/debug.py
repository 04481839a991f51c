"""Debug output by levels (MINICOMP_DEBUG=1..3) and the dump folder (MINICOMP_DUMP_DIR or debug="path").

The dump folder gets one numbered folder per compiled graph, and inside it one numbered file per
stage: 00_fx.txt, 01_ir.txt, 02_ir_after_simplify_views.txt, ... and later kernel sources.
"""
from __future__ import annotations

import itertools
import os
import sys

_graph_counter = itertools.count()


class Dumper:
    def __init__(self, options, graph_name: str):
        self.level = options.debug_level
        self.dir = None
        self.step = itertools.count()
        self.graph_name = graph_name
        if options.dump_dir:
            self.dir = os.path.join(options.dump_dir, f"{next(_graph_counter):03d}_{graph_name}")
            os.makedirs(self.dir, exist_ok=True)

    def stage(self, name: str, text: str, level: int = 2) -> None:
        """Record one stage's text: printed at `level` and above, always written to the dump folder."""
        if self.level >= level:
            print(f"--- minicomp {self.graph_name}: {name} ---\n{text}", file=sys.stderr)
        if self.dir:
            with open(os.path.join(self.dir, f"{next(self.step):02d}_{name}.txt"), "w") as f:
                f.write(text)

    def summary(self, text: str) -> None:
        if self.level >= 1:
            print(f"minicomp: {text}", file=sys.stderr)
