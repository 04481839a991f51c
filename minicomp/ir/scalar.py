"""The scalar op table: one row per op a kernel body (ir/kernel.py) is made of. It is the contract
between kernel building (compiler/kernelize.py), the kernel interpreter (kernel_interpret.py) and the
code generators, whose per-op tables (codegen/llvm_ops.py, codegen/cuda_ops.py) are keyed by its names.

Each row gives
  kind      leaf (load, const, index, acc: no operands), index (clamp_index: a gathered position),
            pointwise (the tensor op table's op of that name, per element) or reduction
  result    (operand dtypes, attrs) -> result dtype, raising TypeError on operands the op does not
            take; pointwise and reduction rows read the tensor op table's rule (ops.py), leaves carry
            their own dtype (None)
  nan       what a NaN operand gives (the contract the backends and the table test keep)
  ref       (operand tensors, attrs, env, result dtype) -> tensor: the torch reference the kernel interpreter runs;
            env is the interpreter's evaluation (device, index grids, buffers, accumulators)
  identity  reductions: dtype -> the accumulator's start value
  combine   reductions: the pointwise row folding a value into the accumulator (argmax/argmin: the
            strict comparison that makes a value the new best)
  operand   the operand whose dtype the op computes in (where: its first branch, not the condition)

Primitive or composite. A composite (COMPOSITES) is built from primitive rows once, when a kernel is
built, so no backend lowers it: gelu and silu (their erf/tanh/sigmoid are then shared with the same
term of a backward's derivative, and counted once), frac = x - trunc(x) and reciprocal = 1 / x (the
very instructions and roundings the backends emitted for them). Kept primitive, with a recipe per
backend: the transcendentals, sigmoid included (the LLVM backend's vectorized polynomials in
llvm_math.py; exp and a division would be slower and round differently), rsqrt (CUDA's rsqrtf),
relu, sign and abs (one select or intrinsic each), the roundings, the integer divisions (torch's
exact rules, with the kernel's zero check) and pow (exact square-and-multiply for integers).

Adding an op = a row in ops.py (with its lowering in compiler/), a row here (or a composite), and one
entry in each backend's table, or its LEFT_TO_TORCH: `backend_ops` checks every backend's table when
its module loads, and names the op it lacks or does not know.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..errors import KernelIndexError
from .ops import OPS
from .types import DTYPES, FLOATS, TensorType


@dataclass(frozen=True)
class ScalarOp:
    name: str
    kind: str                                   # leaf | index | pointwise | reduction
    result: Callable[[tuple, dict], Optional[str]]
    nan: str
    ref: Callable[[list, dict, Any], Any]
    identity: Optional[Callable[[str], Any]] = None
    combine: Optional[str] = None
    operand: int = 0


SCALAR: dict[str, ScalarOp] = {}


def _row(name, kind, result, nan, ref, identity=None, combine=None, operand=0):
    SCALAR[name] = ScalarOp(name, kind, result, nan, ref, identity, combine, operand)


# ---- kernel-level ops: the leaves of a body and the checked gather position -------------------------

def _load(xs, a, env, dtype):
    idx = env.index(a["index"])
    if a.get("guard") is not None:  # a cat part outside its range reads element 0 (then discarded)
        idx = torch.where(env.value(a["guard"]), idx, torch.zeros_like(idx))
    return env.buf(a["buf"])[idx]


def _clamp_index(xs, a, env, dtype):
    i, size = xs[0].to(torch.int64), a["size"]
    bad = (i < 0) | (i >= size)
    if a.get("guard") is not None:  # a cat part read where it is not selected
        bad = bad & env.value(a["guard"])
    if bool(bad.any()):  # as eager, and as the CPU kernels report
        raise KernelIndexError(f"minicomp: index out of range in {a['where']} (a dimension of size {size})")
    return i.clamp(0, size - 1)  # where a guard discards the read, it still stays in memory


def _int_operand(ts, a):
    if ts[0] not in ("i64", "i32", "i16", "i8", "u8"):
        raise TypeError(f"clamp_index takes an integer position, not {ts[0]}")
    return "i64"


def _own(ts, a):
    return None  # a leaf's dtype is the expression's own, any of DTYPES


_row("load", "leaf", _own, "as stored", _load)
_row("const", "leaf", _own, "as written (a NaN constant is NaN)",
     lambda xs, a, env, dtype: torch.full([1] * env.ndim, a["value"], dtype=DTYPES[dtype], device=env.device))
_row("index", "leaf", _own, "none (an integer position)",
     lambda xs, a, env, dtype: env.index(a["expr"]).to(DTYPES[dtype]))
_row("acc", "leaf", _own, "the reduction's", lambda xs, a, env, dtype: env.acc(a["red"]))
_row("clamp_index", "index", _int_operand, "none (an integer position)", _clamp_index)

# ---- pointwise ops: the tensor op table's, element by element ------------------------------------------


def _pointwise_result(name):
    def result(ts, a):
        return OPS[name].infer(tuple(TensorType((), d) for d in ts), a).dtype
    return result


def _pointwise_ref(name):
    ref = OPS[name].ref
    return lambda xs, a, env, dtype: ref(xs, a, env.device)


_NAN = {
    **dict.fromkeys(("eq", "lt", "le", "gt", "ge", "isinf"), "false"),
    **dict.fromkeys(("ne", "isnan"), "true"),
    **dict.fromkeys(("logical_and", "logical_or", "logical_xor", "logical_not"), "true as an operand (NaN != 0)"),
    **dict.fromkeys(("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"), "none (integers)"),
    "sign": "0 (torch computes (x > 0) - (x < 0))",
    "pow": "propagates, but pow(x, 0) and pow(1, y) are 1",
    "where": "the chosen branch's",
    "cast": ("to a float: NaN; to b8: true; to an integer: torch's CPU route, truncation through i32 "
             "(i8, i16, i32) or i64 (u8, i64), NaN and out-of-range values giving that type's minimum"),
}


# ---- composites: built from primitives once, when a kernel is built (compiler/kernelize.py) -------------
# each is (build(mk, dtype, *operands, **attrs) -> KExpr, the rows it uses); mk(op, args, dtype, **attrs)

def _gelu(mk, dt, x, approximate="none"):
    """0.5*x * (1 + erf(x*sqrt(1/2))), or its tanh form: a backward that recomputes gelu(h) and computes
    gelu'(h) evaluates erf(h/sqrt 2) once, and it is counted once in the kernel's flops."""
    def c(v):
        return mk("const", (), dt, value=v)
    if approximate == "tanh":
        cube = mk("mul", (x, mk("mul", (x, x), dt)), dt)
        inner = mk("mul", (c(math.sqrt(2 / math.pi)), mk("add", (x, mk("mul", (c(0.044715), cube), dt)), dt)), dt)
        return mk("mul", (mk("mul", (c(0.5), x), dt), mk("add", (c(1.0), mk("tanh", (inner,), dt)), dt)), dt)
    cdf = mk("add", (mk("erf", (mk("mul", (x, c(math.sqrt(0.5))), dt),), dt), c(1.0)), dt)
    return mk("mul", (mk("mul", (c(0.5), x), dt), cdf), dt)


def _silu(mk, dt, x):
    """x * sigmoid(x): the sigmoid shared with silu's derivative in a backward kernel."""
    return mk("mul", (x, mk("sigmoid", (x,), dt)), dt)


