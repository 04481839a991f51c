"""The backward's order: where each recomputed value, and each torch op that reads one, runs.

The scheduler (compiler/schedule.py) groups values into kernels in graph order, and a stored value
can only join a kernel that is already there. A recomputed forward value that the backward reads
from memory (a torch op's operand, such as the SwiGLU product a weight-gradient matmul reads)
therefore fuses only if a kernel that reads what its recomputation reads exists when it is
placed. Usually that is the backward kernel of the same op: silu's backward reads the gate and up
projections too. In the order AOTAutograd traces, the weight-gradient matmul often comes first
(autograd's mm backward computes the weight gradient before the input gradient), so the
recomputation would run alone.

So each torch op that reads a recomputed value waits for its *siblings*: the later backward nodes
that read the same saved values or recomputed values and do not depend on that op. Then each
recomputed value runs just before its first user. Moving a node past nodes that do not depend on
it keeps every dependency; only lifetimes change (a weight gradient is written a little later).
Parameters do not make siblings: a tied weight is read by backward nodes layers apart.

Both the IR backward (partition.py's fusion check) and the fx backward that is compiled
(training.py) use this, so they see one order.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable


def fusion_order(nodes: list, args_of: Callable[[object], Iterable], recomputed: set,
                 deferrable: Callable[[object], bool], shared: Callable[[object], bool]) -> list:
    """`nodes` in a valid order; `args_of(n)` are n's inputs (those outside `nodes` are ignored);
    `recomputed` holds the nodes that compute forward values again; `deferrable(n)` says n is a
    torch op that may wait for its siblings; `shared(n)` says readers of n count as siblings (a
    saved activation, not a parameter). Returns `nodes` in the new order."""
    pos = {n: i for i, n in enumerate(nodes)}
    args = {n: [a for a in dict.fromkeys(args_of(n)) if a in pos] for n in nodes}
    users: dict = {n: [] for n in nodes}
    for n in nodes:
        for a in args[n]:
            users[a].append(n)
    key = {n: float(pos[n]) for n in nodes if n not in recomputed}
    for u in nodes:
        if u in recomputed or not deferrable(u):
            continue
        reads = _recomputation_reads(u, args, recomputed, shared)
        if not reads:
            continue
        after = _descendants(u, users)
        siblings = [pos[s] for r in reads for s in users[r]
                    if s not in recomputed and s not in after and pos[s] > pos[u] and not deferrable(s)]
        if siblings:
            key[u] = max(siblings) + 0.5
    for r in reversed(nodes):  # users first (a valid order): a chain gets keys just below its first user
        if r in recomputed:
            key[r] = min((key[x] for x in users[r]), default=float(pos[r])) - 1e-6
    waiting = {n: len(args[n]) for n in nodes}
    ready = [(key[n], pos[n]) for n in nodes if not waiting[n]]
    heapq.heapify(ready)
    order = []
    while ready:
        n = nodes[heapq.heappop(ready)[1]]
        order.append(n)
        for u in users[n]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (key[u], pos[u]))
    assert len(order) == len(nodes), "fusion_order: the graph has a cycle"
    return order


def _recomputation_reads(u, args: dict, recomputed: set, shared) -> set:
    """The recomputed values u reads (through recomputed values) and the shared values they read."""
    seen, stack = set(), [a for a in args[u] if a in recomputed]
    while stack:
        a = stack.pop()
        if a in seen:
            continue
        seen.add(a)
        for b in args[a]:
            if b in recomputed:
                stack.append(b)
            elif shared(b):
                seen.add(b)
    return seen


def _descendants(u, users: dict) -> set:
    out, stack = set(), [u]
    while stack:
        for x in users[stack.pop()]:
            if x not in out:
                out.add(x)
                stack.append(x)
    return out
