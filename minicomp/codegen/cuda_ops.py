"""The CUDA backend's per-op table: LOWER maps each row of the scalar op table (ir/scalar.py) it
lowers to one C recipe, `recipe(g, args, adt, attrs) -> C expression`, where `g` is the kernel's
generator (cuda.py; the kernel-level recipes read its loads and accumulators), `args` the operand
names or literals and `adt` the dtype the op computes in; a reduction's entry gives, for its value
dtype, the prelude functor that folds it (argmax/argmin: mc_arg_combine's IsMax). SUPPORTED_OPS, the
tensor-level ops this backend fuses, is derived from LOWER's keys and checked against the scalar
table when this module loads (ir.scalar.backend_ops).

The same semantics as llvm_ops.py: f16/bf16 are computed as float and rounded back to their precision
whenever an op produces them (`mc_round_f16`); b8 is `bool` in registers and a byte in memory;
maximum/minimum propagate NaN, `!=` is unordered (C's own rule), sign(NaN) is 0, integer division by
zero divides by 1, signed i32/i64 arithmetic wraps, integer pow is exact and wraps (mc_ipow), and
float -> integer casts follow torch on the CPU, out of range and NaN included (mc_f2i32/mc_f2i64).
Operands are always variable names or literals, so expressions need no precedence care beyond their
own parens. The helpers named `mc_*` live in prelude.cuh. Adding an op: a row in the scalar table
and one entry here (and in llvm_ops.py).
"""
from __future__ import annotations

import math
import struct

from ..ir.scalar import SCALAR, backend_ops, operand_dtype
from ..ir.sym import Sym
from ..ir.types import DTYPES, FLOATS, LOW_FLOATS, UNSIGNED

LEFT_TO_TORCH = ("erfinv",)  # no recipe yet: it runs as a torch op between kernels
WRAPS = ("i32", "i64")  # C's signed overflow is undefined; these go through unsigned arithmetic
INLINE = ("const", "acc")  # ops whose C expression is a literal or a name: no temporary for them
_MATH = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
         "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "sqrt", "rsqrt", "floor", "ceil",
         "trunc")

REG = {"f32": "float", "f16": "float", "bf16": "float", "f64": "double", "i64": "long long", "i32": "int",
       "i16": "short", "i8": "signed char", "u8": "unsigned char", "b8": "bool"}
MEM = {**REG, "f16": "__half", "bf16": "__nv_bfloat16", "b8": "unsigned char"}
_VIA = {"i8": "mc_f2i32", "i16": "mc_f2i32", "i32": "mc_f2i32", "u8": "mc_f2i64", "i64": "mc_f2i64"}


def size(x) -> str:
    """A size in C: an int literal (`LL` past 32 bits), or for a symbolic size (ir/sym.py) an
    expression of the kernel's `long long` size parameters, named as the symbols are."""
    if not isinstance(x, Sym):
        return f"{x}LL" if abs(x) >= (1 << 31) else str(x)
    parts = []
    for mono, c in x.terms:
        factors = [a if isinstance(a, str) else f"mc_f{a.kind}({size(a.arg)}, {size(a.d)})"  # mc_fdiv, mc_fmod
                   for a in mono]
        parts.append(" * ".join(factors if c == 1 else [f"{c}LL", *factors]))
    if x.const:
        parts.append(f"{x.const}LL")
    return "(" + " + ".join(parts) + ")"


def emit(g, op: str, a: list, dtype: str, attrs: dict, arg_dtypes) -> str:
    """C expression (of REG[dtype]) for row `op` of the scalar table over operands `a` (of
    `arg_dtypes`), rounded to f16/bf16 when a pointwise op produces them."""
    out = LOWER[op](g, a, operand_dtype(op, arg_dtypes, dtype), attrs)
    return round_to(dtype, out) if dtype in LOW_FLOATS and op != "cast" and SCALAR[op].kind == "pointwise" else out


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