def _frac(mk, dt, x):
    return mk("sub", (x, mk("trunc", (x,), dt)), dt)


def _reciprocal(mk, dt, x):
    return mk("div", (mk("const", (), dt, value=1.0), x), dt)


COMPOSITES: dict[str, tuple[Callable, frozenset]] = {
    "gelu": (_gelu, frozenset({"const", "mul", "add", "erf", "tanh"})),
    "silu": (_silu, frozenset({"mul", "sigmoid"})),
    "frac": (_frac, frozenset({"sub", "trunc"})),
    "reciprocal": (_reciprocal, frozenset({"const", "div"})),
}

for _n, _d in OPS.items():
    if _d.category == "pointwise" and _n not in COMPOSITES:
        _row(_n, "pointwise", _pointwise_result(_n), _NAN.get(_n, "propagates"), _pointwise_ref(_n),
             operand=1 if _n == "where" else 0)

# ---- reductions: over the inner axes, the accumulator starting at the identity ---------------------------


def _lowest(dt):
    return float("-inf") if dt in FLOATS else False if dt == "b8" else torch.iinfo(DTYPES[dt]).min


def _highest(dt):
    return float("inf") if dt in FLOATS else True if dt == "b8" else torch.iinfo(DTYPES[dt]).max


def _reduction_result(name):
    attrs = {"dim": 0, "keepdim": False} if name.startswith("arg") else {"dims": (0,), "keepdim": False}
    return lambda ts, a: OPS[name].infer((TensorType((1,), ts[0]),), attrs).dtype


