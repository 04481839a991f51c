"""A compiled callable called from many threads at once gives eager's results on every call: each
call in flight has its own arena, pointer tables and recycled outputs (runtime/program.py), and
threads racing on a new signature compile it once."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.models import Block

THREADS, CALLS = 8, 200


def _hammer(fn, make_inputs, check, calls=CALLS, threads=THREADS):
    """Run fn from `threads` threads, `calls` times each, every call on inputs of its own; returns
    the errors (one string per wrong or failed call)."""
    errors, start = [], threading.Barrier(threads)

    def work(t):
        gen = torch.Generator().manual_seed(t)
        start.wait()
        for i in range(calls):
            inputs = make_inputs(gen)
            try:
                msg = check(fn, inputs)
            except Exception as e:  # noqa: BLE001 - every failure is a finding
                msg = f"{type(e).__name__}: {e}"
            if msg:
                errors.append(f"thread {t} call {i}: {msg}")
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return errors


def _same(got, want, tol=1e-5):
    got, want = (got if isinstance(got, (list, tuple)) else [got]), (want if isinstance(want, (list, tuple)) else [want])
    for g, w in zip(got, want, strict=True):
        if not torch.allclose(g, w, rtol=tol, atol=tol, equal_nan=True):
            return f"max error {(g - w).abs().max().item():.3g}"
    return None


def _pointwise(x):
    return torch.sigmoid(x) * torch.cos(x) + x  # 64k elements: big enough for the split kernels


def _softmax(x):
    return F.softmax(x * 0.5, dim=-1), x.amax(0)


CASES = {
    "pointwise": (_pointwise, lambda g: (torch.randn(256, 256, generator=g),)),
    "softmax": (_softmax, lambda g: (torch.randn(64, 300, generator=g),)),
    "index_checks": (lambda x, i: x[i] * 2, lambda g: (torch.randn(50, 8, generator=g), torch.randint(0, 50, (40,), generator=g))),
}


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_many_threads_one_compiled_function(case, backend):
    fn, make = CASES[case]
    compiled = minicomp.compile(fn, backend=backend)
    calls = CALLS if backend == "cpu" else 20  # the emulator runs a thread per CUDA thread
    errors = _hammer(compiled, make, lambda c, xs: _same(c(*xs), fn(*xs)), calls=calls)  # grad mode is per thread
    assert not errors, errors[:5]
    assert len(compiled.report().graphs) == 1, "threads racing on the first call compile once"


def test_many_threads_gpt_block_inference_and_training():
    torch.manual_seed(0)
    model = Block(32, 4, 16)
    compiled = minicomp.compile(model, backend="cpu")

    def infer(c, xs):
        with torch.no_grad():
            return _same(c(*xs), model(*xs), 1e-4)

    def train(c, xs):
        x, = xs
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        gc, = torch.autograd.grad((c(xc) ** 2).sum(), xc)
        ge, = torch.autograd.grad((model(xe) ** 2).sum(), xe)
        return _same(gc, ge, 1e-4)
    make = lambda g: (torch.randn(2, 16, 32, generator=g),)  # noqa: E731
    assert not _hammer(compiled, make, infer, calls=60)
    assert not _hammer(compiled, make, train, calls=30)


def test_index_errors_stay_with_the_call_that_made_them():
    """A failed check in one thread's call raises there, never in a call beside it."""
    compiled = minicomp.compile(lambda x, i: torch.index_select(x, 0, i) + 1, backend="cpu")
    x = torch.randn(1 << 15, 4)

    def check(c, xs):
        bad, = xs
        i = torch.tensor([5, 1 << 20]) if bad else torch.tensor([5, 7])
        try:
            out = c(x, i)
        except IndexError:
            return None if bad else "a good call raised"
        return "a bad call returned" if bad else _same(out, torch.index_select(x, 0, i) + 1)
    errors = _hammer(compiled, lambda g: (bool(torch.randint(0, 2, (), generator=g)),), check, calls=100)
    assert not errors, errors[:5]


def test_single_thread_calls_keep_the_fast_executor():
    """After a burst of concurrent calls, a lone caller still gets the primary executor (the one
    whose kernels take no arguments), and the pool holds the executors the burst needed."""
    from tests.runtime.test_program import _program_of
    compiled = minicomp.compile(_pointwise, backend="cpu")
    program = _program_of(compiled, torch.randn(256, 256))  # grad mode on, as in the worker threads
    assert not _hammer(compiled, CASES["pointwise"][1], lambda c, xs: _same(c(*xs), _pointwise(*xs)), calls=20)
    assert 1 < program._count <= THREADS
    assert program._first and program._first[0].is_primary and len(program._idle) == program._count - 1
    ex = program._checkout()
    assert ex.is_primary
    program._checkin(ex)
