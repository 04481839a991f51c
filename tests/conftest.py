import os

import pytest
import torch

os.environ.setdefault("MINICOMP_VERIFY", "1")  # verify the IR after every pass in every test


def pytest_collection_modifyitems(config, items):
    has_gpu = torch.cuda.is_available()
    for item in items:
        if "cuda" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