def const(dtype: str, value) -> str:
    if dtype in FLOATS:
        v = float(value)
        d = dtype == "f64"
        if math.isnan(v):
            return "MC_NAN_D" if d else "MC_NAN_F"
        if math.isinf(v):
            return ("-" if v < 0 else "") + ("MC_INF_D" if d else "MC_INF_F")
        if dtype in LOW_FLOATS:  # the value the IR's dtype can hold (it may round to inf)
            import torch
            v = float(torch.tensor(v, dtype=DTYPES[dtype]).float())
            if math.isinf(v):
                return ("-" if v < 0 else "") + "MC_INF_F"
        if not d:
            v = struct.unpack("f", struct.pack("f", v))[0]  # round once, to float, here
        return f"({v.hex()}{'' if d else 'f'})"
    if dtype == "b8":
        return "true" if value else "false"
    v = int(value)
    if dtype == "i64":
        return f"{v}LL" if v > -(1 << 63) else "(-9223372036854775807LL - 1)"
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
    if src in FLOATS:  # like torch on the CPU: through a 32- or 64-bit int, its minimum when out of range
        return f"({REG[dst]}){_VIA[dst]}({s})"
    return f"({REG[dst]})({s})"


# ---- recipes -----------------------------------------------------------------------------------------

def _load(g, a, adt, at):
    idx = g.index(at["index"])
    if at.get("guard") is not None:  # a cat part outside its range reads element 0 (then discarded)
        idx = f"{g.value(at['guard'])} ? {idx} : 0"
    return from_mem(adt, f"b{at['buf']}[{g.checked(idx, at['buf'])}]")


def _arith(sym, name):
    def f(g, a, adt, at):
        return f"mc_wrap_{name}({a[0]}, {a[1]})" if adt in WRAPS else f"({a[0]} {sym} {a[1]})"
    return f


def _div_trunc(g, a, adt, at):
    x, y = a
    if adt in FLOATS:  # torch rounds an f16/bf16 quotient to its dtype before truncating it
        return f"{fn('trunc', adt)}({round_to(adt, f'{x} / {y}')})"
    return f"mc_idiv({x}, {y})"


def _pow(g, a, adt, at):
    x, y = a
    return f"{fn('pow', adt)}({x}, {y})" if adt in FLOATS else f"mc_ipow({x}, {y})"


def _minmax(name, sym):
    def f(g, a, adt, at):
        x, y = a
        if adt == "b8":
            return f"({x} {'||' if name == 'max' else '&&'} {y})"
        if adt in FLOATS:
            return f"mc_{name}({x}, {y})"
        return f"({x} {sym} {y} ? {x} : {y})"
    return f


def _infix(sym):
    return lambda g, a, adt, at: f"({a[0]} {sym} {a[1]})"


def _logical(sym):
    return lambda g, a, adt, at: f"({truth(a[0], adt)} {sym} {truth(a[1], adt)})"


def _abs(g, a, adt, at):
    x = a[0]
    if adt in FLOATS:
        return f"{fn('fabs', adt)}({x})"
    return x if adt in UNSIGNED else f"({x} < 0 ? mc_wrap_sub(({REG[adt]})0, {x}) : {x})"


def _sign(g, a, adt, at):
    x = a[0]
    if adt in UNSIGNED:
        return x if adt == "b8" else f"({REG[adt]})({x} > 0)"
    return f"({REG[adt]})(({x} > 0) - ({x} < 0))"


def _sigmoid(g, a, adt, at):
    one = "1.0" if adt == "f64" else "1.0f"
    return f"({one} / ({one} + {fn('exp', adt)}(-{a[0]})))"


def _isinf(g, a, adt, at):
    if adt not in FLOATS:
        return "false"
    return f"({fn('fabs', adt)}({a[0]}) == {'MC_INF_D' if adt == 'f64' else 'MC_INF_F'})"


def _ll(x) -> str:
    return f"{x}LL" if isinstance(x, int) else size(x)


def _math(name):
    return lambda g, a, adt, at: f"{fn(name, adt)}({a[0]})"


def _math2(name):
    return lambda g, a, adt, at: f"{fn(name, adt)}({a[0]}, {a[1]})"


