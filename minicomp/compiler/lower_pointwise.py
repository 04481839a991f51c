"""Lowerings of ATen's pointwise ops: math, comparisons, where, casts and the activations.

Pattern: cast operands to the dtype torch computes in (`b.out_dtype` for arithmetic, the promoted
operand dtype for comparisons), then emit one IR op. Python scalars become 0-d `full` nodes.
"""
from __future__ import annotations

from ..ir import Node
from ..ir.types import FLOATS
from .lowering import Unsupported, aten, compute_dtype, lowering, result_dtype

_UNARY = {
    aten.neg: "neg", aten.abs: "abs", aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1",
    aten.log: "log", aten.log2: "log2", aten.log10: "log10", aten.log1p: "log1p", aten.sqrt: "sqrt",
    aten.rsqrt: "rsqrt", aten.reciprocal: "reciprocal", aten.sin: "sin", aten.cos: "cos", aten.tan: "tan",
    aten.asin: "asin", aten.acos: "acos", aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh",
    aten.tanh: "tanh", aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh",
    aten.sigmoid: "sigmoid", aten.erf: "erf", aten.erfc: "erfc", aten.erfinv: "erfinv",
    aten.floor: "floor", aten.ceil: "ceil", aten.round.default: "round", aten.trunc: "trunc", aten.frac: "frac",
    aten.sign: "sign", aten.sgn: "sign", aten.relu: "relu", aten.silu: "silu", aten.bitwise_not: "bitwise_not",
}
_PREDICATES = {aten.isnan: "isnan", aten.isinf: "isinf", aten.logical_not: "logical_not"}
_ARITH = {
    aten.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum", aten.remainder: "remainder",
    aten.fmod: "fmod", aten.atan2: "atan2", aten.bitwise_and: "bitwise_and",
    aten.bitwise_or: "bitwise_or", aten.bitwise_xor: "bitwise_xor",
}
_COMPARE = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge",
            aten.logical_and: "logical_and", aten.logical_or: "logical_or", aten.logical_xor: "logical_xor"}


# rounding an integer, or the sign of a bool, changes nothing
_INT_IDENTITY = ("floor", "ceil", "round", "trunc")


def _unary(op):
    def lower(b, x):
        if op == "bitwise_not" and x.type.dtype == "b8":
            return b.emit("logical_not", x)
        if (op in _INT_IDENTITY and x.type.dtype not in FLOATS) or (op == "sign" and x.type.dtype == "b8"):
            return x
        if x.type.dtype in ("f16", "bf16") and op not in ("neg", "abs", "relu", "sign", "floor", "ceil", "trunc"):
            return b.cast(b.emit(op, b.cast(x, "f32")), b.out_dtype)
        return b.emit(op, b.cast(x, b.out_dtype))
    return lower


for _t, _op in _UNARY.items():
    lowering(_t)(_unary(_op))
for _t, _op in _PREDICATES.items():
    lowering(_t)(lambda b, x, _op=_op: b.emit(_op, x))


# on bools, torch's arithmetic is logic: mul is and, max is or
_BOOL_ARITH = {"mul": "logical_and", "maximum": "logical_or", "minimum": "logical_and", "add": "logical_or"}


def _binary(op):
    def lower(b, x, y):
        dt = b.out_dtype
        return b.emit(_BOOL_ARITH.get(op, op) if dt == "b8" else op, b.tensor(x, dt), b.tensor(y, dt))
    return lower


for _t, _op in _ARITH.items():
    lowering(_t)(_binary(_op))


def _compare(op):
    def lower(b, x, y):
        dt = result_dtype(x, y)
        return b.emit(op, b.tensor(x, dt), b.tensor(y, dt))
    return lower


for _t, _op in _COMPARE.items():
    lowering(_t)(_compare(_op))


def _any_bool(*args) -> bool:
    return any(isinstance(a, bool) or isinstance(a, Node) and a.type.dtype == "b8" for a in args)


@lowering(aten.add, aten.sub)
def _add_sub(b, x, y, alpha=1):
    dt = b.out_dtype
    op = "add" if b.target_name.startswith("aten.add") else "sub"
    if op == "sub" and _any_bool(x, y):
        raise Unsupported("subtraction with a bool operand (torch raises)")
    y = b.tensor(y, dt)
    if alpha != 1:
        y = b.emit("mul", y, b.full(alpha, dt))
    return b.emit(_BOOL_ARITH.get(op, op) if dt == "b8" else op, b.tensor(x, dt), y)


@lowering(aten.rsub)
def _rsub(b, x, y, alpha=1):
    dt = b.out_dtype
    if _any_bool(x, y):
        raise Unsupported("subtraction with a bool operand (torch raises)")
    x = b.tensor(x, dt)
    if alpha != 1:
        x = b.emit("mul", x, b.full(alpha, dt))
    return b.emit("sub", b.tensor(y, dt), x)


@lowering(aten.div)
def _div(b, x, y, rounding_mode=None):
    dt = b.out_dtype
    op = {None: "div", "floor": "div_floor", "trunc": "div_trunc"}[rounding_mode]
    return b.emit(op, b.tensor(x, dt), b.tensor(y, dt))


