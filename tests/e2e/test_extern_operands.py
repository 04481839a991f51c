"""What ops that run in torch take besides tensors, and how they take tensors: a complex scalar
(z * (1+2j)), and a torch view op (view_as_complex, view(dtype)) whose operand the fx graph made
contiguous with a clone the IR does not keep -- it still comes contiguous (ir.ops.view_target)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_matches_eager

BACKENDS = ["cpu", "cuda_emu", "interpret"]


def rotate(x):  # (N, 2) pairs as complex numbers, rotated and scaled by 1+2j
    return torch.view_as_real(torch.view_as_complex(x) * (1 + 2j)).sum(-1)


def complex_of_a_transpose(x):  # the transpose is cloned contiguous in fx: view_as_complex needs it so
    return torch.view_as_real(torch.view_as_complex(x.transpose(0, 1).contiguous()) * 2)


def complex_of_a_broadcast(x):  # an expand, cloned: its last dim has stride 0 until copied
    return torch.view_as_complex((x * 2).expand(3, 4, 2).contiguous()).abs()


def bits_of_a_transpose(x):
    return x.t().contiguous().view(torch.int32) & 0xFF


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, make", [(rotate, lambda: torch.randn(3, 4, 2)),
                                      (complex_of_a_transpose, lambda: torch.randn(4, 3, 2)),
                                      (complex_of_a_broadcast, lambda: torch.randn(4, 1))],
                         ids=["rotate", "transpose", "broadcast"])
@pytest.mark.parametrize("grad", [False, True])
def test_complex_operands_match_eager(fn, make, backend, grad):
    assert_matches_eager(fn, make().requires_grad_(grad), backend=backend, calls=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bitcast_view_of_a_cloned_transpose(backend):
    assert_matches_eager(bits_of_a_transpose, torch.randn(5, 6), backend=backend)
