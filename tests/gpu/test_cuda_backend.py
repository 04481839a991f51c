"""backend="cuda" on a real GPU (skipped without one: the `cuda` mark). The GPU check script,
tests/gpu/check.py, runs the whole zoo and the benchmark; these are the quick pytest versions."""
import pytest
import torch

import minicomp
from tests.e2e.models import ZOO
from tests.helpers import assert_matches_eager

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("name", ["mlp", "layernorm_gelu", "gpt_block"])
def test_zoo_on_cuda(name, graphs):
    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    inputs = tuple(x.cuda().requires_grad_(x.is_floating_point()) for x in inputs)
    # three calls: warm-up, capture, replay (the backward's on autograd's device thread)
    c = assert_matches_eager(model.cuda(), *inputs, backend="cuda", cuda_graphs=graphs, rtol=1e-4, atol=1e-4, calls=3)
    assert all(g.detail.get("device") == "cuda:0" for g in c.report().graphs)


def test_a_cpu_constant_runs_on_the_device():
    c = minicomp.compile(lambda x: x * torch.tensor(2.0) + torch.tensor([1.0, 2.0, 3.0], device="cpu"), backend="cuda")
    x = torch.randn(4, 3, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(c(x), x * 2 + torch.tensor([1.0, 2.0, 3.0], device="cuda"))


def test_graph_replay_sees_new_inputs_and_weights():
    lin = torch.nn.Linear(64, 64).cuda()
    c = minicomp.compile(lambda x: torch.relu(lin(x)) * 2, backend="cuda")
    with torch.no_grad():
        for i in range(4):  # warm-up, capture, replays
            x = torch.randn(8, 64, device="cuda")
            if i == 3:
                lin.weight.mul_(-1)
            torch.testing.assert_close(c(x), torch.relu(lin(x)) * 2)
