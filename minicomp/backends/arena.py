"""The arena: intermediates written by kernels share one block of memory, reused by liveness.

Assumes: a fused graph (kernel nodes whose results are picked by getitem) with concrete sizes.
Guarantees: every kernel result that is not a graph output gets node.meta['arena_offset'] (64-byte
aligned) such that no two values live at the same time overlap; the arena's size is the peak
intermediate bytes. Graph outputs, and the kernel results a graph output views (a reshaped activation
saved for the backward), are fresh tensors each call: the caller keeps them, so they never live in
the arena (an output viewing the arena would have to be copied out every call). The plan_memory
pass runs it on a static graph; a program over symbolic sizes runs it on each size's concrete copy
(sized.py).
"""
from __future__ import annotations

from ..ir import Graph
from ..ir.types import itemsize

ALIGN = 64
ALIASING = ("reshape", "permute", "expand", "slice", "extern", "getitem")


def _alias_roots(node):
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        if n.op in ALIASING and not (n.op == "getitem" and n.args[0].op == "kernel"):
            stack.extend(n.args)
    return out


def _coalesce(blocks: list) -> list:
    """Free blocks sorted by offset, neighbours merged (two freed halves hold a value twice their size)."""
    out: list = []
    for off, size in sorted(blocks):
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((off, size))
    return out


def plan(graph: Graph) -> int:
    """Give every kernel result that is not a graph output its node.meta['arena_offset']; returns
    the arena's size in bytes. The graph's sizes must be concrete."""
    outputs = {o for o in graph.outputs if o is not None}
    last_use = {}
    for i, n in enumerate(graph.nodes):
        for a in n.args:
            last_use[a] = i
    # a torch view (or an extern, which may return a view) keeps its operands' memory alive
    for n in reversed(graph.nodes):
        if n.op in ALIASING and n in last_use:
            for a in n.args:
                last_use[a] = max(last_use.get(a, 0), last_use[n])
    handed_out = {a for o in outputs for a in _alias_roots(o)}  # outputs and what they view
    results: dict = {}
    for n in graph.nodes:
        if n.op == "getitem" and n.args[0].op == "kernel" and n not in handed_out:
            results.setdefault(n.args[0], []).append(n)
    free: list[tuple[int, int]] = []       # (offset, size) blocks free for reuse, coalesced
    live: list[tuple[int, int, int]] = []  # (last use, offset, size)
    top = 0
    for i, n in enumerate(graph.nodes):
        if n not in results:
            continue
        still = []
        for end, off, size in live:  # values last read before this kernel runs are free
            (free.append((off, size)) if end < i else still.append((end, off, size)))
        live = still
        for r in results[n]:
            free = _coalesce(free)
            size = (max(1, r.type.numel) * itemsize(r.type.dtype) + ALIGN - 1) // ALIGN * ALIGN
            fits = [b for b in free if b[1] >= size]
            if fits:  # best fit: the smallest free block that holds it
                off, fsize = min(fits, key=lambda b: (b[1], b[0]))
                free.remove((off, fsize))
                if fsize > size:
                    free.append((off + size, fsize - size))
            elif free and free[-1][0] + free[-1][1] == top:  # the free block at the top, grown
                off = free.pop()[0]
                top = off + size
            else:
                off = top
                top += size
            r.meta["arena_offset"] = off
            live.append((max(last_use.get(r, i), i), off, size))
    return top
