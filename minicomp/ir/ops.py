"""The op table: one row per IR op. Printer, verifier, interpreter, cost model and code generators
all read it; adding an op means adding a row here and a lowering in `compiler/frontend.py` (and, for a
pointwise or reduction op a kernel computes, its row in ir/scalar.py and an entry in each backend's table).

Each row gives
  category  pointwise | reduction | view | data | creation | matmul | extern | tuple
  infer     (arg types, attrs) -> result type; raises TypeError with the reason on bad operands
  ref       (arg tensors, attrs, device) -> tensor: the torch reference `interpret` runs
  flops     (result type, arg types, attrs) -> float operations, for the cost model
Pointwise ops are strict about dtypes (both operands of `add` have one dtype); the front end inserts
`cast` nodes where torch's type promotion would, so the IR states every conversion it does.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from . import sym
from .types import DTYPES, FLOATS, INTS, TensorType, broadcast_shapes


@dataclass(frozen=True)
class OpDef:
    name: str
    category: str
    infer: Callable[[tuple, dict], Any]
    ref: Callable[[list, dict, Any], Any]
    flops: Callable[[Any, tuple, dict], float]
    arity: Optional[int] = None      # None: variadic
    attrs: tuple[str, ...] = ()      # required attribute names
    cost: float = 1.0                # per-element cost weight of a pointwise op (transcendentals > 1)


OPS: dict[str, OpDef] = {}


def _add(name, category, infer, ref, flops, arity=None, attrs=(), cost=1.0):
    OPS[name] = OpDef(name, category, infer, ref, flops, arity, attrs, cost)


def _check_kind(op: str, dtype: str, kinds: str) -> None:
    ok = {"any": True, "float": dtype in FLOATS, "int": dtype in INTS or dtype == "b8",
          "num": dtype != "b8", "bool": dtype == "b8"}[kinds]
    if not ok:
        raise TypeError(f"{op} does not take {dtype} operands (wants {kinds})")


# ---- pointwise -------------------------------------------------------------------------------------

def _elementwise_flops(cost):
    return lambda out, ins, attrs: out.numel * cost


def _unary(name, ref, kinds="any", out_dtype=None, cost=1.0, attrs=()):
    def infer(ts, a):
        _check_kind(name, ts[0].dtype, kinds)
        return TensorType(ts[0].shape, out_dtype or ts[0].dtype)
    _add(name, "pointwise", infer, lambda xs, a, d: ref(xs[0], **a), _elementwise_flops(cost), 1, attrs, cost)


def _div_trunc(x, y):
    """torch's trunc division, except that integers by -1 negate (wrapping): eager's own integer
    path traps (SIGFPE) on the most negative value / -1, where its floor division wraps."""
    if x.dtype.is_floating_point or not x.dtype.is_signed:
        return torch.div(x, y, rounding_mode="trunc")
    by_minus1 = y == -1
    return torch.where(by_minus1, -x, torch.div(x, torch.where(by_minus1, torch.ones_like(y), y), rounding_mode="trunc"))


def _binary(name, ref, kinds="any", out_dtype=None, cost=1.0):
    def infer(ts, a):
        x, y = ts
        if x.dtype != y.dtype:
            raise TypeError(f"{name} operands have dtypes {x.dtype} and {y.dtype}; insert a cast")
        _check_kind(name, x.dtype, kinds)
        return TensorType(broadcast_shapes(x.shape, y.shape), out_dtype or x.dtype)
    _add(name, "pointwise", infer, lambda xs, a, d: ref(xs[0], xs[1]), _elementwise_flops(cost), 2, (), cost)


for _n in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
           "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid", "erf", "erfc", "erfinv"):
    _unary(_n, getattr(torch, _n), "float", cost=8.0)
for _n in ("sqrt", "rsqrt", "reciprocal"):
    _unary(_n, getattr(torch, _n), "float", cost=2.0)
for _n in ("floor", "ceil", "round", "trunc", "frac"):
    _unary(_n, getattr(torch, _n), "float")
_unary("neg", torch.neg, "num")
_unary("abs", torch.abs, "num")
_unary("sign", torch.sign, "num")
_unary("relu", torch.relu, "num")
# a fresh copy: what the front end makes of clone() when the value it would return is a graph input
# (an IR value is a logical tensor, so clone is otherwise nothing), where returning the input itself
# would alias what the caller gave
_unary("copy", torch.clone, "any", cost=0.0)
_unary("silu", F.silu, "float", cost=8.0)
_unary("gelu", lambda x, approximate: F.gelu(x, approximate=approximate), "float", cost=12.0,
       attrs=("approximate",))
_unary("bitwise_not", torch.bitwise_not, "int")
_unary("logical_not", torch.logical_not, "any", out_dtype="b8")
_unary("isnan", torch.isnan, "any", out_dtype="b8")
_unary("isinf", torch.isinf, "any", out_dtype="b8")


def _cast_infer(ts, a):
    if a["dtype"] not in DTYPES:
        raise TypeError(f"cast to unknown dtype {a['dtype']!r}")
    return TensorType(ts[0].shape, a["dtype"])


_add("cast", "pointwise", _cast_infer, lambda xs, a, d: xs[0].to(DTYPES[a["dtype"]]),
     _elementwise_flops(0), 1, ("dtype",), 0.0)

for _n, _f in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("maximum", torch.maximum),
               ("minimum", torch.minimum), ("remainder", torch.remainder), ("fmod", torch.fmod)):
    _binary(_n, _f, "num")
_binary("div", torch.div, "float", cost=2.0)
_binary("div_floor", lambda x, y: torch.div(x, y, rounding_mode="floor"), "num", cost=2.0)
_binary("div_trunc", lambda x, y: _div_trunc(x, y), "num", cost=2.0)
_binary("pow", torch.pow, "num", cost=16.0)
_binary("atan2", torch.atan2, "float", cost=16.0)
for _n in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _binary(_n, getattr(torch, _n), "int")
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    _binary(_n, getattr(torch, _n), "any", out_dtype="b8")
for _n in ("logical_and", "logical_or", "logical_xor"):
    _binary(_n, getattr(torch, _n), "any", out_dtype="b8")


def _where_infer(ts, a):
    c, x, y = ts
    if c.dtype != "b8":
        raise TypeError(f"where condition has dtype {c.dtype}, wants b8")
    if x.dtype != y.dtype:
        raise TypeError(f"where branches have dtypes {x.dtype} and {y.dtype}; insert a cast")
    return TensorType(broadcast_shapes(c.shape, x.shape, y.shape), x.dtype)


_add("where", "pointwise", _where_infer, lambda xs, a, d: torch.where(*xs), _elementwise_flops(1), 3)

# ---- reductions ------------------------------------------------------------------------------------


def _check_dims(op, shape, dims):
    if len(set(dims)) != len(dims) or any(not 0 <= d < max(len(shape), 1) for d in dims):
        raise TypeError(f"{op}: dims {dims} invalid for shape {shape}")
    if len(shape) == 0 and dims:
        raise TypeError(f"{op}: a 0-d tensor has no dims to reduce")


def _reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _reduce(name, torch_fn, kinds="any", out_dtype=None):
    def infer(ts, a):
        x = ts[0]
        _check_kind(name, x.dtype, kinds)
        dims = tuple(a["dims"])
        _check_dims(name, x.shape, dims)
        if dims and any(x.shape[d] == 0 for d in dims) and name in ("amax", "amin"):
            raise TypeError(f"{name} of an empty dim has no identity")
        return TensorType(_reduced_shape(x.shape, dims, a["keepdim"]), out_dtype or x.dtype)

    def ref(xs, a, d):
        x, dims = xs[0], tuple(a["dims"])
        if not dims:
            return x.clone()
        return torch_fn(x, dims, a["keepdim"])
    _add(name, "reduction", infer, ref, lambda out, ins, a: ins[0].numel, 1, ("dims", "keepdim"))


def _prod(x, dims, keepdim):
    for dim in sorted(dims, reverse=True):
        x = torch.prod(x, dim, keepdim=keepdim, dtype=x.dtype)  # torch would widen integers to i64
    return x


_reduce("sum", lambda x, dims, k: torch.sum(x, dims, keepdim=k, dtype=x.dtype), "num")
_reduce("prod", _prod, "num")
_reduce("amax", lambda x, dims, k: torch.amax(x, dims, keepdim=k))
_reduce("amin", lambda x, dims, k: torch.amin(x, dims, keepdim=k))


def _arg_reduce(name, torch_fn):
    def infer(ts, a):
        x = ts[0]
        _check_kind(name, x.dtype, "num")
        _check_dims(name, x.shape, (a["dim"],))
        if x.shape[a["dim"]] == 0:
            raise TypeError(f"{name} of an empty dim")
        return TensorType(_reduced_shape(x.shape, (a["dim"],), a["keepdim"]), "i64")
    _add(name, "reduction", infer, lambda xs, a, d: torch_fn(xs[0], a["dim"], a["keepdim"]),
         lambda out, ins, a: ins[0].numel, 1, ("dim", "keepdim"))


_arg_reduce("argmax", torch.argmax)
_arg_reduce("argmin", torch.argmin)

# ---- views: index math on the operand, never a copy --------------------------------------------------


def _reshape_infer(ts, a):
    shape = tuple(a["shape"])
    count, numel = math.prod(shape), ts[0].numel
    differ = count != numel if isinstance(count, int) and isinstance(numel, int) else sym.known(count, "!=", numel)
    if any(s < 0 for s in shape) or differ:  # symbolic counts torch made equal (3*(n//3) and n): only a sure difference
        raise TypeError(f"reshape of {ts[0]} to {shape}: element counts differ")
    return TensorType(shape, ts[0].dtype)


def _permute_infer(ts, a):
    dims = tuple(a["dims"])
    if sorted(dims) != list(range(ts[0].ndim)):
        raise TypeError(f"permute dims {dims} is not a permutation of {ts[0].ndim} dims")
    return TensorType(tuple(ts[0].shape[d] for d in dims), ts[0].dtype)


def _expand_infer(ts, a):
    x, shape = ts[0], tuple(a["shape"])
    lead = len(shape) - x.ndim
    if lead < 0 or any(s != 1 and s != shape[lead + i] for i, s in enumerate(x.shape)):
        raise TypeError(f"expand of {x} to {shape}: sizes do not match")
    return TensorType(shape, x.dtype)


def _slice_infer(ts, a):
    x = ts[0]
    dim, start, end, step = a["dim"], a["start"], a["end"], a["step"]
    if not (0 <= dim < x.ndim and 0 <= start <= end <= x.shape[dim] and step >= 1):
        raise TypeError(f"slice [dim={dim}, start={start}, end={end}, step={step}] out of range for {x}")
    shape = list(x.shape)
    shape[dim] = (end - start + step - 1) // step
    return TensorType(tuple(shape), x.dtype)


_add("reshape", "view", _reshape_infer, lambda xs, a, d: xs[0].reshape(a["shape"]),
     lambda *_: 0, 1, ("shape",))
_add("permute", "view", _permute_infer, lambda xs, a, d: xs[0].permute(a["dims"]),
     lambda *_: 0, 1, ("dims",))
_add("expand", "view", _expand_infer, lambda xs, a, d: xs[0].expand(a["shape"]),
     lambda *_: 0, 1, ("shape",))
_add("slice", "view", _slice_infer,
     lambda xs, a, d: torch.ops.aten.slice.Tensor(xs[0], a["dim"], a["start"], a["end"], a["step"]),
     lambda *_: 0, 1, ("dim", "start", "end", "step"))

# ---- data movement: gathers and concatenation ---------------------------------------------------------


def _cat_infer(ts, a):
    dim = a["dim"]
    first = ts[0]
    for t in ts:
        if t.dtype != first.dtype or t.ndim != first.ndim or not 0 <= dim < t.ndim or any(
                s != f for i, (s, f) in enumerate(zip(t.shape, first.shape)) if i != dim):
            raise TypeError(f"cat along dim {dim} of {', '.join(map(str, ts))}: shapes or dtypes differ")
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in ts)
    return TensorType(tuple(shape), first.dtype)


def _gather_infer(ts, a):
    x, idx = ts
    if idx.dtype not in ("i64", "i32") or idx.ndim != x.ndim or not 0 <= a["dim"] < max(x.ndim, 1):
        raise TypeError(f"gather of {x} by {idx} along dim {a['dim']}: wants an integer index of equal rank")
    return TensorType(idx.shape, x.dtype)


def _index_select_infer(ts, a):
    x, idx = ts
    if idx.dtype not in ("i64", "i32") or idx.ndim != 1 or not 0 <= a["dim"] < x.ndim:
        raise TypeError(f"index_select of {x} by {idx} along dim {a['dim']}: wants a 1-d integer index")
    shape = list(x.shape)
    shape[a["dim"]] = idx.shape[0]
    return TensorType(tuple(shape), x.dtype)


_add("cat", "data", _cat_infer, lambda xs, a, d: torch.cat(xs, a["dim"]), lambda *_: 0, None, ("dim",))
_add("gather", "data", _gather_infer, lambda xs, a, d: torch.gather(xs[0], a["dim"], xs[1]),
     lambda *_: 0, 2, ("dim",))
_add("index_select", "data", _index_select_infer,
     lambda xs, a, d: torch.index_select(xs[0], a["dim"], xs[1]), lambda *_: 0, 2, ("dim",))

# ---- creation ----------------------------------------------------------------------------------------


def _full_ref(xs, a, device):
    return torch.full(tuple(a["shape"]), a["value"], dtype=DTYPES[a["dtype"]], device=device)


def _iota_ref(xs, a, device):
    shape, dim = tuple(a["shape"]), a["dim"]
    acc = torch.float64 if a["dtype"] in FLOATS else torch.int64  # eager's arange accumulates in double
    r = torch.arange(shape[dim], device=device, dtype=acc) * a["step"] + a["start"]
    r = r.to(DTYPES[a["dtype"]]).reshape([-1 if i == dim else 1 for i in range(len(shape))])
    return r.expand(shape).contiguous()


def _iota_infer(ts, a):
    if not 0 <= a["dim"] < len(a["shape"]):
        raise TypeError(f"iota dim {a['dim']} out of range for shape {tuple(a['shape'])}")
    return TensorType(tuple(a["shape"]), a["dtype"])


_add("full", "creation", lambda ts, a: TensorType(tuple(a["shape"]), a["dtype"]), _full_ref,
     lambda *_: 0, 0, ("shape", "value", "dtype"))
_add("iota", "creation", _iota_infer, _iota_ref, lambda *_: 0, 0, ("shape", "dim", "start", "step", "dtype"))
# a captured tensor attribute; its data lives in graph.constants[name], its type is the node's own
_add("constant", "creation", lambda ts, a: None, lambda xs, a, d: None, lambda *_: 0, 0, ("name",))

# ---- matmul and convolution: extern calls into BLAS/cuDNN in every backend -----------------------------


def _mm_infer(ts, a):
    x, y = ts
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[0] or x.dtype != y.dtype:
        raise TypeError(f"mm of {x} and {y}: wants [M,K] x [K,N] of one dtype")
    return TensorType((x.shape[0], y.shape[1]), x.dtype)


def _bmm_infer(ts, a):
    x, y = ts
    if x.ndim != 3 or y.ndim != 3 or x.shape[0] != y.shape[0] or x.shape[2] != y.shape[1] or x.dtype != y.dtype:
        raise TypeError(f"bmm of {x} and {y}: wants [B,M,K] x [B,K,N] of one dtype")
    return TensorType((x.shape[0], x.shape[1], y.shape[2]), x.dtype)


def _conv_ref(xs, a, device):
    bias = xs[2] if len(xs) > 2 else None
    return torch.ops.aten.convolution(xs[0], xs[1], bias, a["stride"], a["padding"], a["dilation"],
                                      a["transposed"], a["output_padding"], a["groups"])


def _conv_infer(ts, a):
    if len(ts) not in (2, 3) or len({t.dtype for t in ts}) != 1:
        raise TypeError(f"conv of {', '.join(map(str, ts))}: wants input, weight[, bias] of one dtype")
    metas = [torch.empty(t.shape, dtype=DTYPES[t.dtype], device="meta") for t in ts]
    return TensorType.of(_conv_ref(metas, a, "meta"))


def _conv_flops(out, ins, a):
    w = ins[1]
    per_out = math.prod(w.shape[1:]) if not a["transposed"] else w.shape[0] // a["groups"] * math.prod(w.shape[2:])
    return 2 * out.numel * per_out


_add("mm", "matmul", _mm_infer, lambda xs, a, d: torch.mm(*xs),
     lambda out, ins, a: 2 * out.numel * ins[0].shape[1], 2)
_add("bmm", "matmul", _bmm_infer, lambda xs, a, d: torch.bmm(*xs),
     lambda out, ins, a: 2 * out.numel * ins[0].shape[2], 2)
_add("conv", "matmul", _conv_infer, _conv_ref, _conv_flops, None,
     ("stride", "padding", "dilation", "transposed", "output_padding", "groups"))


def _conv_cl_ref(xs, a, device):
    """conv over channels-last data: input [N,H,W,C], weight [O,kh,kw,C/groups] and result
    [N,H',W',O], contiguous (oneDNN's preferred layout on CPU; passes/channels_last.py puts it in)."""
    y = _conv_ref([xs[0].permute(0, 3, 1, 2), xs[1].permute(0, 3, 1, 2), *xs[2:]], a, device)
    return y.permute(0, 2, 3, 1).contiguous()


def _conv_cl_infer(ts, a):
    if len(ts) < 2 or len(ts[0].shape) != 4 or len(ts[1].shape) != 4:
        raise TypeError(f"conv_cl of {', '.join(map(str, ts))}: wants a 4-d [N,H,W,C] input and [O,kh,kw,C] weight")
    nchw = [TensorType(tuple(t.shape[d] for d in (0, 3, 1, 2)), t.dtype) for t in ts[:2]]
    out = _conv_infer(nchw + list(ts[2:]), a)
    return TensorType((out.shape[0], out.shape[2], out.shape[3], out.shape[1]), out.dtype)


_add("conv_cl", "matmul", _conv_cl_infer, _conv_cl_ref, _conv_flops, None,
     ("stride", "padding", "dilation", "transposed", "output_padding", "groups"))


def _conv_backward_cl_ref(xs, a, device):
    """A 2-d convolution's backward on channels-last data (passes/channels_last.py): grad_output
    [N,H',W',O], input [N,H,W,C], weight [O,C/groups,kh,kw] -> (grad_input [N,H,W,C], grad_weight,
    grad_bias) as `output_mask` asks, new and contiguous (oneDNN's grad_input is in that order)."""
    g, x, w = xs[0].permute(0, 3, 1, 2), xs[1].permute(0, 3, 1, 2), xs[2]
    mask = list(a["output_mask"])
    gi, gw, gb = torch.ops.aten.convolution_backward(
        g, x, w, [w.shape[0]] if mask[2] else None, list(a["stride"]), list(a["padding"]), list(a["dilation"]),
        False, [0] * len(a["stride"]), a["groups"], mask)
    return (gi.permute(0, 2, 3, 1).contiguous() if mask[0] else None, gw.contiguous() if mask[1] else None,
            gb.contiguous() if mask[2] else None)


def _conv_backward_cl_infer(ts, a):
    if len(ts) != 3 or any(len(t.shape) != 4 for t in ts) or len({t.dtype for t in ts}) != 1:
        raise TypeError(f"conv_backward_cl of {', '.join(map(str, ts))}: wants [N,H',W',O], [N,H,W,C] and "
                        "[O,C,kh,kw] of one dtype")
    x, w = ts[1], ts[2]
    nchw = TensorType((x.shape[0], x.shape[3], x.shape[1], x.shape[2]), x.dtype)
    out = _conv_infer([nchw, w], {**a, "transposed": False, "output_padding": (0,) * len(a["stride"])})
    if (out.shape[0], out.shape[2], out.shape[3], out.shape[1]) != tuple(ts[0].shape):
        raise TypeError(f"conv_backward_cl: grad_output {ts[0]} is not the [N,H',W',O] of the convolution of "
                        f"{x} by {w}")
    mask = a["output_mask"]
    return (x if mask[0] else None, w if mask[1] else None, TensorType((w.shape[0],), w.dtype) if mask[2] else None)


_add("conv_backward_cl", "matmul", _conv_backward_cl_infer, _conv_backward_cl_ref,
     lambda out, ins, a: 2 * 2 * ins[0].numel * math.prod(ins[2].shape[1:]), None,
     ("stride", "padding", "dilation", "groups", "output_mask"))

# ---- extern: any ATen op without a lowering runs through torch --------------------------------------------


class Ref:
    """An extern argument slot that holds the node's i-th tensor operand (printed `$i`)."""
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __eq__(self, other):
        return isinstance(other, Ref) and other.index == self.index

    def __hash__(self):
        return hash(("Ref", self.index))

    def __repr__(self):
        return f"${self.index}"


class OpArg:
    """An extern argument that is itself an ATen operator (printed `op("aten.x.default")`): what a
    higher-order op takes, as AOTAutograd's with_effects(token, op, *args) does for an op with a
    side effect (linalg.inv's check for a singular matrix)."""
    __slots__ = ("target",)

    def __init__(self, target: str):
        self.target = target

    def __eq__(self, other):
        return isinstance(other, OpArg) and other.target == self.target

    def __hash__(self):
        return hash(("OpArg", self.target))

    def __repr__(self):
        return f'op("{self.target}")'


def resolve_target(target: str):
    """'aten.cumsum.default' -> torch.ops.aten.cumsum.default"""
    obj = torch.ops
    for part in target.split("."):
        obj = getattr(obj, part)
    if not callable(obj):  # torch.ops makes a namespace of any name: 'aten', ':'
        raise AttributeError(f"{target!r} names no operator")
    return obj


def _fill_refs(template, xs):
    if isinstance(template, Ref):
        return xs[template.index]
    if isinstance(template, OpArg):
        return resolve_target(template.target)
    if isinstance(template, (list, tuple)):
        return type(template)(_fill_refs(t, xs) for t in template)
    if isinstance(template, dict):
        return {k: _fill_refs(v, xs) for k, v in template.items()}
    return template


STORAGE_VIEWS = ("as_strided", "_reshape_alias")  # views whose strides count in the operand's storage


@functools.lru_cache(maxsize=None)
def view_target(target: str) -> bool:
    """Whether extern `target` is a torch view op (view_as_complex, view.dtype): one that may demand
    strides of its operand (view_as_complex a last dim of stride 1). The fx graph may have made the
    operand contiguous with a clone, which the IR does not keep (a clone is its operand's value), so
    the operand comes contiguous: a kernel writes it (compiler/buffers.py), and the reference
    below copies one that is not. Not as_strided: its strides address the operand's storage, so a
    copy would change what it reads."""
    op = resolve_target(target)
    name = getattr(op, "_schema", None) and op._schema.name.split("::")[-1]
    return bool(getattr(op, "is_view", False)) and name not in STORAGE_VIEWS


def _extern_ref(xs, a, device):
    if view_target(a["target"]):
        xs = [x.contiguous() if isinstance(x, torch.Tensor) else x for x in xs]
    kwargs = dict(_fill_refs(a.get("kwargs", {}), xs))
    if "device" in kwargs:
        kwargs["device"] = device
    return resolve_target(a["target"])(*_fill_refs(a["args"], xs), **kwargs)


_add("extern", "extern", lambda ts, a: None, _extern_ref, lambda *_: 0, None, ("target", "args"))
_add("getitem", "tuple", lambda ts, a: None, lambda xs, a, d: xs[0][a["index"]], lambda *_: 0, 1, ("index",))
# a fused kernel (compiler/passes/fuse.py): its body lives in node.meta["kernel"], results are picked by getitem
_add("kernel", "kernel", lambda ts, a: None, lambda xs, a, d: None, lambda *_: 0, None, ("name",))