def _over_inner(fn, arg=False):
    """ref([x], {"outer": n}, env, dtype): x (the full domain's shape) reduced over its dims past the
    first n, which stay as size-1 dims; an arg reduction with no such dims gives position 0."""
    def ref(xs, a, env, dtype):
        x, n = xs[0], a["outer"]
        dims = tuple(range(n, x.ndim))
        if arg:
            out = fn(x.reshape(*x.shape[:n], -1), dim=-1)
        else:
            out = fn(x, dims) if dims else x
        return out.reshape(list(out.shape) + [1] * len(dims))
    return ref


def _prod(x, dims):
    for d in reversed(dims):
        x = torch.prod(x, d)
    return x


for _n, _f, _ident, _comb, _nan in (
        ("sum", torch.sum, lambda dt: 0, "add", "propagates"),
        ("prod", _prod, lambda dt: 1, "mul", "propagates"),
        ("amax", torch.amax, _lowest, "maximum", "propagates"),
        ("amin", torch.amin, _highest, "minimum", "propagates"),
        ("argmax", torch.argmax, _lowest, "gt", "the first NaN is the extreme"),
        ("argmin", torch.argmin, _highest, "lt", "the first NaN is the extreme")):
    _row(_n, "reduction", _reduction_result(_n), _nan, _over_inner(_f, _n.startswith("arg")), _ident, _comb)


def takes(op: str, dtypes: tuple, attrs: dict | None = None) -> bool:
    """Whether row `op` takes operands of `dtypes`."""
    try:
        SCALAR[op].result(tuple(dtypes), attrs or {})
        return True
    except TypeError:
        return False


def operand_dtype(op: str, dtypes, own: str) -> str:
    """The dtype op computes in: that of its `operand`-th operand (a leaf: its own)."""
    return dtypes[SCALAR[op].operand] if dtypes else own


def backend_ops(backend: str, table: dict, left_to_torch=()) -> frozenset:
    """The tensor-level ops `backend` fuses into kernels, derived from the keys of its per-op `table`:
    the pointwise and reduction rows it has a recipe for, and the composites whose rows it has all.
    Raises ValueError naming the op when a key has no row here, a kernel-level op has no recipe, or a
    tensor-level pointwise or reduction op is neither fused nor in `left_to_torch`."""
    unknown = sorted(set(table) - set(SCALAR))
    if unknown:
        raise ValueError(f"minicomp: the {backend} backend has recipes for {unknown}, which the scalar op "
                         "table (ir/scalar.py) has no row for")
    leaves = sorted(op for op, r in SCALAR.items() if r.kind in ("leaf", "index") and op not in table)
    if leaves:
        raise ValueError(f"minicomp: the {backend} backend has no recipe for the kernel-level ops {leaves}")
    fused = {op for op in table if op in OPS}
    fused |= {name for name, (_, uses) in COMPOSITES.items() if uses <= set(table)}
    tensor = {n for n, d in OPS.items() if d.category in ("pointwise", "reduction")}
    missing = sorted(tensor - fused - set(left_to_torch))
    if missing:
        raise ValueError(f"minicomp: the {backend} backend has no recipe for {missing}: add one to its "
                         "table, or the op to its LEFT_TO_TORCH")
    both = sorted(fused & set(left_to_torch))
    if both:
        raise ValueError(f"minicomp: the {backend} backend both lowers and leaves to torch {both}")
    return frozenset(fused)


def _check_composites() -> None:
    for name, (_, uses) in COMPOSITES.items():
        if OPS[name].category != "pointwise" or not uses <= set(SCALAR):
            raise ValueError(f"minicomp: composite {name} uses {sorted(uses - set(SCALAR))}, not rows of the scalar table")


_check_composites()
