"""Training end to end with minicomp's partitioner (compiler/passes/partition.py): gradients against
eager with rematerialization on and off, the saved bytes it reports, remat_budget, random ops,
activation checkpointing, an optimizer run tracking eager's losses, and data-parallel training."""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicomp
from minicomp.models import Block
from tests.e2e.models import ZOO
from tests.helpers import assert_matches_eager

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _make(name):
    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    return model, tuple(x.requires_grad_(True) if x.is_floating_point() else x for x in inputs)


@pytest.mark.parametrize("name", ["mlp", "layernorm_gelu", "attention", "gpt_block", "conv_bn_relu", "mixer"])
def test_gradients_without_remat(name):
    """remat=False saves every forward value the backward uses; with remat on (the default) the zoo
    tests check the same models (tests/e2e/test_zoo.py)."""
    model, inputs = _make(name)
    compiled = assert_matches_eager(model, *inputs, backend="cpu", remat=False, rtol=1e-4, atol=1e-4)
    p, = compiled.report().partitions
    assert p.partitioner == "remat=False" and p.saved_bytes == p.no_remat_bytes and not p.recomputed
    assert p.seconds > 0  # the cut's time (the benchmark counts it as minicomp's own)
    for (key, want), got in zip(model.state_dict().items(), compiled.model.state_dict().values()):
        torch.testing.assert_close(got, want, msg=lambda m: f"buffer {key}: {m}")  # batch norm's running stats


def _saved(model, inputs, **kw):
    compiled = minicomp.compile(copy.deepcopy(model), backend="cpu", **kw)
    compiled(*inputs).sum().backward()
    p, = compiled.report().partitions
    return p


@pytest.mark.parametrize("name", ["mlp_gelu", "layernorm", "gpt_block", "mixer"])
def test_remat_saves_fewer_bytes(name):
    torch.manual_seed(0)
    dim = 32
    if name == "mlp_gelu":
        model, x = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)), torch.randn(8, dim)
    elif name == "layernorm":
        model, x = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.LayerNorm(dim)), torch.randn(8, dim)
    elif name == "gpt_block":
        model, x = Block(dim, 4, 16), torch.randn(2, 16, dim)
    else:
        model, x = ZOO["mixer"]()
        x = x[0]
    x.requires_grad_(True)
    on, off = _saved(model, (x,)), _saved(model, (x,), remat=False)
    assert on.saved_bytes < off.saved_bytes == on.no_remat_bytes
    if name in ("gpt_block", "mixer"):
        assert on.saved_bytes <= 0.7 * off.saved_bytes
    assert on.recomputed and all(flops >= 0 for *_, flops in on.recomputed)
    assert "saved_bytes=" in str(on) and "recomputed in backward" in str(on)


def test_remat_budget_is_honoured_or_refused_with_the_reason():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    x = torch.randn(8, 16, requires_grad=True)
    compiled = assert_matches_eager(model, x, backend="cpu", remat_budget=0.5)
    p, = compiled.report().partitions
    assert p.saved_bytes <= 0.5 * p.no_remat_bytes and p.budget == 0.5
    with pytest.raises(minicomp.MinicompError, match=r"remat_budget=0.01 .*mm .*compute-bound"):
        minicomp.compile(model, backend="cpu", remat_budget=0.01)(x).sum().backward()
    with pytest.raises(ValueError, match="remat_budget"):
        minicomp.compile(model, remat_budget=0)
    with pytest.raises(ValueError, match="remat_budget"):
        minicomp.compile(model, remat=False, remat_budget=0.5)


