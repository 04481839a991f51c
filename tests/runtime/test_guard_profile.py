"""guard_profile.py: minicomp.compile's compiles skip Dynamo's guard profile and put it back."""
from __future__ import annotations

import threading

import torch

import minicomp

from ..helpers import assert_matches_eager


def test_compiles_skip_dynamos_guard_profile_and_put_it_back(monkeypatch):
    """minicomp.compile's compiles skip the cache flush Dynamo times its guards after (guard_profile.py),
    graph-break frames included; compiles from several threads at once leave Dynamo's function in place
    after, and torch.compile's own compiles still call it."""
    from torch._dynamo import guards
    calls = []

    def profile(*args):
        calls.append(args)
        return 1.0
    monkeypatch.setattr(guards, "profile_guard_manager", profile)

    def broken(x):
        y = torch.sin(x) + 1
        torch._dynamo.graph_break()
        return y * 2
    x = torch.randn(8)
    assert_matches_eager(broken, x)
    errors = []

    def compile_one(i):
        try:
            torch.testing.assert_close(minicomp.compile(lambda a: a.exp() * i)(x), x.exp() * i)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)
    threads = [threading.Thread(target=compile_one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert calls == [] and guards.profile_guard_manager is profile
    torch._dynamo.reset()
    torch.compile(lambda a: a.cos(), backend="eager")(x)
    assert len(calls) == 1
