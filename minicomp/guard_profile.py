"""Dynamo's guard profile, skipped in minicomp's compiles.

After Dynamo builds a frame's guards it times one evaluation of them (`profile_guard_manager`,
called by `CheckFunctionManager`): it first flushes the CPU caches, so the figure is a cold one,
and the figure only goes to Dynamo's debug log and compile metrics. The flush is a fixed cost of
every frame Dynamo compiles: 30-36 ms here, a fifth of a small function's whole compile (a public
OpInfo sample: 0.17-0.2 s with it, 0.14-0.15 s without) and as much again on each graph break's
frame. `unprofiled()` replaces it with a function that times nothing while `minicomp.compile`
compiles (api.py): Dynamo's log then says "Guard eval latency = 0.00 us". Overlapping compiles
from several threads share one replacement, and the last to finish puts Dynamo's back; a
`torch.compile` on another thread meanwhile skips it too (only its log line and metric differ). A
torch without the function compiles as it does.

`torch.compile(model, backend="minicomp")` is Dynamo's own call: it profiles its guards as usual.
"""
from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()
_state = {"depth": 0, "original": None}


def _no_profile(*args, **kwargs) -> float:
    return 0.0


@contextlib.contextmanager
def unprofiled():
    """Dynamo's compiles inside skip the guard profile (see the module note)."""
    from torch._dynamo import guards
    if not hasattr(guards, "profile_guard_manager"):
        yield
        return
    with _lock:
        if _state["depth"] == 0:
            _state["original"] = guards.profile_guard_manager
            guards.profile_guard_manager = _no_profile
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                guards.profile_guard_manager = _state["original"]
                _state["original"] = None
