"""Kernels that only move data (a transpose, a strided or broadcast copy) or fill a buffer with a
constant run as torch's copy_/fill_ on strided views of their buffers when they are big
(backends/copies.py): no LLVM for them, and results equal eager's exactly."""
from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.backends import copies
from minicomp.backends.copies import TensorCopy
from tests.helpers import assert_matches_eager


def _steps(compiled):
    (program,) = compiled.report().runs
    return program.primary().steps


def _detail(compiled):
    return compiled.report().graphs[0].detail


@pytest.mark.parametrize("case", ["last two", "head permute", "heads split", "heads merged", "every other column",
                                  "broadcast rows", "offset input"])
def test_big_copies_run_in_torch_and_match_eager(case):
    x = torch.randn(48, 128, 64)
    f, args = {
        "last two": (lambda x: x.transpose(1, 2).contiguous(), (x,)),
        "head permute": (lambda x: x.reshape(4, 12, 128, 64).permute(0, 2, 1, 3).contiguous(), (x,)),
        # an attention's heads out of [B, T, H*D] into [B*H, T, D], and back: a loop over B*H or
        # B*T divides its variable (v // 12, v % 12), and the copy splits it into two dimensions
        "heads split": (lambda x: x.reshape(4, 128, 12, 64).permute(0, 2, 1, 3).reshape(48, 128, 64), (x,)),
        "heads merged": (lambda x: x.reshape(4, 12, 128, 64).permute(0, 2, 1, 3).reshape(512, 768), (x,)),
        "every other column": (lambda x: x[:, :, ::2].contiguous(), (x,)),
        "broadcast rows": (lambda x: x[0].expand(48, 128, 64).contiguous(), (x,)),
        "offset input": (lambda x: x.transpose(1, 2).contiguous(), (torch.randn(49, 128, 64)[1:],)),
    }[case]
    with torch.no_grad():
        c = assert_matches_eager(f, *args, backend="cpu", grad=False, rtol=0, atol=0)
        for _ in range(2):  # the steps run again on recycled buffers
            assert torch.equal(c(*args), f(*args))
    assert _detail(c)["torch_copies"] == 1 and _detail(c)["llvm_bodies"] == 0
    assert [type(s) for s in _steps(c)] == [TensorCopy]


def test_a_small_copy_keeps_its_kernel():
    x = torch.randn(16, 32)  # 2 KiB: torch's call would cost more than the copy
    with torch.no_grad():
        c = assert_matches_eager(lambda x: x.t().contiguous(), x, backend="cpu", grad=False)
    assert _detail(c)["torch_copies"] == 0 and _detail(c)["llvm_bodies"] == 1


def test_a_copy_with_arithmetic_is_a_kernel():
    x = torch.randn(48, 128, 64)
    with torch.no_grad():
        c = assert_matches_eager(lambda x: x.transpose(1, 2) * 2, x, backend="cpu", grad=False)
    assert _detail(c)["torch_copies"] == 0


@pytest.mark.parametrize("value", [0.0, float("-inf"), float("nan"), 7])
def test_fills_run_in_torch(value, monkeypatch):
    monkeypatch.setattr(copies, "COPY_MIN_BYTES", 1024)
    x = torch.randn(64, 64)
    dtype = torch.int64 if isinstance(value, int) else torch.float32

    def f(x, i):  # a filled buffer an extern (index_put) accumulates into: its own kernel
        z = torch.full((512, 64), value, dtype=dtype)
        return z.index_put((i,), x.to(dtype), accumulate=True)
    i = torch.randint(0, 512, (64,))
    with torch.no_grad():
        c = minicomp.compile(f, backend="cpu")
        torch.testing.assert_close(c(x, i), f(x, i), equal_nan=True)
        torch.testing.assert_close(c(x, i), f(x, i), equal_nan=True)
    assert _detail(c)["torch_copies"] == 1, _detail(c)


def test_a_scatter_add_into_zeros_fills_through_torch_and_matches_eager():
    """A scatter-add into a fresh zero table (zeros, then index_put with accumulate: what an
    embedding's backward decomposes to) zero-fills through torch's fill, and matches eager."""
    torch.manual_seed(0)
    ids, rows = torch.randint(0, 1024, (256,)), torch.randn(256, 64)

    def f(i, v):
        return torch.zeros(1024, 64).index_put((i,), v * 2, accumulate=True)
    c = minicomp.compile(f, backend="cpu")
    torch.testing.assert_close(c(ids, rows), f(ids, rows))
    assert _detail(c)["torch_copies"] >= 1, _detail(c)


def test_embedding_gradients_run_as_atens_embedding_backward_and_match_eager():
    """An embedding's backward is ATen's embedding_dense_backward, eager's own kernel: its
    decomposition (zeros, then an out-of-place index_put) copied the whole zero table once more."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(1024, 64, padding_idx=3)
    ids = torch.randint(0, 1024, (8, 32))
    ids[0, :4] = 3
    c = minicomp.compile(lambda i: (emb(i) * 2).sum(), backend="cpu")
    c(ids).backward()
    got = emb.weight.grad.clone()
    emb.weight.grad = None
    (emb(ids) * 2).sum().backward()
    torch.testing.assert_close(got, emb.weight.grad)
    assert "aten.embedding_dense_backward.default" in {e for g in c.report().graphs for e in g.externs}


def test_a_written_view_must_reach_each_element_once():
    assert copies._one_to_one([4, 8], (8, 1)) and copies._one_to_one([4, 8], (1, 4))
    assert copies._one_to_one([4, 8], (16, 2))  # gaps are fine
    assert not copies._one_to_one([4, 8], (0, 1)) and not copies._one_to_one([4, 8], (4, 1))
