"""Ops with a side effect: AOTAutograd threads them on a token, as with_effects(token, op, *args)
(linalg.inv's check for a singular matrix raises). The call runs in torch, in its place, with the
operator as an argument (ir OpArg), and our own partition takes training graphs that hold one."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import minicomp
from tests.helpers import assert_matches_eager

BACKENDS = ["cpu", "cuda_emu"]


class Inverse(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):  # (B, 3, 3): inverted batch by batch, then pointwise work around it
        return torch.linalg.inv(self.lin(x) + 3 * torch.eye(3)).sum(-1).sin()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_effectful_op_in_inference_matches_eager(backend):
    torch.manual_seed(0)
    with torch.no_grad():
        compiled = assert_matches_eager(Inverse(), torch.randn(4, 3, 3), backend=backend, grad=False, calls=2)
    assert "higher_order.with_effects" in compiled.report().graphs[0].externs
    assert not compiled.report().eager


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_effectful_op_in_training_gets_minicomps_cut(backend):
    torch.manual_seed(0)
    compiled = assert_matches_eager(Inverse(), torch.randn(4, 3, 3, requires_grad=True), backend=backend, calls=2)
    report = compiled.report()
    assert [p.partitioner for p in report.partitions] == ["min-cut"]
    assert not report.eager  # not AOTAutograd's default partition, taken for graphs ours cannot cut


@pytest.mark.parametrize("grad", [False, True])
def test_a_singular_matrix_raises_as_in_eager(grad):
    def inv(x):
        return torch.linalg.inv(x * 2) + 1
    x = torch.zeros(2, 3, 3, requires_grad=grad)
    with pytest.raises(torch.linalg.LinAlgError) as eager:
        inv(x)
    with pytest.raises(torch.linalg.LinAlgError) as ours:
        minicomp.compile(inv)(x)
    assert str(ours.value) == str(eager.value)


@pytest.mark.parametrize("backend", BACKENDS + ["interpret"])
@pytest.mark.parametrize("grad", [False, True])
def test_an_effectful_op_over_symbolic_sizes(backend, grad):
    """The batch changes, so the program goes symbolic; AOTAutograd passes the effect token as
    None, which no tensor's shape is read from."""
    def inv(x):
        return torch.linalg.inv(x + 3 * torch.eye(3)).sum(-1)
    compiled = minicomp.compile(inv, backend=backend)
    for n in (2, 4, 7):
        x = torch.randn(n, 3, 3, requires_grad=grad)
        xe = x.detach().clone().requires_grad_(grad)
        got, want = compiled(x), inv(xe)
        torch.testing.assert_close(got, want)
        if grad:
            got.sum().backward()
            want.sum().backward()
            torch.testing.assert_close(x.grad, xe.grad)
    assert any(g.detail.get("symbolic") for g in compiled.report().graphs)
    with pytest.raises(torch.linalg.LinAlgError):
        compiled(torch.zeros(5, 3, 3) - 3 * torch.eye(3))
