"""tests/helpers.py is device-correct: what it makes to compare gradients (the fixed weights) is on
the outputs' device and dtype, so the same helper checks a CUDA model. Proved on `meta` tensors,
which minicomp runs in torch (a CPU-made weight times a meta output raises, as it would against a
CUDA output)."""
import torch

from tests.helpers import assert_matches_eager


def test_gradient_check_on_another_device():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3)).to("meta")
    x = torch.randn(2, 4, device="meta", requires_grad=True)
    assert_matches_eager(model, x, backend="cpu")  # no "Tensor on device cpu is not on the expected device meta"


def test_gradient_check_in_low_precision_on_another_device():
    x = torch.randn(5, 6, device="meta", dtype=torch.bfloat16, requires_grad=True)
    assert_matches_eager(lambda a: (torch.tanh(a) * 2, a.sum(0)), x, backend="cpu")