@lowering(aten.floor_divide)
def _floor_divide(b, x, y):
    return b.emit("div_floor", b.tensor(x, b.out_dtype), b.tensor(y, b.out_dtype))


# a Python-number exponent eager computes with another function (its pow_tensor_scalar kernel):
# they differ from pow at the edges, e.g. (-inf) ** 0.5 is NaN through sqrt and +inf through pow.
# Eager's float16 path takes pow itself. Its float kernel also multiplies for 3 and -2 (x*x*x,
# 1/(x*x)), as integer powers are for any integer dtype: GELU's tanh form (x ** 3) was a pow,
# a log and an exp per element, and most of its kernel's machine code.
_POW_AS = {0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal"}
_POW_AS_DTYPES = ("f32", "f64", "bf16")


@lowering(aten.pow)
def _pow(b, x, y):
    dt = b.out_dtype
    if dt == "b8":  # bool ** bool is bool in eager; the kernels' pow is arithmetic
        raise Unsupported("pow of bools")
    number = isinstance(y, (int, float)) and not isinstance(y, bool)
    if number and isinstance(x, Node) and x.type.dtype not in FLOATS and isinstance(y, int) and y < 0:
        raise Unsupported("integers to negative integer powers (torch raises)")
    if number and y == 1:
        return b.tensor(x, dt)
    if number and y in _POW_AS and dt in _POW_AS_DTYPES:
        return b.emit(_POW_AS[y], b.tensor(x, dt))
    if number and y in (2, 3, -2) and (y == 2 or dt in _POW_AS_DTYPES or y == 3 and dt not in FLOATS):
        xt = b.tensor(x, dt)  # products, as eager's kernels multiply (x*x for every dtype)
        p = b.emit("mul", xt, xt)
        p = b.emit("mul", p, xt) if y == 3 else p
        return b.emit("reciprocal", p) if y < 0 else p
    return b.emit("pow", b.tensor(x, dt), b.tensor(y, dt))


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(b, cond, x, y):
    dt = b.out_dtype
    return b.emit("where", b.cast(cond, "b8"), b.tensor(x, dt), b.tensor(y, dt))


@lowering(aten.clamp, aten.clamp_min, aten.clamp_max)
def _clamp(b, x, lo=None, hi=None):
    name = b.target_name
    if name.startswith("aten.clamp_max"):
        lo, hi = None, lo
    dt = b.out_dtype
    out = b.tensor(x, dt)
    if lo is not None:
        out = b.emit(_BOOL_ARITH["maximum"] if dt == "b8" else "maximum", out, b.tensor(lo, dt))
    if hi is not None:
        out = b.emit(_BOOL_ARITH["minimum"] if dt == "b8" else "minimum", out, b.tensor(hi, dt))
    return out


@lowering(aten.hardtanh)
def _hardtanh(b, x, lo=-1.0, hi=1.0):
    dt = b.out_dtype
    return b.emit("minimum", b.emit("maximum", x, b.full(lo, dt)), b.full(hi, dt))


@lowering(aten.leaky_relu)
def _leaky_relu(b, x, slope=0.01):
    zero = b.full(0, x.type.dtype)
    return b.emit("where", b.emit("gt", x, zero), x, b.emit("mul", x, b.full(slope, x.type.dtype)))


@lowering(aten.gelu)
def _gelu(b, x, approximate="none"):
    cdt = compute_dtype(x.type.dtype)
    return b.cast(b.emit("gelu", b.cast(x, cdt), approximate=approximate), b.out_dtype)


def _backward_formula(formula):
    """An activation's backward as torch's decomposition spells it (`formula(c, op, grad, x)`:
    `c(v)` a constant, `op` Builder.emit), in f32 for low precision, cast to the result's dtype."""
    def lower(b, grad, x, *args, **kwargs):
        dt = compute_dtype(b.out_dtype)

        def c(v):
            return b.full(v, dt)
        return b.cast(formula(c, b.emit, b.cast(grad, dt), b.cast(x, dt), *args, **kwargs), b.out_dtype)
    return lower


_SQRT2, _SQRT1_2, _2_SQRTPI = 1.41421356237309504880, 0.70710678118654752440, 1.12837916709551257390


@lowering(aten.gelu_backward.default)
@_backward_formula
def _gelu_backward(c, op, grad, x, approximate="none"):
    if approximate == "tanh":
        beta, kappa = _SQRT2 * _2_SQRTPI * 0.5, 0.044715
        x_sq = op("mul", x, x)
        inner = op("mul", op("add", x, op("mul", op("mul", x_sq, x), c(kappa))), c(beta))
        t = op("tanh", inner)
        left_derivative = op("mul", op("add", t, c(1)), c(0.5))
        tanh_derivative = op("sub", c(1), op("mul", t, t))
        inner_derivative = op("mul", op("add", op("mul", x_sq, c(3 * kappa)), c(1)), c(beta))
        right_derivative = op("mul", op("mul", op("mul", x, c(0.5)), tanh_derivative), inner_derivative)
        return op("mul", grad, op("add", left_derivative, right_derivative))
    cdf = op("mul", op("add", op("erf", op("mul", x, c(_SQRT1_2))), c(1)), c(0.5))
    pdf = op("mul", op("exp", op("mul", op("mul", x, x), c(-0.5))), c(_2_SQRTPI * _SQRT1_2 * 0.5))
    return op("mul", grad, op("add", cdf, op("mul", x, pdf)))


@lowering(aten.silu_backward.default)
@_backward_formula
def _silu_backward(c, op, grad, x):
    s = op("sigmoid", x)
    return op("mul", op("mul", grad, s), op("add", op("mul", x, op("sub", c(1), s)), c(1)))


@lowering(aten.tanh_backward.default)
@_backward_formula
def _tanh_backward(c, op, grad, y):
    return op("mul", grad, op("sub", c(1), op("mul", y, y)))


@lowering(aten.threshold_backward)
def _threshold_backward(b, grad, x, threshold):
    return b.emit("where", b.emit("le", x, b.full(threshold, x.type.dtype)), b.full(0, grad.type.dtype), grad)


@lowering(aten._to_copy, aten.to.dtype)
def _to_copy(b, x, *args, dtype=None, **kwargs):
    src = b.fx_node.args[0].meta.get("val")
    if src is not None and src.device != b.val.device:
        raise Unsupported("copy to another device")
    return b.cast(x, b.out_dtype)


@lowering(aten.clone, aten.alias, aten.contiguous, aten.lift_fresh_copy, aten.detach)
def _identity(b, x, *args, **kwargs):
    return x


@lowering(aten.copy.default)
def _copy(b, dst, src, non_blocking=False):
    return b.expand(b.cast(src, dst.type.dtype), dst.type.shape)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(b, x, mask, value):
    return b.emit("where", mask, b.tensor(value, x.type.dtype), x)


@lowering(aten.nan_to_num)
def _nan_to_num(b, x, nan=0.0, posinf=None, neginf=None):
    import torch
    dt = x.type.dtype
    fi = torch.finfo(b.val.dtype)
    x = b.emit("where", b.emit("isnan", x), b.full(nan if nan is not None else 0.0, dt), x)
    inf = b.full(float("inf"), dt)
    x = b.emit("where", b.emit("eq", x, inf), b.full(fi.max if posinf is None else posinf, dt), x)
    ninf = b.full(float("-inf"), dt)
    return b.emit("where", b.emit("eq", x, ninf), b.full(fi.min if neginf is None else neginf, dt), x)


@lowering(aten.round.decimals)
def _round_decimals(b, x, *, decimals=0):
    """eager's formula: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d for d < 0."""
    dt = x.type.dtype
    scale = b.full(10.0 ** abs(decimals), dt)
    up, down = ("mul", "div") if decimals >= 0 else ("div", "mul")
    return b.emit(down, b.emit("round", b.emit(up, x, scale)), scale)


@lowering(aten.hypot)
def _hypot(b, x, y):
    """big * sqrt(1 + (small/big)^2): no overflow in the squares; an infinite side wins even over NaN."""
    acc = compute_dtype(b.out_dtype)
    ax, ay = b.emit("abs", b.tensor(x, acc)), b.emit("abs", b.tensor(y, acc))
    big, small = b.emit("maximum", ax, ay), b.emit("minimum", ax, ay)
    zero, one, inf = b.full(0.0, acc), b.full(1.0, acc), b.full(float("inf"), acc)
    ratio = b.emit("div", small, b.emit("where", b.emit("eq", big, zero), one, big))
    out = b.emit("mul", big, b.emit("sqrt", b.emit("add", one, b.emit("mul", ratio, ratio))))
    either_inf = b.emit("logical_or", b.emit("eq", ax, inf), b.emit("eq", ay, inf))
    return b.cast(b.emit("where", either_inf, inf, out), b.out_dtype)


@lowering(aten.elu)
def _elu(b, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """scale * x for x > 0, else alpha * scale * (exp(input_scale * x) - 1): elu, selu and celu."""
    dt = compute_dtype(x.type.dtype)
    x = b.cast(x, dt)
    neg = b.emit("expm1", b.emit("mul", x, b.full(input_scale, dt)))
    neg = b.emit("mul", neg, b.full(alpha * scale, dt))
    out = b.emit("where", b.emit("gt", x, b.full(0, dt)), b.emit("mul", x, b.full(scale, dt)), neg)
    return b.cast(out, b.out_dtype)


@lowering(aten.fmax, aten.fmin)
def _fmax(b, x, y):
    """maximum/minimum that ignore a NaN operand (NaN only where both are)."""
    dt = b.out_dtype
    x, y = b.tensor(x, dt), b.tensor(y, dt)
    out = b.emit("maximum" if b.target_name.startswith("aten.fmax") else "minimum", x, y)
    if dt not in FLOATS:
        return out
    return b.emit("where", b.emit("isnan", x), y, b.emit("where", b.emit("isnan", y), x, out))
