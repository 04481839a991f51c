"""runtime/program.py: big CPU outputs reuse the memory of outputs the caller has dropped, and never
the memory of one that anything still references (a tensor, a view, a storage, an autograd save)."""
from __future__ import annotations

import torch

import minicomp
from minicomp.runtime.program import RECYCLE_KEEP, RECYCLE_MIN_BYTES, Recycler

N = RECYCLE_MIN_BYTES // 4 + 3  # floats: just above the threshold, not a multiple of a vector


def _compiled():
    return minicomp.compile(lambda x: torch.cos(x) * 2 + 1, backend="cpu")


def _want(x):
    return torch.cos(x) * 2 + 1


def test_a_dropped_output_is_recycled_and_holds_the_new_values():
    f = _compiled()
    x1, x2 = torch.randn(N), torch.randn(N)
    y = f(x1)
    ptr = y.data_ptr()
    del y
    y = f(x2)
    assert y.data_ptr() == ptr
    torch.testing.assert_close(y, _want(x2))


def test_the_loop_idiom_settles_on_two_buffers():
    """`y = f(x)` keeps the previous output alive while the next is computed."""
    f = _compiled()
    xs = [torch.randn(N) for _ in range(6)]
    ptrs = set()
    y = None
    for x in xs:
        y = f(x)
        ptrs.add(y.data_ptr())
        torch.testing.assert_close(y, _want(x))
    assert len(ptrs) == RECYCLE_KEEP


def test_outputs_still_referenced_are_never_overwritten():
    f = _compiled()
    x = torch.randn(N)
    kept = [f(x)]                       # the tensor itself
    view = f(x)[5:]                     # only a view survives
    storage = f(x).untyped_storage()    # only a storage object survives
    for _ in range(4):
        f(torch.randn(N))
    torch.testing.assert_close(kept[0], _want(x))
    torch.testing.assert_close(view, _want(x)[5:])
    got = torch.empty(0).set_(storage, 0, (N,), (1,))
    torch.testing.assert_close(got, _want(x))


def test_outputs_saved_for_backward_are_not_recycled_before_backward():
    f = minicomp.compile(lambda x: torch.exp(x * 0.5), backend="cpu")  # exp saves its output
    x1 = torch.randn(N, requires_grad=True)
    y1 = f(x1)
    loss = y1.sum()
    del y1
    for _ in range(3):
        f(torch.randn(N, requires_grad=True)).sum().backward()
    loss.backward()
    torch.testing.assert_close(x1.grad, torch.exp(x1.detach() * 0.5) * 0.5)


def test_a_resized_storage_is_not_taken_back():
    r = Recycler((N,), torch.float32, "cpu")
    t = r()
    t.resize_(2 * N)  # the caller grew the storage, then dropped it
    del t
    u = r()
    assert u.shape == (N,) and u.untyped_storage().nbytes() == r.nbytes
