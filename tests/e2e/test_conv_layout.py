"""Convolutions in CPU inference (compiler/passes/channels_last.py, compiler/lower_nn.py
fold_batch_norm): channels-last convolutions whose input and weight our kernels write in that order,
batch norm in eval mode folded into the convolution before it -- compared with eager on cpu and
cuda_emu, odd inputs included, and what the compiled graph holds."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

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


def test_training_keeps_the_layout_and_its_gradients():
    """Training graphs keep [N,C,H,W] (the convolution backward and the saved values share it), and
    a batch norm in eval mode inside a trained model is folded with gradients still exact."""
    torch.manual_seed(0)
    model, x = Res().eval(), torch.randn(2, 8, 16, 16, requires_grad=True)
    assert_matches_eager(model, x, backend="cpu", rtol=1e-4, atol=1e-4)


def test_the_pass_is_off_outside_cpu_inference():
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
    assert [n.op for n in out.nodes] == ["permute", "permute", "conv_cl", "permute"]
    x, w = torch.randn(2, 8, 32, 32), torch.randn(16, 8, 3, 3)
    from minicomp.ir import interpret
    torch.testing.assert_close(interpret(out, x, w)[0], F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-5)
