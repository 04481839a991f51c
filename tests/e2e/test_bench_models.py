"""The benchmark's real models (bench_models.py), at their quick sizes: HF GPT-2, BERT and Llama (when
transformers is installed) and the residual convnet, compiled on cpu and compared with eager; the
training variants' gradients too."""
from __future__ import annotations

import copy

import pytest
import torch

import minicomp
from minicomp import bench_models
from minicomp.bench_cases import CASE_NAMES, TRAIN_CASES, make_case, make_train_case


def _need(name):
    why = bench_models.available(name)
    if why:
        pytest.skip(why)


def test_every_model_case_is_in_the_default_tables():
    assert set(bench_models.MODEL_CASES) <= set(CASE_NAMES)
    assert {f"{m}_train" for m in bench_models.MODEL_CASES} <= set(TRAIN_CASES)


@pytest.mark.parametrize("name", bench_models.MODEL_CASES)
def test_model_case_matches_eager(name):
    _need(name)
    case = make_case(name, quick=True)
    c = minicomp.compile(case.fn, backend="cpu")
    with torch.no_grad():
        torch.testing.assert_close(c(*case.inputs), case.fn(*case.inputs), rtol=1e-4, atol=1e-4)
    assert c.report().eager == []


@pytest.mark.parametrize("name", ["convnet", "hf_gpt2"])
def test_model_training_case_gradients_match_eager(name):
    _need(name)
    case = make_train_case(f"{name}_train", quick=True)
    ref = copy.deepcopy(case.fn)
    c = minicomp.compile(case.fn, backend="cpu")
    out, want = c(*case.inputs), ref(*case.inputs)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    out.square().mean().backward()
    want.square().mean().backward()
    for (n, p), q in zip(case.fn.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{n}: {m}")
    for b1, b2 in zip(case.fn.buffers(), ref.buffers()):  # batch norm's running statistics
        torch.testing.assert_close(b1, b2, rtol=1e-5, atol=1e-6)
