"""How the fuzzer judges a compiled program's results against eager's (fuzz.py).

A result matches when it is within its dtype's tolerance of eager's, relative to max(1, max |eager|)
(`compare`). One that does not is still no finding when it is as close as eager's to the same
program run in float64 (`as_close_as_eager`): rounding an ill-conditioned result amplifies (sin of
9e4, a cancellation) is in eager's result as much. Where eager's rounding happened to land near the
float64 result (a sum of 1e30 and -1e30 among small values, which one order of summation cancels
exactly and another does not), its distance says nothing of what rounding may do there: the float64
program run again on inputs each moved by one rounding of their dtype (`nudged`) measures how far
rounding alone moves that result, and a result within that of float64 is no finding either.

An integer result rounded from a float (round(tanh(v) * 100)) may sit at a tie that the rounding of
an intermediate decides: eager rounds v to f16 after each op, minicomp's kernel keeps f32 and
rounds once, and float64 never does. Moving the inputs does not show that (the tie may be closer to
v's rounding than to any input's). `rounding_each_op` runs the float64 program with every float
result of every torch call moved by up to one rounding of the program's coarsest float dtype; an
integer result minicomp gives within the range those runs and the float64 run span, element by
element, is one rounding can give, and no finding.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

TOL = {"f32": 1e-4, "f64": 1e-9, "f16": 2e-2, "bf16": 6e-2}  # of max(1, max |eager|): sums reassociate


def compare(got, want, what: str, coarsest: float = 0.0) -> str | None:
    """None when `got` matches eager's `want`; else what differs. `coarsest`: the tolerance of the least
    precise float type the program computes in (an f64 result of f32 math carries f32's rounding)."""
    if len(got) != len(want):
        return f"{what}: {len(got)} results, eager {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None or g is None:
            if (w is None) != (g is None):
                return f"{what}[{i}]: {g is None and 'no' or 'a'} result where eager has {w is None and 'none' or 'one'}"
            continue
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"{what}[{i}]: {g.dtype}{list(g.shape)} vs eager {w.dtype}{list(w.shape)}"
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return f"{what}[{i}]: {int((g != w).sum())} of {w.numel()} elements differ"
            continue
        g64, w64 = g.detach().double(), w.detach().double()
        if not torch.equal(torch.isnan(g64), torch.isnan(w64)):
            return f"{what}[{i}]: NaN where eager has none, or the reverse"
        inf = torch.isinf(w64)
        if not torch.equal(g64[inf], w64[inf]):
            return f"{what}[{i}]: an infinity differs"
        finite = torch.isfinite(w64) & torch.isfinite(g64)
        if not torch.equal(finite, torch.isfinite(w64)):
            return f"{what}[{i}]: inf where eager is finite"
        if finite.any():
            scale = max(1.0, w64[finite].abs().max().item())
            err = (g64[finite] - w64[finite]).abs().max().item()
            tol = {torch.float32: TOL["f32"], torch.float64: TOL["f64"], torch.float16: TOL["f16"],
                   torch.bfloat16: TOL["bf16"]}[w.dtype]
            tol = max(tol, coarsest)
            if err > tol * scale:
                return f"{what}[{i}]: max error {err:.3g} > {tol:g} x {scale:.3g}"
    return None


def nudged(inputs: list, seed: int) -> list:
    """The inputs in float64, each float element moved by up to one rounding of its own dtype
    (x * (1 + eps*u), u uniform in [-1, 1], drawn from `seed`); others as they are."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if x.is_floating_point():
            u = torch.rand(x.shape, generator=gen, dtype=torch.float64) * 2 - 1
            x64 = x.detach().double() * (1 + torch.finfo(x.dtype).eps * u)
            out.append(x64.requires_grad_(x.requires_grad))
        else:
            out.append(x.clone())
    return out


# ops whose results eager computes exactly (they move, pick, compare or round values): not moved
EXACT_OPS = frozenset(("cat", "stack", "clone", "contiguous", "index_select", "gather", "__getitem__", "where",
                       "flip", "roll", "repeat", "round", "floor", "ceil", "trunc", "fix", "sign", "abs", "neg",
                       "__neg__", "max", "min", "amax", "amin", "maximum", "minimum", "relu", "clamp", "clip",
                       "nan_to_num", "to", "type", "float", "double", "half", "bfloat16"))


class rounding_each_op(TorchFunctionMode):
    """Every float tensor a torch call returns multiplied by (1 + eps*u), u uniform in [-1, 1] from
    `seed`: a float64 run that rounds after each op as a program of dtype `eps` might, by up to one
    rounding. Not moved: views and in-place results (they share memory the program may write), and
    the results of EXACT_OPS (a rounded value moved off its integer would truncate to the next one)."""

    def __init__(self, eps: float, seed: int):
        super().__init__()
        self.eps, self.gen = eps, torch.Generator().manual_seed(seed)

    def _move(self, t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t._is_view() or not t.numel():
            return t
        u = torch.rand(t.shape, generator=self.gen, dtype=torch.float64).to(t.dtype) * 2 - 1
        return t * (1 + self.eps * u)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name.endswith("_") or name in EXACT_OPS or any(a is out for a in args):  # in place, exact
            return out
        return tree_map(self._move, out)


def as_close_as_eager(got: list, want: list, ref: list, moved: list | None = None,
                      rounded: list | None = None) -> bool:
    """Whether every float result minicomp gave is at most twice as far from a float64 run's (`ref`)
    as eager's: then a difference from eager beyond tolerance is rounding an ill-conditioned result
    amplifies (sin of 9e4, a cancellation), which eager's own result carries as much, not a bug.
    An integer or bool result may differ from eager's only where minicomp's is the one as close to
    the float64 run's (a float rounded at a tie: eager's f16 tanh(v) * 100 is 40.5 and rounds to 40,
    ours keeps f32 inside the kernel, 40.53, and rounds to 41 as float64 does). `moved`: the float64
    run on nudged inputs; a float result within twice eager's distance plus four times the distance
    rounding the inputs moves float64's result is as close as rounding allows (module note).
    `rounded`: float64 runs under rounding_each_op, each a list like `ref`; an integer result within
    the range they and `ref` span is one rounding an intermediate can give."""
    if len(got) != len(want) or len(ref) != len(want):
        return False
    moved = moved if moved is not None and len(moved) == len(ref) else [None] * len(ref)
    rounded = [run for run in rounded or () if len(run) == len(ref)]
    for i, (g, w, r, m) in enumerate(zip(got, want, ref, moved)):
        if g is None or w is None:
            continue
        if not w.is_floating_point():
            if r is None or r.shape != w.shape or r.is_floating_point():
                return False
            differ = g != w
            g64, w64, r64 = g.long(), w.long(), r.long()
            closer = (g64 - r64).abs() <= (w64 - r64).abs()
            runs = [run[i].long() for run in rounded if run[i] is not None and run[i].shape == r.shape
                    and not run[i].is_floating_point()]
            if runs:
                spread = torch.stack([r64, *runs])
                closer |= (spread.amin(0) <= g64) & (g64 <= spread.amax(0))
            if not closer[differ].all():
                return False
            continue
        if r is None or r.shape != w.shape:
            return False
        g64, w64, r64 = g.detach().double(), w.detach().double(), r.detach().double()
        finite = torch.isfinite(g64) & torch.isfinite(w64) & torch.isfinite(r64)
        if finite.any():
            mine = (g64[finite] - r64[finite]).abs().max().item()
            theirs = (w64[finite] - r64[finite]).abs().max().item()
            shift = 0.0
            if m is not None and m.shape == r.shape:  # where the nudge overflowed or made NaN: no allowance
                d = (m.detach().double() - r64)[finite]
                shift = d[torch.isfinite(d)].abs().max().item() if torch.isfinite(d).any() else 0.0
            if mine > 2 * theirs + 4 * shift:
                return False
    return True


