"""Scalar ops for the CUDA backend: one C expression per pointwise op of the op table.

The same semantics as llvm_ops.py, written as CUDA C: f16/bf16 are computed as float and rounded
back to their precision whenever an op produces them (`mc_round_f16`); b8 is `bool` in registers
and a byte in memory; maximum/minimum propagate NaN, `!=` is unordered (C's own rule), sign(NaN)
is 0, integer division by zero divides by 1, and signed i32/i64 arithmetic wraps. Operands are
always variable names or literals, so expressions need no precedence care beyond their own parens.
The helpers named `mc_*` live in prelude.cuh.
"""
from __future__ import annotations

import math
import struct

FLOATS = ("f32", "f64", "f16", "bf16")
UNSIGNED = ("u8", "b8")
WRAPS = ("i32", "i64")  # C's signed overflow is undefined; these go through unsigned arithmetic
_MATH = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
         "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "sqrt", "rsqrt", "floor", "ceil",
         "trunc"}
SUPPORTED_OPS = _MATH | {
    "neg", "abs", "reciprocal", "round", "frac", "sign", "relu", "sigmoid", "silu", "gelu", "bitwise_not",
    "logical_not", "isnan", "isinf", "cast", "add", "sub", "mul", "div", "div_floor", "div_trunc", "pow",
    "maximum", "minimum", "remainder", "fmod", "atan2", "bitwise_and", "bitwise_or", "bitwise_xor", "eq", "ne",
    "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "where", "sum", "prod", "amax", "amin",
    "argmax", "argmin"}

REG = {"f32": "float", "f16": "float", "bf16": "float", "f64": "double", "i64": "long long", "i32": "int",
       "i16": "short", "i8": "signed char", "u8": "unsigned char", "b8": "bool"}
MEM = {**REG, "f16": "__half", "bf16": "__nv_bfloat16", "b8": "unsigned char"}
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "b8": 1}
_INT_BITS = {"i64": 64, "i32": 32, "i16": 16, "i8": 8, "u8": 8}


def fn(name: str, dtype: str) -> str:
    """The libm / CUDA math name for `dtype` registers: expf for float, exp for double."""
    return name if dtype == "f64" else name + "f"


def from_mem(dtype: str, s: str) -> str:
    return {"f16": f"__half2float({s})", "bf16": f"__bfloat162float({s})", "b8": f"({s} != 0)"}.get(dtype, s)


def to_mem(dtype: str, s: str) -> str:
    return {"f16": f"__float2half_rn({s})", "bf16": f"__float2bfloat16_rn({s})",
            "b8": f"(unsigned char)({s})"}.get(dtype, s)


def round_to(dtype: str, s: str) -> str:
    return {"f16": f"mc_round_f16({s})", "bf16": f"mc_round_bf16({s})"}.get(dtype, s)


def int_limit(dtype: str, big: bool) -> str:
    if dtype == "b8":
        return "true" if big else "false"
    bits = _INT_BITS[dtype]
    if dtype in UNSIGNED:
        return str((1 << bits) - 1) if big else "0"
    hi = (1 << (bits - 1)) - 1
    if big:
        return f"{hi}LL" if bits == 64 else str(hi)
    return f"(-{hi}LL - 1)" if bits == 64 else f"(-{hi} - 1)"


def const(dtype: str, value) -> str:
    if dtype in FLOATS:
        v = float(value)
        d = dtype == "f64"
        if math.isnan(v):
            return "MC_NAN_D" if d else "MC_NAN_F"
        if math.isinf(v):
            return ("-" if v < 0 else "") + ("MC_INF_D" if d else "MC_INF_F")
        if dtype in ("f16", "bf16"):  # the value the IR's dtype can hold (it may round to inf)
            import torch
            v = float(torch.tensor(v, dtype={"f16": torch.float16, "bf16": torch.bfloat16}[dtype]).float())
            if math.isinf(v):
                return ("-" if v < 0 else "") + "MC_INF_F"
        if not d:
            v = struct.unpack("f", struct.pack("f", v))[0]  # round once, to float, here
        return f"({v.hex()}{'' if d else 'f'})"
    if dtype == "b8":
        return "true" if value else "false"
    v = int(value)
    if dtype == "i64":
        return f"{v}LL" if v > -(1 << 63) else int_limit("i64", False)
    return f"(({REG[dtype]}){v})" if v >= 0 else f"(({REG[dtype]})({v}))"


def truth(s: str, dtype: str) -> str:
    return s if dtype == "b8" else f"({s} != 0)"


def cast(s: str, src: str, dst: str) -> str:
    if src == dst:
        return s
    if dst == "b8":
        return f"({s} != 0)"
    if dst in FLOATS:
        return round_to(dst, f"({REG[dst]})({s})")
    if src in FLOATS and dst in ("u8", "i8", "i16"):  # like torch on the CPU: through a wide int
        return f"({REG[dst]})(long long)({s})"
    return f"({REG[dst]})({s})"


