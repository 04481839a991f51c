"""The training benchmark's meters (bench_train.py): PyTorch's own min cut measured on the joint graph
minicomp gets, and the float64 reference a gradient disagreement with eager is judged by."""
from __future__ import annotations

import copy

import pytest
import torch

import minicomp
from minicomp import bench_models
from minicomp.bench_cases import make_train_case
from minicomp.bench_train import _grads_f64, inductor_kernel_time_per_step, torch_min_cut_bytes


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


class _LlamaMLP(torch.nn.Module):
    """Llama's MLP half in plain torch: RMSNorm, then SwiGLU. The SwiGLU product and the norm's
    scaled output feed only matmuls in the backward (weight gradients, computed first)."""

    def __init__(self, d=64, hidden=160):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.gate, self.up = torch.nn.Linear(d, hidden, bias=False), torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def test_swiglu_product_and_norm_output_are_recomputed_inside_backward_kernels():
    """The weight-gradient matmuls wait for the backward kernel that reads what the product and the
    norm's output are recomputed from (passes/fusion_order.py), so both are recomputed there: fewer
    bytes saved than PyTorch's min cut, no more backward kernels than remat=False."""
    torch.manual_seed(0)
    model, x = _LlamaMLP(), torch.randn(2, 16, 64)
    theirs = torch_min_cut_bytes(model, (x,))
    runs = {}
    for remat in (True, False):
        c = minicomp.compile(copy.deepcopy(model), backend="cpu", remat=remat)
        xs = x.clone().requires_grad_(True)
        c(xs).square().sum().backward()
        runs[remat] = c, xs.grad, [p.grad for p in c.model.parameters()]
    ref = copy.deepcopy(model)
    xe = x.clone().requires_grad_(True)
    ref(xe).square().sum().backward()
    for _, gx, gp in runs.values():
        torch.testing.assert_close(gx, xe.grad, rtol=1e-4, atol=1e-4)
        for a, b in zip(gp, [p.grad for p in ref.parameters()]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    p, = runs[True][0].report().partitions
    recomputed = {op for _, op, *_ in p.recomputed}
    assert {"mul", "silu"} <= recomputed  # the product and silu (one op: compiler/decompositions.py)
    assert p.saved_bytes <= theirs and p.saved_bytes <= 0.6 * p.no_remat_bytes

    def backward_kernels(c):
        return sum(g.detail.get("kernels", 0) for g in c.report().graphs if g.kind == "backward")
    assert backward_kernels(runs[True][0]) <= backward_kernels(runs[False][0])


def test_training_rows_say_how_much_of_a_step_is_torch_code():
    from minicomp.bench_train import format_train_table, run_train
    row, = run_train(["mlp_gelu_train"], backend="cpu", reps=2, quick=True)
    assert row["ok"] and 0 < row["torch_share"] <= 1
    assert row["floor"] is None or abs(row["floor"] - row["torch_share"] * row["vs_inductor"]) < 1e-9
    # minicomp's own kernels: a share of the step beside torch's, and the ratio left without them
    assert 0 < row["kernel_share"] <= 1
    assert row["kernel_free"] is None or abs(row["kernel_free"] - (1 - row["kernel_share"]) * row["vs_inductor"]) < 1e-9
    assert row["saved_kib"] < row["noremat_kib"]
    # the compile's floor: a first step through Dynamo and AOTAutograd that compiles nothing
    assert row["trace_s"] is not None and 0 < row["trace_s"]
    # minicomp's own part of the first step (the cut, both graphs' code, the waits for LLVM); LLVM
    # works in the background, partly beside Dynamo and AOTAutograd, so its seconds may pass own's
    assert 0 < row["own_s"] < row["compile_s"] and 0 < row["llvm_s"] < row["compile_s"]
    if row["inductor_compile_s"]:
        assert abs(row["trace_vs_inductor"] - row["trace_s"] / row["inductor_compile_s"]) < 1e-9
        assert abs(row["compile_vs_inductor"] - row["compile_s"] / row["inductor_compile_s"]) < 1e-9
    table = format_train_table([row])
    assert "torch" in table.splitlines()[0] and "floor" in table.splitlines()[0]
    assert "mc kernels" in table.splitlines()[0] and "kernel-free" in table.splitlines()[0]
    assert "trace/ind." in table.splitlines()[0] and "compile/ind." in table.splitlines()[0]


def test_inductor_kernel_time_is_measured():
    """The bound column's meter finds the record of each kernel Inductor generates in a profiled
    step (Inductor compiled afresh with them, even after an Inductor compile of the same model)."""
    case = make_train_case("mlp_gelu_train", quick=True)
    target = torch.randn_like(case.fn(*case.inputs)).detach()
    torch.compile(copy.deepcopy(case.fn))(*case.inputs).sum().backward()  # an earlier compile, without records
    seconds = inductor_kernel_time_per_step(case.fn, case.inputs, target, reps=3)
    assert seconds is not None and seconds > 0
