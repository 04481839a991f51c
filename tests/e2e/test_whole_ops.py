"""Ops AOTAutograd hands over whole (compiler/decompositions.py) and the front end lowers itself:
layer_norm's backward, the activations' backward formulas, views, and layer_norm in inference
graphs. Each against eager on `cpu` and `cuda_emu`, gradients too, with nothing left to torch;
and the traces checked to hold the op whole, so the lowering (not a decomposition) is what ran."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._functorch.aot_autograd import make_boxed_func

import minicomp
from minicomp.compiler import decompositions
from tests.helpers import assert_matches_eager

BACKENDS = ["cpu", "cuda_emu"]
aten = torch.ops.aten


def _targets(fn, *inputs, grad: bool) -> set:
    """The ATen ops in the graphs AOTAutograd hands minicomp for `fn` (its tables, as capture.py picks)."""
    seen: set = set()

    def keep(gm, _):
        seen.update(n.target for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm)

    backend = decompositions.aot_backend(fw_compiler=keep, bw_compiler=keep, inference_compiler=keep)
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        out = torch.compile(fn, backend=backend)(*inputs)
        if grad:
            out.sum().backward()
    return seen


def _no_externs(compiled):
    externs = [e for g in compiled.report().graphs for e in g.externs]
    assert not externs, f"ran in torch: {externs}"


class Norms(nn.Module):
    def __init__(self, shape, affine=True, bias=True):
        super().__init__()
        self.ln = nn.LayerNorm(shape, elementwise_affine=affine, bias=bias)

    def forward(self, x):
        return self.ln(x * 2) + x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,normalized,affine,bias", [
    ((3, 5, 16), (16,), True, True),
    ((3, 5, 16), (5, 16), True, True),     # two normalized dims
    ((4, 7), (7,), False, True),           # no weight, no bias
    ((4, 7), (7,), True, False),           # weight, no bias
    ((1, 1, 9), (9,), True, True),         # size-1 batch dims
    ((6, 1), (1,), True, True),            # one element per row: x_hat is 0
    ((16,), (16,), True, True),            # no batch dims: weight's gradient is not a sum
])
def test_layer_norm_backward(backend, shape, normalized, affine, bias):
    torch.manual_seed(0)
    model, x = Norms(normalized, affine, bias), torch.randn(*shape, requires_grad=True)
    compiled = assert_matches_eager(model, x, backend=backend, rtol=1e-4, atol=1e-5)
    _no_externs(compiled)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_backward_parameters_only(backend):
    """An input that needs no gradient: the backward asks for the weight's and bias's only."""
    torch.manual_seed(0)
    model, x = Norms((12,)), torch.randn(5, 12)
    compiled = assert_matches_eager(model, x, backend=backend, grad=True, rtol=1e-4, atol=1e-5)
    _no_externs(compiled)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_layer_norm_backward_dtypes(backend, dtype):
    torch.manual_seed(0)
    model, x = Norms((32,)).to(dtype), torch.randn(4, 6, 32, dtype=dtype, requires_grad=True)
    tol = dict(rtol=2e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-9, atol=1e-9)
    compiled = assert_matches_eager(model, x, backend=backend, **tol)
    _no_externs(compiled)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_backward_non_contiguous_and_special_values(backend):
    torch.manual_seed(0)
    model = Norms((8,))
    x = torch.randn(8, 6).t()[1:]  # a transposed view, sliced: (5, 8) with strides (1, 6)
    assert not x.is_contiguous()
    assert_matches_eager(model, x.requires_grad_(True), backend=backend, rtol=1e-4, atol=1e-5)
    bad = torch.randn(3, 8)
    bad[0, 2], bad[1, 5] = float("nan"), float("inf")  # rows with NaN/Inf stay NaN; the others are unaffected
    assert_matches_eager(model, bad.requires_grad_(True), backend=backend, rtol=1e-4, atol=1e-5)


class Activations(nn.Module):
    def __init__(self, approximate):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.approximate = approximate

    def forward(self, x):
        y = self.lin(x)
        return F.gelu(y, approximate=self.approximate) + F.silu(y * 0.5) + torch.tanh(y).t().t()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_activation_backwards(backend, approximate, dtype):
    torch.manual_seed(0)
    model, x = Activations(approximate).to(dtype), torch.randn(6, 16, dtype=dtype, requires_grad=True)
    x.data[0, :3] = torch.tensor([0.0, -30.0, 30.0], dtype=dtype)  # the formulas' flat tails and zero
    # bf16: the Linear's weight gradient sums bf16 products, as eager's does, in another order
    tol = dict(rtol=5e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    compiled = assert_matches_eager(model, x, backend=backend, **tol)
    _no_externs(compiled)


def test_traces_keep_the_ops_whole():
    """The training trace holds layer_norm's backward, the activations' backwards and the views
    whole; layer_norm itself is decomposed there (the partitioner recomputes its parts) and kept
    whole in an inference trace."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(16), Activations("tanh"), nn.Linear(16, 4))
    x = torch.randn(3, 16)
    train = _targets(model, x, grad=True)
    assert {aten.native_layer_norm_backward.default, aten.gelu_backward.default, aten.silu_backward.default,
            aten.tanh_backward.default, aten.t.default} <= train
    assert aten.native_layer_norm.default not in train
    inference = _targets(model, x, grad=False)
    assert aten.native_layer_norm.default in inference
    assert not inference & {aten.var_mean.correction, aten.rsqrt.default}


@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_layer_norm_whole(backend):
    """Under no_grad the graph keeps layer_norm whole; minicomp lowers it into one row kernel with
    what follows, as it fused the decomposed arithmetic before."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU())
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled = assert_matches_eager(model, x, backend=backend, grad=False, rtol=1e-5, atol=1e-5)
    _no_externs(compiled)
    g, = compiled.report().graphs
    assert g.kind == "inference" and g.detail["kernels"] == 1, g.detail


class Slices(nn.Module):
    def forward(self, x):
        return x[:, 1:5] * 2 + x[:, ::3] + x[2:4].sum(0)[:4] + F.silu(x[:, -4:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_backward_and_silu(backend):
    """A slice's gradient (zeros with the gradient written back; steps too) and silu, lowered whole."""
    torch.manual_seed(0)
    x = torch.randn(6, 12, requires_grad=True)
    compiled = assert_matches_eager(Slices(), x, backend=backend, rtol=1e-5, atol=1e-5)
    _no_externs(compiled)
    assert {aten.slice_backward.default, aten.silu.default} <= _targets(Slices(), x.detach().requires_grad_(True), grad=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_turned_on_inside_a_no_grad_call(backend):
    """Called under no_grad, the graph gets the inference table (layer_norm whole); grad turned on
    inside makes AOTAutograd trace a backward all the same, with layer_norm's backward whole."""
    def fn(x, w, b):
        with torch.enable_grad():
            return F.gelu(F.layer_norm(x * 3, (8,), w, b)) * 2

    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8), torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    compiled = minicomp.compile(fn, backend=backend)
    with torch.no_grad():
        got, want = compiled(x, w, b), fn(x, w, b)
    assert got.requires_grad
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.sum().backward()
    grads = [w.grad.clone(), b.grad.clone()]
    w.grad = b.grad = None
    want.sum().backward()
    torch.testing.assert_close(grads, [w.grad, b.grad], rtol=1e-5, atol=1e-5)
    assert sorted(g.kind for g in compiled.report().graphs) == ["backward", "forward"]
    _no_externs(compiled)
