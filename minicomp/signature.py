"""A call's signature: the key a CompiledModule keeps a program under (api.py), how two keys differ
(the dimensions a symbolic program takes), and how the report describes calls, programs and
Dynamo's reasons.
"""
from __future__ import annotations

import os
import re

import torch
import torch.utils._pytree as pytree

from .ir.types import DTYPE_NAMES

SCALARS = (bool, int, float, str, type(None))  # Dynamo specializes on their values (static tracing)


def all_tensors(args) -> bool:
    for x in args:
        if not isinstance(x, torch.Tensor):
            return False
    return True


def call_signature(model, args, kwargs) -> tuple:
    """A call's key: (kind, grad mode, module training flag, one entry per input). A tensor's entry is
    (shape, stride, dtype, device, requires_grad); kind "tensors" when every input is a positional
    tensor, else ("tree", its pytree structure) with the inputs flattened (kwargs, lists, scalars:
    a scalar's entry is its type and value, another object's its type)."""
    training = model.training if isinstance(model, torch.nn.Module) else None
    if not kwargs and all_tensors(args):  # the common case, without pytree (this runs on every call)
        return ("tensors", torch.is_grad_enabled(), training,
                *[(x.shape, x.stride(), x.dtype, x.device, x.requires_grad) for x in args])
    leaves, spec = pytree.tree_flatten((args, kwargs))
    key = [("tree", str(spec)), torch.is_grad_enabled(), training]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            key.append((x.shape, x.stride(), x.dtype, x.device, x.requires_grad))
        elif isinstance(x, SCALARS):
            key.append(("value", type(x), x))
        else:
            key.append(("type", type(x)))
    return tuple(key)


def flat_inputs(args, kwargs) -> list:
    """The call's inputs in signature order (what the dimensions of a program's `dims` index)."""
    if not kwargs and all_tensors(args):
        return list(args)
    return pytree.tree_leaves((args, kwargs))


def _is_tensor_entry(entry) -> bool:
    return isinstance(entry[0], tuple)  # a shape; other entries start with "value" or "type"


def changed_dims(a: tuple, b: tuple):
    """The (input, dimension) pairs where two signatures differ in size, when they differ in nothing
    else (structure, scalars, dtypes, devices, ranks, grad mode, contiguity); else None."""
    if a[0] == "dynamic" or b[0] == "dynamic" or len(a) != len(b) or a[:3] != b[:3]:
        return None
    dims = set()
    for i, (x, y) in enumerate(zip(a[3:], b[3:])):
        if not (_is_tensor_entry(x) and _is_tensor_entry(y)):
            if x != y:
                return None
            continue
        if x[2:] != y[2:] or len(x[0]) != len(y[0]):
            return None
        dims.update((i, d) for d, (p, q) in enumerate(zip(x[0], y[0])) if p != q)
        if _contiguous(x) != _contiguous(y):
            return None
    return frozenset(dims) or None


def _contiguous(entry) -> bool:
    shape, stride = entry[0], entry[1]
    want = 1
    for s, st in reversed(list(zip(shape, stride))):
        if s != 1 and st != want:
            return False
        want *= s
    return True


def wild(key: tuple, dims: frozenset) -> tuple:
    """A signature with the sizes of `dims` (and those tensors' strides) left out."""
    out = list(key[:3])
    for i, entry in enumerate(key[3:]):
        if _is_tensor_entry(entry) and any(a == i for a, _ in dims):
            shape, stride, *rest = entry
            entry = (tuple(None if (i, d) in dims else s for d, s in enumerate(shape)), _contiguous(entry), *rest)
        out.append(entry)
    return ("dynamic", frozenset(dims), *out)


def program_line(key, dims, args, kwargs, dynamic) -> str:
    """A program's line in the report: what it was compiled for, and why it was needed."""
    call = describe(args, kwargs) + (" in eval mode" if key[2] is False else "") + ("" if key[1] else " under no_grad")
    if not dims:
        return f"static, for the call {call}" + (" (dynamic=False)" if dynamic is False else "")
    where = ", ".join(f"{'argument' if key[0] == 'tensors' else 'input'} {i} dim {d}" for i, d in sorted(dims))
    if key[0] != "tensors":
        where += " (inputs: the args, then the kwargs, flattened)"
    why = "dynamic=True" if dynamic is True else "its sizes differed from a compiled signature's only there"
    return f"symbolic in {where} ({why}; first call {call})"


def describe(args, kwargs) -> str:
    """A call's signature as a user reads it: `(f32[4, 8] grad, i64[4], 2)`."""
    def one(x):
        if isinstance(x, torch.Tensor):
            dt = DTYPE_NAMES.get(x.dtype, str(x.dtype))  # the IR's names, as the report prints types
            extra = (" grad" if x.requires_grad else "") + ("" if x.device.type == "cpu" else f" {x.device}")
            extra += "" if x.is_contiguous() else f" strides={tuple(x.stride())}"
            return f"{dt}[{', '.join(map(str, x.shape))}]{extra}"
        return repr(x) if isinstance(x, SCALARS) else type(x).__name__
    parts = [one(x) for x in pytree.tree_leaves(args)] + [f"{k}={one(v)}" for k, v in kwargs.items()
                                                          if not isinstance(v, (list, tuple, dict))]
    return f"({', '.join(parts)})"


# where Dynamo says a guard was made, when that is minicomp's own code handing it a decision (sizes.py)
_OUR_GUARD = re.compile(r"\s*#\s*\([^()]*minicomp/compiler/sizes\.py:\d+ in on_guard\)")


def short_reason(reason: str) -> str:
    """Dynamo's graph-break reasons run to a dozen lines; keep the first and the explanation, or
    where that is empty the developer context (what the op said: "argument 'is_causal' must be
    bool, not SymBool")."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    for label in ("Explanation:", "Developer debug context:"):
        why = next((ln[len(label):].strip() for ln in lines[1:] if ln.startswith(label)), "")
        if why:
            return f"{lines[0]} ({why})"
    return lines[0]


def guard_failure(reason) -> str:
    """One of Dynamo's recorded guard failures, short; a guard minicomp's compile made says so."""
    return _OUR_GUARD.sub("  # a guard of minicomp's compile", re.sub(r"^\d+/\d+: ", "", short_reason(str(reason))))


_OURS = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def break_site(user_stack) -> str:
    """` at file.py:12 in forward `y = f(x)`: the innermost frame of Dynamo's stack for a graph
    break that is the user's (not minicomp's entry, not torch's), else the innermost outside
    minicomp (a break inside torch's optimizer); '' where there is none."""
    frames = [fs for fs in (user_stack or ()) if not os.path.abspath(fs.filename).startswith(_OURS)]
    user = [fs for fs in frames if not os.path.abspath(fs.filename).startswith(_TORCH)]
    fs = (user or frames or [None])[-1]
    if fs is None:
        return ""
    code = f" `{fs.line.strip()}`" if fs.line else ""
    return f" at {os.path.basename(fs.filename)}:{fs.lineno} in {fs.name}{code}"
