"""Memory: a compiled callable's arena and machine code go when it goes (Dynamo keeps what it
compiled alive; CompiledModule releases its programs), many calls do not grow the process, and a
compiled call holds no more memory at its peak than eager does."""
from __future__ import annotations

import ctypes
import gc
import weakref

import pytest
import torch

import minicomp
from minicomp.models import Block
from minicomp.timing import peak_bytes
from tests.e2e.models import ZOO


def _trim() -> None:
    """Hand free heap memory back to the OS (glibc): after a long run of tests a freed block may sit in a
    heap rather than its own mapping, and only a trim shows its release in RSS."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _executors(compiled) -> list:
    runs = compiled._report.runs
    assert runs, "the compiled callable built no program"
    return [ex for run in runs for ex in getattr(run, "_first", []) + getattr(run, "_idle", [])]


def _wide(x, w):  # intermediates the size of x, read by matmuls: the arena holds them
    a = torch.sin(x) @ w
    b = torch.cos(a) @ w
    return (b.exp() @ w).sum()


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity"), reason="reads /proc")
def test_deleted_callable_frees_its_arena_and_code():
    # 48 MiB intermediates: above glibc's largest mmap threshold, so freeing them shows in RSS
    x, w = torch.randn(196608, 64), torch.randn(64, 64) * 0.1
    compiled = minicomp.compile(_wide, backend="cpu")
    torch.testing.assert_close(compiled(x, w), _wide(x, w), rtol=1e-4, atol=1e-2)
    runs = list(compiled._report.runs)
    arenas = [weakref.ref(ex.arena) for ex in _executors(compiled) if ex.arena is not None]
    arena_bytes = sum(r.arena_bytes for r in runs)
    assert arenas and arena_bytes >= 32 << 20, "the test needs an arena worth measuring"
    gc.collect()
    _trim()
    before = _rss()
    del compiled
    gc.collect()
    _trim()
    assert all(a() is None for a in arenas), "an arena outlived its compiled callable"
    assert all(r.keepalive is None and not r.steps for r in runs), "machine code outlived its callable"
    freed = before - _rss()
    print(f"\nmemory: deleting the callable freed {freed / 2**20:.1f} MiB of RSS; its arenas held {arena_bytes / 2**20:.1f} MiB")
    assert freed >= 0.75 * arena_bytes, f"RSS fell by {freed} bytes, the arena was {arena_bytes}"
    with pytest.raises(RuntimeError, match="released"):
        runs[0](x, w)


def test_many_calls_do_not_grow_the_process():
    block = Block(64, 4, 32).eval()
    compiled = minicomp.compile(block, backend="cpu")
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        want = block(x)
        for _ in range(200):  # warm: allocator pools, recycled outputs
            out = compiled(x)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        gc.collect()
        start = _rss()
        for _ in range(10_000):
            out = compiled(x)
        gc.collect()
        grown = _rss() - start
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    # 10,000 calls leaking one 2x16x64 f32 output each would be 80 MB; allow allocator noise only
    print(f"\nmemory: RSS grew by {grown / 2**20:.2f} MiB over 10,000 inference calls")
    assert grown < 4 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 10,000 calls"


def test_training_calls_do_not_grow_the_process():
    block = Block(32, 4, 8)
    compiled = minicomp.compile(block, backend="cpu")
    x = torch.randn(2, 8, 32)
    for _ in range(50):
        compiled(x).sum().backward()
    gc.collect()
    start = _rss()
    for _ in range(1000):
        compiled(x).sum().backward()
    gc.collect()
    grown = _rss() - start
    print(f"\nmemory: RSS grew by {grown / 2**20:.2f} MiB over 1,000 training steps")
    assert grown < 4 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 1,000 training steps"


def test_peak_bytes_sees_what_a_call_holds():
    x = torch.randn(256, 1024)
    peak = peak_bytes(lambda: (x * 2 + 1).sum())  # x * 2 and its + 1 live at once: 2 x 1 MiB
    assert 2 * x.nbytes <= peak <= 3 * x.nbytes


@pytest.mark.parametrize("name", sorted(ZOO))
def test_compiled_peak_is_no_more_than_eager(name):
    model, inputs = ZOO[name]()
    model.eval()
    # fresh outputs, as eager's: a recycled output buffer would be memory the profiler never sees allocated
    compiled = minicomp.compile(model, backend="cpu", recycle_outputs=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-4)
        eager = peak_bytes(lambda: model(*inputs))
        ours = peak_bytes(lambda: compiled(*inputs))
    arena = sum(r.arena_bytes for r in compiled._report.runs)
    # fused intermediates never exist and each torch result is dropped after its last use, so a call
    # holds no more than eager's; the arena is held between calls as well (at these sizes, a few KiB,
    # a row of statistics is a sizable share of it)
    assert ours <= eager, f"compiled holds {ours} bytes at its peak (arena {arena} besides), eager {eager}"
    assert ours + arena <= 1.5 * eager, f"compiled holds {ours} + arena {arena} bytes at its peak, eager {eager}"


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_backward_outlives_its_callable_and_its_memory_does_not(backend):
    """A deleted callable releases its programs, its backward's among them once a backward() has
    compiled it; an autograd graph a forward made before may still call it. Its executors (arena,
    recycled outputs) are freed with the callable, its code is kept, and the backward still gives
    eager's gradients -- once compiled after a temporary callable is gone, once after `del`."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True)
    want = torch.autograd.grad(torch.nn.functional.gelu(lin(x)).sum(), (x, lin.weight))
    fn = lambda a: torch.nn.functional.gelu(lin(a))  # noqa: E731
    got = torch.autograd.grad(minicomp.compile(fn, backend=backend)(x).sum(), (x, lin.weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    compiled = minicomp.compile(fn, backend=backend)
    torch.autograd.grad(compiled(x).sum(), (x, lin.weight))  # compiles the backward
    out = compiled(x)
    runs = list(compiled._report.runs)
    backward = [r for r in runs if getattr(r, "called_by_autograd", False)]
    assert len(runs) == 2 and len(backward) == 1
    del compiled
    gc.collect()
    assert not backward[0]._first and not backward[0]._idle  # its memory went with the callable
    assert all(r.keepalive is None for r in runs if r not in backward)  # the forward's code too
    got = torch.autograd.grad(out.sum(), (x, lin.weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
