"""The one test helper: run a function eagerly and compiled, compare outputs and gradients."""
from __future__ import annotations

import copy

import torch
import torch.utils._pytree as pytree

import minicomp


def gelu_at_inf(x: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Eager gelu(+inf) is NaN in torch's vectorized CPU path and +inf in its scalar tail (and in
    exact math) -- which element takes which path depends on the machine's vector width. minicomp
    always gives +inf, so references computed by eager gelu are corrected where x is +inf."""
    return torch.where(x == float("inf"), x.to(want.dtype), want)


def _tols(dtype):
    return {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}.get(dtype, (1e-5, 1e-5))


def _assert_close(actual, expected, what, rtol=None, atol=None):
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"{what}: output structure {a_spec} != eager's {e_spec}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{what}[{i}]: got {type(a).__name__}, eager gave a tensor"
            assert a.dtype == e.dtype, f"{what}[{i}]: dtype {a.dtype} != eager's {e.dtype}"
            r, t = _tols(e.dtype)
            torch.testing.assert_close(a, e, rtol=rtol or r, atol=atol or t, equal_nan=True,
                                       msg=lambda m: f"{what}[{i}]: {m}")
        else:
            assert a == e, f"{what}[{i}]: {a!r} != eager's {e!r}"


def assert_matches_eager(fn, *inputs, backend="interpret", grad=None, rtol=None, atol=None, calls=1, **compile_kw):
    """Compile `fn` (module or function), run it on `inputs`, compare with eager: outputs, and when
    anything requires grad (inputs or parameters), the gradients of sum(outputs * fixed weights),
    the weights made on each output's device in its dtype (a CUDA model's outputs are on the GPU).
    `calls`: call the compiled callable that many times, each on new values (floating inputs scaled
    by 1 + call/4: the same signs, no recompile), comparing every call -- on `cuda` the second call
    captures a CUDA Graph and the third replays it. Returns the compiled callable, for further
    checks (report, kernel counts)."""
    eager_fn = fn
    comp_fn = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    compiled = minicomp.compile(comp_fn, backend=backend, **compile_kw)
    for call in range(calls):
        scaled = inputs if call == 0 else pytree.tree_map(
            lambda x: (x.detach() * (1 + call / 4)).requires_grad_(x.requires_grad)
            if isinstance(x, torch.Tensor) and x.is_floating_point() else x, inputs)
        _compare(eager_fn, comp_fn, compiled, scaled, grad, rtol, atol, f"call {call + 1}: " if calls > 1 else "")
    return compiled


def _compare(eager_fn, comp_fn, compiled, inputs, grad, rtol, atol, what):
    def clone(xs):
        return pytree.tree_map(lambda x: x.detach().clone().requires_grad_(x.requires_grad)
                               if isinstance(x, torch.Tensor) else x, xs)
    e_in, c_in = clone(inputs), clone(inputs)
    expected = eager_fn(*e_in)
    actual = compiled(*c_in)
    _assert_close(actual, expected, what + "output", rtol, atol)

    params_e = list(eager_fn.parameters()) if isinstance(eager_fn, torch.nn.Module) else []
    params_c = list(comp_fn.parameters()) if isinstance(comp_fn, torch.nn.Module) else []
    leaves_e = [x for x in pytree.tree_leaves(e_in) if isinstance(x, torch.Tensor) and x.requires_grad] + params_e
    leaves_c = [x for x in pytree.tree_leaves(c_in) if isinstance(x, torch.Tensor) and x.requires_grad] + params_c
    want_grad = grad if grad is not None else any(x.requires_grad for x in leaves_e)
    if want_grad:
        outs_e = [o for o in pytree.tree_leaves(expected) if isinstance(o, torch.Tensor) and o.requires_grad]
        outs_c = [o for o in pytree.tree_leaves(actual) if isinstance(o, torch.Tensor) and o.requires_grad]
        assert len(outs_e) == len(outs_c) and outs_e, "no differentiable outputs to compare gradients on"
        gen = torch.Generator().manual_seed(0)  # drawn on the CPU (the same numbers on every device), then
        weights = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs_e]  # moved
        loss_e = sum((o * w).sum() for o, w in zip(outs_e, weights))
        loss_c = sum((o * w).sum() for o, w in zip(outs_c, weights))
        ge = torch.autograd.grad(loss_e, [x for x in leaves_e], allow_unused=True)
        gc = torch.autograd.grad(loss_c, [x for x in leaves_c], allow_unused=True)
        _assert_close(list(gc), list(ge), what + "grad", rtol, atol)
