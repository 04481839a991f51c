"""The model zoo through backend='cuda_emu': the CUDA kernels a GPU would run, executed by the
emulation, forward and gradients against eager; low precision for a few models."""
import os
import shutil

import pytest
import torch

from tests.e2e.models import ZOO
from tests.e2e.test_zoo import _make, _sdpa_xfail
from tests.helpers import assert_matches_eager

if shutil.which(os.environ.get("CXX", "g++")) is None:
    pytest.skip("cuda_emu needs a host C++20 compiler (g++)", allow_module_level=True)


def _kernel_count(compiled):
    return sum(g.detail.get("kernels", 0) for g in compiled.report().graphs)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_sdpa_xfail) if n == "attention_sdpa" else n for n in ZOO])
def test_forward_and_gradients(name):
    model, inputs = _make(name, grad=True)
    compiled = assert_matches_eager(model, *inputs, backend="cuda_emu")
    assert {g.backend for g in compiled.report().graphs} == {"cuda_emu"}
    assert _kernel_count(compiled) > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["layernorm_gelu", "gpt_block"])
def test_low_precision_inference(name, dtype):
    model, inputs = _make(name, grad=False)
    model = model.to(dtype).eval()
    with torch.no_grad():
        assert_matches_eager(model, *(x.to(dtype) for x in inputs), grad=False, backend="cuda_emu")
