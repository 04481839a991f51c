"""Outputs come back in eager's layout: strides equal to eager's where eager's result is a dense
permutation (a pointwise op on a channels-last or transposed input, a transposed result), written
by the kernel that computes the value, with no extra kernel (compiler/output_layout.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import minicomp
from minicomp.compiler.output_layout import dense_order

BACKENDS = ["cpu", "cuda_emu"]


def test_dense_order():
    assert dense_order((2, 3, 8, 8), (192, 1, 24, 3)) == (0, 2, 3, 1)  # channels-last
    assert dense_order((1, 3, 8, 8), (192, 1, 24, 3)) == (0, 2, 3, 1)  # a batch of one
    assert dense_order((32, 64), (1, 32)) == (1, 0)
    assert dense_order((4, 8), (8, 1)) is None      # row-major
    assert dense_order((3, 1), (1, 3)) is None      # row-major up to a size-1 dim
    assert dense_order((4, 8), (16, 1)) is None     # a gap (a slice of a wider tensor)
    assert dense_order((4, 8), (0, 1)) is None      # expanded
    assert dense_order((0, 8), (1, 0)) is None      # empty
    assert dense_order((5,), (1,)) is None


CASES = {
    "channels_last_pointwise": (lambda x: torch.relu(x) * 2, lambda: torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)),
    "transposed_input": (lambda x: torch.sigmoid(x) + 1, lambda: torch.randn(64, 32).t()),
    "transposed_result": (lambda x: (x * 2).t(), lambda: torch.randn(64, 32)),
    "permuted_result": (lambda x: (x + 1).permute(0, 2, 1), lambda: torch.randn(4, 8, 16)),
    "clone_then_transpose": (lambda x: x.clone().t(), lambda: torch.randn(5, 7)),
    "reduction_then_transpose": (lambda x: x.sum(1).t(), lambda: torch.randn(4, 5, 6)),
    "several_outputs": (lambda x: (x.exp(), (x - 1).t(), x.sum()), lambda: torch.randn(16, 24).t()),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_output_strides_match_eager(case, backend):
    fn, make = CASES[case]
    x = make()
    compiled = minicomp.compile(fn, backend=backend)
    for _ in range(2):  # the second call runs the built program (fresh outputs, or recycled ones)
        got, want = compiled(x), fn(x)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride(), f"{case}: strides {g.stride()}, eager {w.stride()}"
            if not w.is_contiguous():  # .view() refuses eager's and ours alike
                with pytest.raises(RuntimeError):
                    g.view(-1)
    kinds = [k.label for k in compiled.report().kernels]
    assert len(kinds) <= 2 and "transpose" not in kinds, kinds  # written along its rows, once


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_forward_returns_eager_layout_and_gradients_match(backend):
    torch.manual_seed(0)
    lin = nn.Linear(8, 16)
    model = lambda x: torch.nn.functional.gelu(lin(x)).t()  # noqa: E731
    x = torch.randn(4, 8, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    got, want = minicomp.compile(model, backend=backend)(x), model(xe)
    assert got.stride() == want.stride()
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, xe.grad)


def test_a_channels_last_conv_net_in_inference_keeps_channels_last():
    net = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.SiLU()).eval()
    x = torch.randn(2, 8, 32, 32).to(memory_format=torch.channels_last)
    with torch.no_grad():
        got, want = minicomp.compile(net, backend="cpu")(x), net(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert got.stride() == want.stride() and got.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gqa", [True, False])
def test_a_contiguous_output_that_a_torch_op_also_reads_is_contiguous(backend, gqa):
    """v = (x @ w).view(...).transpose(1, 2).contiguous(), returned and passed to attention (HF
    Llama's KV cache with grouped heads): the output is stored contiguous, and attention reads that
    buffer. It came back as the transposed view of the matmul's result, so .view() of it raised."""
    import torch.nn.functional as F
    torch.manual_seed(0)
    wq, wv = torch.randn(32, 64), torch.randn(32, 32 if gqa else 64)
    heads_kv = 2 if gqa else 4

    def f(x):
        q = (x @ wq).view(2, 6, 4, 16).transpose(1, 2)
        v = (x @ wv).view(2, 6, heads_kv, 16).transpose(1, 2).contiguous()
        return F.scaled_dot_product_attention(q, v, v, enable_gqa=gqa), v
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        want, got = f(x), minicomp.compile(f, backend=backend)(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()
    assert got[1].view(2, -1).shape == want[1].view(2, -1).shape