def test_dropout_mask_is_saved_not_drawn_again():
    """A random op is never recomputed: the backward must use the forward's own mask."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.5))
    compiled = minicomp.compile(model, backend="cpu")
    x = torch.randn(32, 16)
    out = compiled(x)
    out.backward(torch.ones_like(out))
    scale = (out != 0).float() * 2.0  # d out / d h: 1 / (1 - p) where the forward kept h, else 0
    assert 0 < scale.count_nonzero() < scale.numel()
    torch.testing.assert_close(model[0].weight.grad, scale.t() @ x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[0].bias.grad, scale.sum(0), rtol=1e-5, atol=1e-5)
    p, = compiled.report().partitions
    assert any("native_dropout" in v or "bernoulli" in v or "rand" in v for v, _ in p.saved) or p.saved


def test_activation_checkpointing_inside_a_compiled_model():
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 16)

        def forward(self, x):
            return checkpoint(lambda y: self.b(F.gelu(self.a(y))), x, use_reentrant=False)
    torch.manual_seed(0)
    assert_matches_eager(Checkpointed(), torch.randn(4, 16, requires_grad=True), backend="cpu", rtol=1e-4, atol=1e-4)


def test_adamw_steps_track_eager_loss_curve():
    torch.manual_seed(0)
    eager = Block(64, 4, 32)
    model = copy.deepcopy(eager)
    compiled = minicomp.compile(model, backend="cpu")
    opt_e = torch.optim.AdamW(eager.parameters(), lr=3e-3)
    opt_c = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(20):
        x, target = torch.randn(4, 32, 64, generator=gen), torch.randn(4, 32, 64, generator=gen)
        pair = []
        for m, opt in ((eager, opt_e), (compiled, opt_c)):
            loss = F.mse_loss(m(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            pair.append(loss.item())
        losses.append(pair)
    for step, (e, c) in enumerate(losses):
        assert abs(e - c) <= 1e-4 * max(1.0, abs(e)), f"step {step}: compiled loss {c} vs eager {e}"
    assert losses[-1][0] < losses[0][0]  # it learns


def test_data_parallel_training_matches_eager_ddp():
    """The README's example: 2 gloo workers, gradients after the all-reduce compared with eager DDP."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(ROOT, "samples", "ddp_train.py"), "--check", "--steps", "3", "--backend", "cpu"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 workers, 3 steps: max difference from eager DDP" in r.stdout
    assert "joint_" in r.stdout and "[min-cut]" in r.stdout  # the compiled backward used our partition


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_value_computed_from_an_input_updated_in_place_is_saved_not_recomputed(backend):
    """AOTAutograd writes x's new value into x after the forward: a backward that recomputed x * 2
    from x read the updated x (autograd refused: x was modified by an inplace operation)."""
    def fn(x, w):
        x.mul_(2)
        return (x * w).sum(0), torch.tanh(x * w)
    compiled = minicomp.compile(fn, backend=backend)
    for _ in range(2):
        x, w = torch.randn(4, 5), torch.randn(4, 5, requires_grad=True)
        xe, we = x.clone(), w.detach().clone().requires_grad_()
        got, want = compiled(x, w), fn(xe, we)
        torch.testing.assert_close(x, xe)
        (got[0].sum() + got[1].sum()).backward()
        (want[0].sum() + want[1].sum()).backward()
        torch.testing.assert_close(w.grad, we.grad)


class _AttentionWeights(nn.Module):
    """nn.MultiheadAttention's averaged attention weights (need_weights=True, sequence first): its
    backward sums the in-projection's gradient down columns of a reshape of permuted heads."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2)

    def forward(self, x):
        out, weights = self.attn(x, x, x)
        return out, weights


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_torch_nn_attention_layers_train(backend):
    """torch.nn's own attention layers, outputs and gradients against eager: MultiheadAttention with
    its weights, and a norm-first TransformerEncoderLayer over a padding mask."""
    torch.manual_seed(0)
    assert_matches_eager(_AttentionWeights(), torch.randn(5, 3, 16), backend=backend, rtol=1e-4, atol=1e-5)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 5:] = True
    assert_matches_eager(lambda x: layer(x, src_key_padding_mask=pad), torch.randn(2, 7, 32, requires_grad=True),
                         backend=backend, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_backward_compiles_at_the_first_backward(backend):
    """A forward under grad mode compiles its forward only (decompositions.py): evaluation outside
    no_grad pays for no backward. The first backward() compiles it, and gradients match eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    ref = copy.deepcopy(model)
    compiled = minicomp.compile(model, backend=backend)
    out = compiled(x)
    assert [g.kind for g in compiled.report().graphs] == ["forward"]
    torch.testing.assert_close(compiled(x), ref(x), rtol=1e-5, atol=1e-5)
    out.square().sum().backward()
    assert [g.kind for g in compiled.report().graphs] == ["forward", "backward"]
    want = ref(x)
    want.square().sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