LOWER = {
    "load": _load,
    "const": lambda g, a, adt, at: (cast(size(at["value"]), "i64", adt) if isinstance(at["value"], Sym)  # a mean's count
                                    else const(adt, at["value"])),
    "index": lambda g, a, adt, at: cast(g.index(at["expr"]), "i64", adt),
    "acc": lambda g, a, adt, at: g.accs[id(at["red"])],
    "clamp_index": lambda g, a, adt, at: f"mc_clamp_index((long long)({a[0]}), {_ll(at['size'])})",
    "add": _arith("+", "add"), "sub": _arith("-", "sub"), "mul": _arith("*", "mul"),
    "neg": lambda g, a, adt, at: f"mc_wrap_sub(({REG[adt]})0, {a[0]})" if adt in WRAPS else f"(-{a[0]})",
    "div": _infix("/"),
    "div_trunc": _div_trunc,
    "div_floor": lambda g, a, adt, at: (f"({a[0]} / mc_safe({a[1]}))" if adt in UNSIGNED
                                        else f"mc_div_floor({a[0]}, {a[1]})"),
    "fmod": lambda g, a, adt, at: (f"{fn('fmod', adt)}({a[0]}, {a[1]})" if adt in FLOATS
                                   else f"mc_irem({a[0]}, {a[1]})"),
    "remainder": lambda g, a, adt, at: (f"({a[0]} % mc_safe({a[1]}))" if adt in UNSIGNED
                                        else f"mc_remainder({a[0]}, {a[1]})"),
    "pow": _pow, "atan2": _math2("atan2"), "maximum": _minmax("max", ">"), "minimum": _minmax("min", "<"),
    "bitwise_and": _infix("&"), "bitwise_or": _infix("|"), "bitwise_xor": _infix("^"),
    "eq": _infix("=="), "ne": _infix("!="), "lt": _infix("<"), "le": _infix("<="), "gt": _infix(">"),
    "ge": _infix(">="),
    "logical_and": _logical("&&"), "logical_or": _logical("||"), "logical_xor": _logical("!="),
    "logical_not": lambda g, a, adt, at: f"(!{truth(a[0], adt)})",
    "where": lambda g, a, adt, at: f"({a[0]} ? {a[1]} : {a[2]})",
    "cast": lambda g, a, adt, at: cast(a[0], adt, at["dtype"]),
    "abs": _abs,
    "round": lambda g, a, adt, at: f"{fn('rint', adt)}({a[0]})",  # half to even, like torch
    "sign": _sign,
    "copy": lambda g, a, adt, at: a[0],  # the value stored anew (an output in eager's layout)
    "relu": lambda g, a, adt, at: a[0] if adt in UNSIGNED else f"({a[0]} < 0 ? ({REG[adt]})0 : {a[0]})",
    "sigmoid": _sigmoid,
    "bitwise_not": lambda g, a, adt, at: f"(!{a[0]})" if adt == "b8" else f"({REG[adt]})(~{a[0]})",
    "isnan": lambda g, a, adt, at: f"({a[0]} != {a[0]})" if adt in FLOATS else "false",
    "isinf": _isinf,
    **{n: _math(n) for n in _MATH},
}

# a reduction's entry: value dtype -> the prelude functor folding it (mc_warp_reduce, mc_block_reduce);
# argmax/argmin: mc_arg_combine's IsMax, from their row's strict comparison
_FUNCTORS = {"add": ("mc_op_sum", "mc_op_wrap_sum", "mc_op_or"), "mul": ("mc_op_prod", "mc_op_wrap_prod", "mc_op_and"),
             "maximum": ("mc_op_max", "mc_op_max", "mc_op_or"), "minimum": ("mc_op_min", "mc_op_min", "mc_op_and"),
             "gt": ("true",) * 3, "lt": ("false",) * 3}


def _functor(combine):
    plain, wrap, boolean = _FUNCTORS[combine]
    return lambda adt: boolean if adt == "b8" else wrap if adt in WRAPS else plain


LOWER.update({n: _functor(r.combine) for n, r in SCALAR.items() if r.kind == "reduction"})

SUPPORTED_OPS = backend_ops("cuda", LOWER, LEFT_TO_TORCH)