def emit(op: str, a: list, dtype: str, attrs: dict, adt: str) -> str:
    """C expression (of REG[dtype]) for pointwise `op` over operand names `a` of dtype `adt`."""
    out = _expr(op, a, dtype, attrs, adt)
    return round_to(dtype, out) if dtype in ("f16", "bf16") and op != "cast" else out


def _expr(op, a, dtype, attrs, adt):
    x = a[0]
    y = a[1] if len(a) > 1 else None
    flt = adt in FLOATS
    one = "1.0" if adt == "f64" else "1.0f"
    if op in _MATH:
        return f"{fn(op, adt)}({x})"
    if op in ("add", "sub", "mul"):
        if adt in WRAPS:
            return f"mc_wrap_{op}({x}, {y})"
        return f"({x} {'+' if op == 'add' else '-' if op == 'sub' else '*'} {y})"
    if op == "neg":
        return f"mc_wrap_sub(({REG[adt]})0, {x})" if adt in WRAPS else f"(-{x})"
    if op == "div":
        return f"({x} / {y})"
    if op == "div_trunc":  # torch rounds an f16/bf16 quotient to its dtype before truncating it
        return f"{fn('trunc', adt)}({round_to(adt, f'{x} / {y}')})" if flt else f"({x} / mc_safe({y}))"
    if op == "div_floor":
        return f"({x} / mc_safe({y}))" if adt in UNSIGNED else f"mc_div_floor({x}, {y})"
    if op == "fmod":
        return f"{fn('fmod', adt)}({x}, {y})" if flt else f"({x} % mc_safe({y}))"
    if op == "remainder":
        return f"({x} % mc_safe({y}))" if adt in UNSIGNED else f"mc_remainder({x}, {y})"
    if op == "pow":
        if flt:
            return f"{fn('pow', adt)}({x}, {y})"
        return f"({REG[adt]})(long long)round(pow((double)({x}), (double)({y})))"
    if op == "atan2":
        return f"{fn('atan2', adt)}({x}, {y})"
    if op in ("maximum", "minimum"):
        if adt == "b8":
            return f"({x} {'||' if op == 'maximum' else '&&'} {y})"
        if flt:
            return f"mc_{op[:3]}({x}, {y})"
        return f"({x} {'>' if op == 'maximum' else '<'} {y} ? {x} : {y})"
    if op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        return f"({x} {dict(bitwise_and='&', bitwise_or='|', bitwise_xor='^')[op]} {y})"
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        return f"({x} {dict(eq='==', ne='!=', lt='<', le='<=', gt='>', ge='>=')[op]} {y})"
    if op in ("logical_and", "logical_or", "logical_xor"):
        sym = {"logical_and": "&&", "logical_or": "||", "logical_xor": "!="}[op]
        return f"({truth(x, adt)} {sym} {truth(y, adt)})"
    if op == "logical_not":
        return f"(!{truth(x, adt)})"
    if op == "where":
        return f"({x} ? {y} : {a[2]})"
    if op == "cast":
        return cast(x, adt, attrs["dtype"])
    if op == "abs":
        if flt:
            return f"{fn('fabs', adt)}({x})"
        return x if adt in UNSIGNED else f"({x} < 0 ? mc_wrap_sub(({REG[adt]})0, {x}) : {x})"
    if op == "reciprocal":
        return f"({one} / {x})"
    if op == "round":  # half to even, like torch
        return f"{fn('rint', adt)}({x})"
    if op == "frac":
        return f"({x} - {fn('trunc', adt)}({x}))"
    if op == "sign":
        if adt in UNSIGNED:
            return x if adt == "b8" else f"({REG[adt]})({x} > 0)"
        return f"({REG[adt]})(({x} > 0) - ({x} < 0))"
    if op == "relu":
        return x if adt in UNSIGNED else f"({x} < 0 ? ({REG[adt]})0 : {x})"
    if op == "sigmoid":
        return f"({one} / ({one} + {fn('exp', adt)}(-{x})))"
    if op == "silu":
        return f"({x} * ({one} / ({one} + {fn('exp', adt)}(-{x}))))"
    if op == "gelu":
        c = (lambda v: f"{v!r}") if adt == "f64" else (lambda v: f"{v!r}f")
        if attrs.get("approximate", "none") == "tanh":
            inner = f"{c(math.sqrt(2 / math.pi))} * ({x} + {c(0.044715)} * {x} * {x} * {x})"
            return f"({c(0.5)} * {x} * ({one} + {fn('tanh', adt)}({inner})))"
        return f"({c(0.5)} * {x} * ({one} + {fn('erf', adt)}({x} * {c(math.sqrt(0.5))})))"
    if op == "bitwise_not":
        return f"(!{x})" if adt == "b8" else f"({REG[adt]})(~{x})"
    if op == "isnan":
        return f"({x} != {x})" if flt else "false"
    if op == "isinf":
        return f"({fn('fabs', adt)}({x}) == {'MC_INF_D' if adt == 'f64' else 'MC_INF_F'})" if flt else "false"
    raise NotImplementedError(f"CUDA codegen has no recipe for {op}")
