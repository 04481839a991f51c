"""The training benchmark's meters (bench_train.py): PyTorch's own min cut measured on the joint graph
minicomp gets, and the float64 reference a gradient disagreement with eager is judged by."""
from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp import bench_models
from minicomp.bench_cases import make_train_case
from minicomp.bench_train import _grads_f64, torch_min_cut_bytes


def test_torch_min_cut_is_measured_and_ours_keeps_no_more():
    case = make_train_case("gpt_block_train", quick=True)
    theirs = torch_min_cut_bytes(case.fn, case.inputs)
    assert theirs is not None and theirs > 0
    c = minicomp.compile(case.fn, backend="cpu")
    c(*case.inputs).sum().backward()
    assert 0 < sum(p.saved_bytes for p in c.report().partitions) <= theirs


def test_torch_min_cut_is_measured_on_a_graph_holding_constants():
    """HF GPT-2's joint graph holds tensor constants a deepcopy of it cannot copy."""
    if bench_models.available("hf_gpt2"):
        pytest.skip(bench_models.available("hf_gpt2"))
    case = make_train_case("hf_gpt2_train", quick=True)
    assert torch_min_cut_bytes(case.fn, case.inputs) > 0


def test_float64_reference_gradients():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    x = torch.randn(2, 3, 8, 8)
    target = torch.randn(2, 4, 6, 6)
    exact = _grads_f64(m, (x,), target)
    assert [g.dtype for g in exact] == [torch.float64] * len(list(m.parameters()))
    torch.nn.functional.mse_loss(m(x), target).backward()
    for p, g in zip(m.parameters(), exact):
        torch.testing.assert_close(p.grad.double(), g, rtol=1e-4, atol=1e-6)
    assert all(p.dtype == torch.float32 for p in m.parameters())  # the model itself is left as it was
