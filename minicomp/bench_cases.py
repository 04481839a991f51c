"""The benchmark cases: one row each in `python -m minicomp.bench`.

Each case is a function of tensors plus the inputs to call it with. The set covers the three
costs: `cos_cos`, `chain10`, `softmax`, `layernorm_gelu` and `rmsnorm_residual` are bound by
memory bandwidth (fusion decides how many bytes move); `tiny_chain50` is pure overhead (16
elements, 50 ops: launch and Python costs are everything), and `chain50_26in` the same over 26
inputs (what binding many arguments costs); `gpt_block` mixes matrix multiplies
(compute, done by BLAS) with the rest; `hf_gpt2`, `hf_bert`, `hf_llama` and `convnet` are real
models (bench_models.py), each also a training case (`<name>_train`); `kernels100` (not in the default table) is 100 kernels that
cannot fuse, for measuring per-launch cost and CUDA Graph replay. `quick` shrinks the big ones so the whole table runs fast.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from minicomp import bench_models
from minicomp.models import MLP, Block, MixerBlock, NormStack


@dataclass
class Case:
    name: str
    fn: Callable             # a function or nn.Module
    inputs: tuple
    shape: str               # for the table, e.g. "8192x1024"


def _cos_cos(x):
    return torch.cos(torch.cos(x))


def _chain10(x):
    y = x * 1.5
    y = y + 0.5
    y = torch.sin(y)
    y = y * y
    y = y - 0.25
    y = torch.tanh(y)
    y = y * x
    y = y + 1.0
    y = torch.sigmoid(y)
    return y * 0.5


def _tiny_chain50(x):
    y = x
    for _ in range(10):  # 5 ops a round: 50 pointwise ops
        y = torch.abs(torch.sin(y * 0.9 + 0.1) - x)
    return y


def _chain50_26in(*xs):
    y = xs[0]
    for i in range(50):  # 50 pointwise ops, each mixing in one of the 26 inputs in turn
        x = xs[(i + 1) % len(xs)]
        y = torch.sin(y) * x if i % 3 == 0 else y + x if i % 3 == 1 else torch.abs(y - x) * 0.9
    return y


def _layernorm_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, x.shape[-1:], w, b))


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _rmsnorm_residual(x, residual, w):
    h = x + residual
    return h, F.rms_norm(h, h.shape[-1:], w, eps=1e-6)


def _randn(*shape):
    return torch.randn(*shape)


def _kernels100(x):
    for i in range(100):  # each step reduces along the other dim: 100 kernels that cannot fuse
        x = x - x.mean(i % 2, keepdim=True)
    return x


def _gpt_block():
    B, T, C, H = 4, 64, 128, 4
    return Case("gpt_block", Block(C, H, T).eval(), (_randn(B, T, C),), f"B{B} T{T} C{C} H{H}")


def _make(name: str, quick: bool) -> Case:
    big = 1 << 20 if quick else 16 << 20     # elements of the 1-D pointwise cases
    rows = 1024 if quick else 8192
    if name == "cos_cos":
        return Case(name, _cos_cos, (_randn(big),), f"{big}")
    if name == "chain10":
        return Case(name, _chain10, (_randn(big),), f"{big}")
    if name == "layernorm_gelu":
        return Case(name, _layernorm_gelu, (_randn(rows, 1024), _randn(1024), _randn(1024)), f"{rows}x1024")
    if name == "softmax":
        r = rows // 2
        return Case(name, _softmax, (_randn(r, 2048),), f"{r}x2048")
    if name == "rmsnorm_residual":
        return Case(name, _rmsnorm_residual, (_randn(rows, 1024), _randn(rows, 1024), _randn(1024)),
                    f"{rows}x1024")
    if name == "tiny_chain50":
        return Case(name, _tiny_chain50, (_randn(16),), "16")
    if name == "chain50_26in":
        return Case(name, _chain50_26in, tuple(_randn(16) for _ in range(26)), "26 x 16")
    if name == "gpt_block":
        return _gpt_block()
    if name == "kernels100":
        return Case(name, _kernels100, (_randn(64, 64),), "64x64")
    if name in bench_models.MODEL_CASES:
        return Case(name, *bench_models.build(name, quick, train=False))
    raise ValueError(f"unknown bench case {name!r}; choose from {', '.join(CASE_NAMES)}")


def _make_train(name: str, quick: bool) -> Case:
    """Training cases: a GPT block, an MLP with GELU, a LayerNorm-heavy stack and an MLP-Mixer block."""
    rows = 64 if quick else 256
    if name == "gpt_block_train":
        B, T, C, H = 4, 64, 128, 4
        return Case(name, Block(C, H, T), (_randn(B, T, C),), f"B{B} T{T} C{C} H{H}")
    if name == "mlp_gelu_train":
        return Case(name, MLP(512, 2048), (_randn(rows, 512),), f"{rows}x512, hidden 2048")
    if name == "norm_stack_train":
        return Case(name, NormStack(512, 3), (_randn(rows, 512),), f"{rows}x512, 3 layers")
    if name == "mixer_train":
        B, P, C = (2 if quick else 8), 64, 128
        return Case(name, MixerBlock(P, C), (_randn(B, P, C),), f"B{B} P{P} C{C}")
    if name.removesuffix("_train") in bench_models.MODEL_CASES:
        return Case(name, *bench_models.build(name.removesuffix("_train"), quick, train=True))
    raise ValueError(f"unknown training case {name!r}; choose from {', '.join(TRAIN_CASES)}")


CASE_NAMES = ("cos_cos", "chain10", "layernorm_gelu", "softmax", "rmsnorm_residual", "tiny_chain50", "chain50_26in",
              "gpt_block") + bench_models.MODEL_CASES
EXTRA_CASES = ("kernels100",)  # launch overhead: the GPU check's CUDA Graph measurement


TRAIN_CASES = ("gpt_block_train", "mlp_gelu_train", "norm_stack_train", "mixer_train") + tuple(
    f"{m}_train" for m in bench_models.MODEL_CASES)


def unavailable(name: str) -> str | None:
    """Why a case cannot run on this machine (a missing optional dependency), else None."""
    return bench_models.available(name.removesuffix("_train"))


def make_train_case(name: str, quick: bool = False) -> Case:
    torch.manual_seed(0)
    return _make_train(name, quick)


def make_case(name: str, quick: bool = False, device: str = "cpu") -> Case:
    torch.manual_seed(0)
    case = _make(name, quick)
    if device != "cpu":
        case.inputs = tuple(x.to(device) for x in case.inputs)
        if isinstance(case.fn, torch.nn.Module):
            case.fn = case.fn.to(device)
    return case
