"""Which ATen ops AOTAutograd decomposes before minicomp lowers its graphs (capture.py).

Core ATen's decompositions, less the ops minicomp lowers whole and a few more:
- Ops the front end lowers to the same IR their decompositions would give (views, silu, a
  slice's gradient, and the backward formulas of layer_norm, gelu, silu and tanh, spelled out in
  lower_reduce.py, lower_pointwise.py and lower_index.py). A decomposition is traced on fake
  tensors op by op, each level of it (`t` -> `transpose` -> `permute`): 0.2-1 ms an op, where
  lowering the op whole costs tens of microseconds. They were 0.15-0.21 s of a 2-layer HF GPT-2,
  BERT or Llama training step's trace (layer_norm's backward alone 17 ms a call) and 30-50 ms of
  an inference trace.
- Inference graphs keep layer_norm whole too (`for_inputs`). Training graphs get its arithmetic:
  the partitioner can then recompute its output from the saved mean and rstd (one torch op is
  recomputed whole or not at all, and the whole op includes two reductions). That arithmetic is
  torch._refs' spelled out without its checks and wrappers (`_layer_norm`): 5 ms a call to trace
  where the reference took 10.
- Ops that run better as themselves: ATen's CPU flash attention (its decomposition returns the
  attention weights where its backward expects the logsumexp; lower_nn.py lowers it whole), the
  embedding's gradient (ATen's embedding_dense_backward adds rows in place; its decomposition
  copies a zero table through an out-of-place index_put: 9 ms a step on HF Llama's 8192 x 960
  table), index_add/index_copy/index_fill (their decompositions take negative indices, which
  eager's ops refuse with IndexError).

A training graph's backward compiles lazily, at its first backward() (AOTAutograd's default, which
Inductor keeps too). Compiling it with the forward (AOTAutograd's force_non_lazy_backward_lowering)
was tried and measured: HF GPT-2's first training step was no sooner (median of 6 cold steps 6.2 s
against 5.8 s lazy: the backward's code generation only moved into the forward's first call), and
a forward under grad mode whose backward is never called -- inference outside no_grad -- paid for a
backward compile all the same (0.4 s of its 5 s first call).
"""
from __future__ import annotations

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd

aten = torch.ops.aten

# lowered whole by the front end (lower_view.py, lower_reduce.py, lower_pointwise.py, lower_index.py)
LOWERED_WHOLE = (aten.t.default, aten.transpose.int, aten._unsafe_view.default, aten.detach.default,
                 aten.split.Tensor, aten.unbind.int, aten.squeeze.default, aten.squeeze.dim,
                 aten.silu.default, aten.native_layer_norm_backward.default, aten.gelu_backward.default,
                 aten.silu_backward.default, aten.tanh_backward.default, aten.slice_backward.default)
RUN_AS_THEMSELVES = (aten._scaled_dot_product_flash_attention_for_cpu.default, aten.embedding_dense_backward.default,
                     *(getattr(op, name) for op in (aten.index_add, aten.index_add_, aten.index_copy, aten.index_copy_,
                                                    aten.index_fill, aten.index_fill_) for name in op.overloads()))


def _layer_norm(x, normalized_shape, weight, bias, eps):
    """native_layer_norm as torch._refs spells it (statistics in f32 for low precision, and on CPU
    in the input's dtype after), without its checks and wrappers: half the time to trace."""
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    acc = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
    var, mean = torch.var_mean(acc, dim=dims, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = (acc - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    if x.device.type == "cpu":
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    return out.to(x.dtype), mean, rstd


TRAINING = core_aten_decompositions()
TRAINING[aten.native_layer_norm.default] = _layer_norm
for _op in LOWERED_WHOLE + RUN_AS_THEMSELVES:
    TRAINING.pop(_op, None)
INFERENCE = {op: fn for op, fn in TRAINING.items() if op is not aten.native_layer_norm.default}


def for_inputs(example_inputs) -> dict:
    """The table for a graph AOTAutograd will compile with these inputs: INFERENCE where it will
    trace no backward (grad mode off, or no input requiring grad), else TRAINING. A graph that
    turns grad mode on inside gets a backward under INFERENCE's table all the same, which is
    correct (the front end lowers layer_norm and its backward whole), only cut less finely."""
    if not torch.is_grad_enabled():
        return INFERENCE
    needs_grad = any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    return TRAINING if needs_grad else INFERENCE


def aot_backend(**compilers):
    """A Dynamo backend running AOTAutograd with `compilers` (aot_autograd's keywords) and the
    table `for_inputs` gives each graph: how capture.py compiles, and what the benchmark's and the
    tests' traces run."""
    by_table = {id(table): aot_autograd(decompositions=table, **compilers) for table in (TRAINING, INFERENCE)}
    return lambda gm, example_inputs: by_table[id(for_inputs(example_inputs))](gm, example_inputs)
