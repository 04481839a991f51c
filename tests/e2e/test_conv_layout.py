"""Convolutions on CPU (compiler/passes/channels_last.py, compiler/lower_nn.py fold_batch_norm):
channels-last convolutions whose input and weight our kernels write in that order, batch norm in
eval mode folded into the convolution before it; in training, saved values crossing to the backward
in [N,H,W,C] order and the convolution backward run channels-last too (output_layout.py) --
compared with eager on cpu and cuda_emu (gradients too, and with float64), odd inputs included,
and what the compiled graphs hold."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicomp
from minicomp.compiler.passes import channels_last
from tests.helpers import assert_matches_eager

BACKENDS = ["cpu", "cuda_emu"]


class Res(nn.Module):
    """conv -> bn -> relu -> conv -> bn, + a 1x1 strided skip conv of the input, relu; a grouped conv."""

    def __init__(self, c=8, o=16):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, o, 3, 2, 1, bias=False), nn.BatchNorm2d(o)
        self.c2, self.b2 = nn.Conv2d(o, o, 3, 1, 1), nn.BatchNorm2d(o)
        self.skip = nn.Conv2d(c, o, 1, 2)
        self.g = nn.Conv2d(o, o, 3, 1, 1, groups=4)
        for bn in (self.b1, self.b2):  # running statistics that are not the identity
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + self.skip(x))
        return self.g(y), y.mean((2, 3))


def _compiled_graph(compiled):
    return [g for g in compiled.report().graphs if g.kind == "inference"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_residual_convnet_in_eval_matches_eager(backend):
    torch.manual_seed(0)
    model, x = Res().eval(), torch.randn(4, 8, 32, 32)
    with torch.no_grad():
        compiled = assert_matches_eager(model, x, backend=backend, rtol=1e-4, atol=1e-4, calls=2, grad=False)
    g, = _compiled_graph(compiled)
    assert g.detail["kernels"] >= 1


def test_convolutions_run_channels_last_and_batch_norm_is_folded(tmp_path):
    torch.manual_seed(0)
    model, x = Res().eval(), torch.randn(4, 8, 32, 32)
    with torch.no_grad():
        compiled = assert_matches_eager(model, x, backend="cpu", rtol=1e-4, atol=1e-4, grad=False, debug=str(tmp_path))
    fused = next(tmp_path.rglob("*ir_after_fuse.txt")).read_text()
    assert fused.count("= conv_cl ") == 4 and "= conv " not in fused
    big = [k for k in compiled.report().kernels if k.bytes_written >= 4 * 16 * 16 * 16 * 4]
    assert big and not any("rsqrt" in k.ops for k in big)  # no batch norm per element: in the weights


def test_small_and_odd_convolutions_keep_their_layout_and_match():
    """Below MIN_ELEMENTS a convolution stays as it is; f64 (no oneDNN path) and a transposed
    convolution too; a non-contiguous input and a batch of one match eager everywhere."""
    torch.manual_seed(0)
    small = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    with torch.no_grad():
        assert_matches_eager(small, torch.randn(1, 3, 6, 6), backend="cpu", rtol=1e-4, atol=1e-4, grad=False)
        double = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)).double().eval()
        assert_matches_eager(double, torch.randn(2, 3, 64, 64, dtype=torch.float64), backend="cpu", grad=False)
        up = nn.Sequential(nn.ConvTranspose2d(8, 8, 2, 2), nn.BatchNorm2d(8)).eval()
        assert_matches_eager(up, torch.randn(2, 8, 32, 32), backend="cpu", rtol=1e-4, atol=1e-4, grad=False)
        big = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).eval()
        x = torch.randn(1, 32, 32, 8).permute(0, 3, 1, 2)  # channels-last data: a non-contiguous input
        assert_matches_eager(big, x, backend="cpu", rtol=1e-4, atol=1e-4, grad=False)
        x = torch.randn(1, 8, 32, 32)
        x[0, 0, 0, 0] = float("nan")
        assert_matches_eager(big, x, backend="cpu", rtol=1e-4, atol=1e-4, grad=False)


class SharedConv(nn.Module):
    """The convolution's result is an output too: batch norm is not folded into it."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8, affine=False)
        self.bn.running_var.fill_(3.0)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y), y


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_without_affine_and_a_shared_convolution(backend):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8, affine=False)).eval()
    plain[1].running_mean.uniform_(-1, 1)
    with torch.no_grad():
        assert_matches_eager(plain, torch.randn(2, 4, 48, 48), backend=backend, rtol=1e-4, atol=1e-4, grad=False)
        assert_matches_eager(SharedConv().eval(), torch.randn(2, 4, 48, 48), backend=backend, rtol=1e-4,
                             atol=1e-4, grad=False)


