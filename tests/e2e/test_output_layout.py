"""Outputs come back in eager's layout: strides equal to eager's where eager's result is a dense
permutation (a pointwise op on a channels-last or transposed input, a transposed result), written
by the kernel that computes the value, with no extra kernel (compiler/output_layout.py)."""
from __future__ import annotations

import copy

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
@pytest.mark.parametrize("case", ["channels_last_pointwise", "transposed_input", "transposed_result",
                                  "permuted_result", "several_outputs"])
def test_output_strides_match_eager_over_symbolic_sizes(case, backend):
    """The same over symbolic sizes: eager's strides are expressions in the sizes (dense in one
    order for every size), and each call's outputs take them."""
    fn, make = CASES[case]
    compiled = minicomp.compile(fn, backend=backend, dynamic=True)
    base = make()
    for grow in (0, 3, 5):  # the first dimension grows; each call checks eager's strides at its size
        x = torch.randn(base.shape[0] + grow, *base.shape[1:]).as_strided(
            (base.shape[0] + grow, *base.shape[1:]), _scaled_strides(base, grow))
        got, want = compiled(x), fn(x)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride(), f"{case} at {tuple(x.shape)}: strides {g.stride()}, eager {w.stride()}"
    assert any(r.detail.get("symbolic") for r in compiled.report().graphs)


def _scaled_strides(base, grow):
    """base's layout (a dense permutation) for a tensor whose first dimension is `grow` longer."""
    shape = (base.shape[0] + grow, *base.shape[1:])
    order = sorted(range(base.dim()), key=lambda d: -base.stride(d))
    strides, step = [0] * base.dim(), 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_training_output_viewing_a_saved_attention_output(backend, dynamic):
    """attention(q, k, v).transpose(1, 2).view(B, T, C) in training: eager's attention output is
    laid out (B, T, H, D), so the user's output is a view of it, and the backward saves it. The
    view is made from the tensor the forward returns for the saved value (input_views.py): that
    value comes back in eager's layout too, or .view() raised (a plain nn.Module, found by a probe)."""
    import torch.nn.functional as F
    torch.manual_seed(0)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(32, 96)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(x).view(B, T, 3, 4, 8).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).view(B, T, C)
    eager = Attention()
    model = copy.deepcopy(eager)
    compiled = minicomp.compile(model, backend=backend, dynamic=dynamic)
    for T in (6, 9) if dynamic else (6,):
        x = torch.randn(2, T, 32, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        got, want = compiled(x), eager(xe)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
        g = torch.randn_like(want)
        got.backward(g)
        want.backward(g)
        torch.testing.assert_close(x.grad, xe.grad)
        for p, pe in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, pe.grad)
            p.grad = pe.grad = None
