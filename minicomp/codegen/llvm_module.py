"""A graph's kernels as LLVM modules: one (generate_module), or several of about equal work to
compile side by side (generate_modules, runtime/jit_pool.py). Kernels with one body_key -- the same
layer repeated -- share one <name>_body and its entry point, so each loop nest is compiled once: the
other kernels' entries are aliases of the first one's (a symbol in the object code, no function).
"""
from __future__ import annotations

import re

from llvmlite import ir

from ..ir.kernel import Kernel, KernelPrinter
from .collapse import collapse
from .llvm import KernelCodegen

BODY_DEFINITION = re.compile(r'^define internal void @"[^"]*_body"', re.M)  # one per distinct body (body_key)


def body_key(k: Kernel, whole: bool) -> str:
    """What a collapsed kernel's <name>_body is made of: its domain, buffer types and body text
    (ir/kernel.py; buffers by position, values numbered within the kernel, so the name and the
    graph values it reads are not in it) and whether it runs whole (constant bounds). Kernels with
    one key get one body: the same layer repeated compiles its loop nests once."""
    head = [f"outer {[(v.name, v.size) for v in k.outer]} inner {[(v.name, v.size) for v in k.inner]} whole={whole}",
            "buffers " + " ".join(f"{b.dtype}[{b.numel}]" for b in k.buffers)]
    return "\n".join(head + KernelPrinter(k).body(None, head=False))


def generate_module(kernels, name: str = "minicomp", whole=lambda k: False,
                    sized: bool = False) -> tuple[str, list[Kernel]]:
    """LLVM IR text for all kernels of a graph; returns (text, the collapsed kernels). `whole(k)` says
    whether the runtime always calls collapsed kernel k over its whole outer range (never split:
    its body gets constant bounds); `sized`: a program over symbolic sizes (none is whole: its
    launch modes are decided per call size). Kernels with one body_key share one <name>_body."""
    texts, out = generate_modules(kernels, 1, name, whole, sized)
    return texts[0], out


def generate_modules(kernels, parts: int, name: str = "minicomp", whole=lambda k: False,
                     sized: bool = False, min_bodies: int = 1,
                     on_text=None) -> tuple[list[str], list[Kernel]]:
    """generate_module's kernels in at most `parts` modules of about equal work, to compile side by
    side (runtime/jit_pool.py), and at most one module per `min_bodies` distinct bodies: kernels that
    share a body go to one module, the bodies' sizes (their text) are balanced largest first. Returns
    (texts, the collapsed kernels in the order given). The modules are generated last first, each
    handed to `on_text(index, text)` when done: the caller can start compiling one while the next
    is generated."""
    items = []
    for k in kernels:
        k = collapse(k)
        w = not sized and whole(k)
        items.append((k, w, body_key(k, w)))
    cost = {key: len(key) for _, _, key in items}  # a kernel sharing a body costs LLVM no more than an alias
    bins = [[0, set()] for _ in range(max(1, min(parts, len(cost) // max(1, min_bodies))))]
    for key in sorted(cost, key=lambda key: -cost[key]):
        lightest = min(bins, key=lambda b: b[0])
        lightest[0] += cost[key]
        lightest[1].add(key)
    texts: list = [None] * len(bins)
    for i in reversed(range(len(bins))):
        module, entries, aliases = ir.Module(name), {}, []
        for k, w, key in items:
            if key not in bins[i][1]:
                continue
            if key in entries:
                aliases.append(f'@"{k.name}" = alias void (ptr, i64, i64), ptr @"{entries[key]}"\n')
            else:
                KernelCodegen(module, k, w).generate()
                entries[key] = k.name
        texts[i] = str(module) + "\n" + "".join(aliases)
        if on_text is not None:
            on_text(i, texts[i])
    return texts, [k for k, _, _ in items]