def test_a_batch_norm_in_eval_mode_is_folded_in_training_with_exact_gradients():
    torch.manual_seed(0)
    model, x = Res().eval(), torch.randn(2, 8, 16, 16, requires_grad=True)
    assert_matches_eager(model, x, backend="cpu", rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_convolutions_run_channels_last_with_exact_gradients(backend, tmp_path):
    """A training step of convolutions with batch norm (batch statistics), residual adds, a grouped
    and a strided 1x1 convolution: outputs and gradients match eager's (two calls), and float64's as
    closely as eager's do. The forward's convolutions are conv_cl, the backward's conv_backward_cl
    (no aten.convolution_backward left); the values saved for them cross in [N,H,W,C] order, while
    the outputs the user gets keep eager's layout."""
    torch.manual_seed(0)
    model, x = Res().train(), torch.randn(4, 8, 32, 32, requires_grad=True)
    assert_matches_eager(copy.deepcopy(model), x, backend=backend, rtol=1e-4, atol=1e-4, calls=2, debug=str(tmp_path))
    fw = next(tmp_path.rglob("*forward*/*ir_after_fuse.txt")).read_text()
    bw = next(tmp_path.rglob("*backward*/*ir_after_fuse.txt")).read_text()
    assert fw.count("= conv_cl ") == 4 and "= conv " not in fw
    assert bw.count("= conv_backward_cl ") == 4 and "convolution_backward" not in bw

    ours, eager, wide = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = minicomp.compile(ours, backend=backend)
    saved, grads = [], {}

    def pack(t):  # the values the forward computes (the input comes as the caller has it)
        if t.dim() == 4 and t.numel() >= channels_last.MIN_ELEMENTS and t.data_ptr() != x.data_ptr():
            saved.append(t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous())
        return t
    for name, m, fn, inp in (("ours", ours, compiled, x), ("eager", eager, eager, x), ("f64", wide, wide, x.double())):
        with torch.autograd.graph.saved_tensors_hooks(pack if name == "ours" else (lambda t: t), lambda t: t):
            out = fn(inp)
        if name != "f64":
            grads[name + " strides"] = [o.stride() for o in out]
        (out[0].double().square().mean() + out[1].double().sum()).backward()
        grads[name] = [p.grad.double() for p in m.parameters()]
    assert saved and all(saved), saved
    assert grads["ours strides"] == grads["eager strides"]
    mine = max((a - c).abs().max().item() for a, c in zip(grads["ours"], grads["f64"]))
    theirs = max((b - c).abs().max().item() for b, c in zip(grads["eager"], grads["f64"]))
    assert mine <= 4 * theirs + 1e-7, (mine, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_convolutions_on_odd_inputs(backend):
    """A batch of one, a channels-last input of the user's, an input without grad, f64 (no oneDNN
    path: the layout stays), and a convolution whose result the user gets (eager's layout)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
    assert_matches_eager(net, torch.randn(1, 8, 32, 32, requires_grad=True), backend=backend, rtol=1e-4, atol=1e-4)
    x = torch.randn(2, 32, 32, 8).permute(0, 3, 1, 2).requires_grad_(True)
    assert_matches_eager(net, x, backend=backend, rtol=1e-4, atol=1e-4)
    assert_matches_eager(net, torch.randn(2, 8, 32, 32), backend=backend, rtol=1e-4, atol=1e-4)
    assert_matches_eager(net.double(), torch.randn(2, 8, 32, 32, dtype=torch.float64, requires_grad=True),
                         backend=backend)


def test_the_pass_is_off_outside_cpu():
    class Ctx:
        channels_last = False
    from minicomp.ir import parse, verify
    g = verify(parse("""
        graph g(%x: f32[2,8,32,32], %w: f32[16,8,3,3]) -> (f32[2,16,32,32]) {
          %0: f32[2,16,32,32] = conv %x %w [stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=false, output_padding=(0, 0), groups=1]
          return %0
        }
    """))
    assert [n.op for n in channels_last.run(g, Ctx()).nodes] == ["conv"]
    Ctx.channels_last = True
    out = channels_last.run(g, Ctx())
    # the result the graph returns is copied into eager's contiguous layout
    assert [n.op for n in out.nodes] == ["permute", "permute", "conv_cl", "permute", "copy"]
    x, w = torch.randn(2, 8, 32, 32), torch.randn(16, 8, 3, 3)
    from minicomp.ir import interpret
    torch.testing.assert_close(interpret(out, x, w)[0], F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-5)


def test_a_convolution_backward_runs_channels_last_and_pointwise_ops_follow():
    """The pass on a backward: its saved input comes as [N,H,W,C] viewed back, the gradient is a
    kernel's; the extern becomes conv_backward_cl over [N,H,W,C] buffers, its grad_input comes back
    in that order (viewed back), and the pointwise ops reading it compute in that order too. The
    graph computes what it did, in the interpreter and on cpu."""
    class Ctx:
        channels_last = True
    from minicomp.ir import interpret, parse, verify
    text = """
        graph g(%xs: f32[2,32,32,8], %w: f32[16,8,3,3], %t: f32[2,16,32,32]) -> (f32[2,8,32,32], f32[16,8,3,3]) {
          %0: f32[2,8,32,32] = permute %xs [dims=(0, 3, 1, 2)]
          %1: f32[2,16,32,32] = mul %t %t
          %2: (f32[2,8,32,32], f32[16,8,3,3], None) = extern %1 %0 %w [args=($0, $1, $2, [0], [1, 1], [1, 1], [1, 1], false, [0, 0], 1, [true, true, false]), target="aten.convolution_backward.default"]
          %3: f32[2,8,32,32] = getitem %2 [index=0]
          %4: f32[16,8,3,3] = getitem %2 [index=1]
          %5: f32[2,8,32,32] = relu %3
          %6: f32[2,8,32,32] = add %5 %0
          return %6, %4
        }
    """
    x, w, t = torch.randn(2, 32, 32, 8), torch.randn(16, 8, 3, 3), torch.randn(2, 16, 32, 32)
    want = interpret(verify(parse(text)), x, w, t)
    out = verify(channels_last.run(verify(parse(text)), Ctx()))
    ops = [n.op for n in out.nodes]
    assert "extern" not in ops and ops.count("conv_backward_cl") == 1
    relu = next(n for n in out.nodes if n.op == "relu")
    assert tuple(relu.type.shape) == (2, 32, 32, 8)  # computed in [N,H,W,C] order
    for got, exp in zip(interpret(out, x, w, t), want):
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-4)

    def fn(xs, w, t):  # the same through Dynamo, compiled for cpu, against eager
        x = xs.permute(0, 3, 1, 2)
        gi, gw, _ = torch.ops.aten.convolution_backward(t * t, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                          [True, True, False])
        return torch.relu(gi) + x, gw
    assert_matches_eager(fn, x, w, t, backend="cpu", rtol=1e-4, atol=1e-4, grad=False)
