"""Huge-page advice for big fresh CPU buffers (runtime/pages.py): the tensor is torch's own (same
memory, values, resizable, freed as usual), small ones are left alone, and without madvise nothing
changes; a compiled program's big fresh outputs go through it and still match eager."""
from __future__ import annotations

import torch

import minicomp
from minicomp.runtime import pages


def test_advice_keeps_the_tensor_as_it_is():
    t = torch.empty(3 << 20)  # 12 MiB
    ptr = t.data_ptr()
    u = pages.advise_huge(t)
    assert u is t and u.data_ptr() == ptr
    u.fill_(2.5)
    assert torch.equal(u, torch.full_like(u, 2.5))
    u.resize_(4 << 20)  # a tensor of torch's allocator: resizable like any other
    assert u.numel() == 4 << 20
    small = torch.empty(16)
    assert pages.advise_huge(small) is small


def test_without_madvise_nothing_changes(monkeypatch):
    monkeypatch.setattr(pages, "_MADVISE", None)
    t = torch.empty(3 << 20)
    assert pages.advise_huge(t) is t


def test_calls_ask_for_the_big_fresh_outputs(monkeypatch):
    asked = []
    real = pages._MADVISE

    def spy(addr, length, advice):
        asked.append((addr, length, advice))
        return real(addr, length, advice) if real is not None else 0
    monkeypatch.setattr(pages, "_MADVISE", spy)
    x = torch.randn(4 << 20)  # 16 MiB in, 16 MiB out
    f = minicomp.compile(lambda x: torch.cos(x) * 2, backend="cpu", recycle_outputs=False)
    for _ in range(2):
        torch.testing.assert_close(f(x), torch.cos(x) * 2)
    assert asked and all(advice == pages.MADV_HUGEPAGE and length % pages.HUGE_PAGE == 0 for _, length, advice in asked)
