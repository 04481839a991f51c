"""The LLVM backend's per-op table: LOWER maps each row of the scalar op table (ir/scalar.py) it
lowers to one IR-builder recipe, `recipe(o, args, adt, attrs) -> register`, where `o` is an Ops
(llvm_values.py) at the builder's position, `args` the operand registers and `adt` the dtype the op
computes in. SUPPORTED_OPS, the tensor-level ops this backend fuses, is derived from LOWER's keys and
checked against the scalar table when this module loads (ir.scalar.backend_ops).

Float ops are NaN-faithful to torch: maximum/minimum propagate NaN, `ne` is unordered, sign(NaN) is
0. Transcendentals come from llvm_math (vectorizable polynomials); the rare ones without a
polynomial call libm (scalar); erfinv is left to torch. Reductions fold values with the recipe of
their row's `combine` op (`_fold`); llvm.py keeps the loops and the NaN tracking around them.
Adding an op: a row in the scalar table and one entry here (and in cuda_ops.py).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.scalar import SCALAR, backend_ops, operand_dtype
from ..ir.sym import Sym
from ..ir.types import FLOATS, LOW_FLOATS, UNSIGNED
from .llvm_math import declare_math
from .llvm_values import F32, I1, I64, Ops, const, mem_type, reg_type

LEFT_TO_TORCH = ("erfinv",)  # no vectorizable polynomial yet: runs as a torch op between kernels
_POLY = ("exp", "expm1", "log", "log1p", "tanh", "erf", "erfc", "sin", "cos", "tan", "atan", "sigmoid",
         "exp2", "log2")
_LIBM = {"asin": "asinf", "acos": "acosf", "sinh": "sinhf", "cosh": "coshf", "asinh": "asinhf",
         "acosh": "acoshf", "atanh": "atanhf", "log10": "log10f"}


def emit(o: Ops, op: str, args, dtype: str, attrs: dict, arg_dtypes):
    """Row `op` of the scalar table over registers `args` (of `arg_dtypes`): the result register of IR
    dtype `dtype`, rounded to it for f16/bf16 when a pointwise op produces it."""
    out = LOWER[op](o, list(args), operand_dtype(op, arg_dtypes, dtype), attrs)
    if dtype in LOW_FLOATS and op != "cast" and SCALAR[op].kind == "pointwise":
        return o.round_to(dtype, out)
    return out


# ---- kernel-level ops: they read the kernel's code generator (o.gen, llvm.py) ---------------------------

def _load(o, a, adt, at):
    g, b = o.gen, o.b
    idx = g.index(at["index"])
    if at.get("guard") is not None:  # a cat part outside its range reads element 0 (then discarded)
        idx = b.select(g.value(at["guard"]), idx, I64(0))
    ptr = b.gep(g.ptrs[at["buf"]], [idx], source_etype=mem_type(adt))
    return o.from_mem(adt, b.load(ptr, typ=mem_type(adt)))


def _size_value(o, adt, v):
    """A symbolic size as a value of dtype adt (a mean's count), computed from the kernel's sizes."""
    n = o.gen.size(v)
    if adt in FLOATS:
        return o.b.sitofp(n, reg_type(adt))
    t = reg_type(adt)
    return n if t == I64 else o.b.trunc(n, t)


def _clamp_index(o, a, adt, at):
    g, b = o.gen, o.b
    i = a[0] if a[0].type == I64 else b.sext(a[0], I64)
    size = g.size(at["size"])
    low, high = b.icmp_signed("<", i, I64(0)), b.icmp_signed(">=", i, size)
    bad = b.or_(low, high)
    if at.get("guard") is not None:  # a cat part read where it is not selected
        bad = b.and_(bad, g.value(at["guard"]))
    g.check(bad, "clamp_index", at)
    # as torch's index_select and gather, a negative index is out of range (advanced indexing wraps
    # before it gathers); the clamp keeps a bad index's load inside the buffer
    return b.select(low, I64(0), b.select(high, b.sub(size, I64(1)), i))


# ---- arithmetic --------------------------------------------------------------------------------------

def _arith(fop, iop):
    def f(o, a, adt, at):  # `flags`: a reduction's combine step asks for reassoc (llvm.py)
        if adt in FLOATS:
            return getattr(o.b, fop)(a[0], a[1], flags=at.get("flags", ()))
        return getattr(o.b, iop)(a[0], a[1])
    return f


def _div(o, a, adt, at):
    # a true division, no `arcp`: with it LLVM turned g / sqrt(x) into g * rsqrt(x) and a Newton
    # step (NaN at x = 0 and x = inf: sqrt's gradient at 0), and hoisted 1/s out of a row, which
    # overflows for a denormal s; the kernels it sped up (softmax, norms) are memory-bound: same time
    return o.b.fdiv(a[0], a[1])


def _div_trunc(o, a, adt, at):
    x, y = a
    if adt in FLOATS:  # torch rounds an f16/bf16 quotient to its dtype before truncating it
        return o.intr("trunc", o.round_to(adt, o.b.fdiv(x, y)))
    if adt in UNSIGNED:
        return o.b.udiv(x, o.safe_divisor(y))
    return o.sdivrem(x, y)[0]


def _div_floor(o, a, adt, at):
    b, (x, y) = o.b, a
    if adt in FLOATS:  # torch's div_floor_floating: Python's // (-4.5 // inf == -1, not -0)
        zero, one = o.fconst(x, 0.0), o.fconst(x, 1.0)
        q = b.fdiv(x, y)
        m = b.frem(x, y)
        div = b.fdiv(b.fsub(x, m), y)
        fix = b.and_(b.fcmp_ordered("!=", m, zero), b.xor(b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", m, zero)))
        div = b.select(fix, b.fsub(div, one), div)
        fl = o.intr("floor", div)
        fl = b.select(b.fcmp_ordered(">", b.fsub(div, fl), o.fconst(x, 0.5)), b.fadd(fl, one), fl)
        out = b.select(b.fcmp_unordered("une", div, zero), fl, o.intr("copysign", zero, q))
        return b.select(b.fcmp_ordered("==", y, zero), q, out)
    if adt in UNSIGNED:
        return b.udiv(x, o.safe_divisor(y))
    q, r = o.sdivrem(x, y)
    zero = ir.Constant(x.type, 0)
    fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
    return b.sub(q, b.zext(fix, x.type))


def _fmod(o, a, adt, at):
    x, y = a
    if adt in FLOATS:
        return o.b.frem(x, y)
    if adt in UNSIGNED:
        return o.b.urem(x, o.safe_divisor(y))
    return o.sdivrem(x, y)[1]


def _remainder(o, a, adt, at):
    b, (x, y) = o.b, a
    if adt in UNSIGNED:
        return b.urem(x, o.safe_divisor(y))
    if adt in FLOATS:
        m = b.frem(x, y)
        zero = o.fconst(x, 0.0)
        fix = b.and_(b.fcmp_ordered("!=", m, zero), b.xor(b.fcmp_ordered("<", m, zero), b.fcmp_ordered("<", y, zero)))
        return b.select(fix, b.fadd(m, y), m)
    m = o.sdivrem(x, y)[1]
    zero = ir.Constant(x.type, 0)
    fix = b.and_(b.icmp_signed("!=", m, zero), b.xor(b.icmp_signed("<", m, zero), b.icmp_signed("<", y, zero)))
    return b.select(fix, b.add(m, y), m)


def _pow(o, a, adt, at):
    b, (x, y) = o.b, a
    if adt in FLOATS:
        if x.type == F32:
            o.math_calls += 1
            return b.call(declare_math(o.module, "pow"), [x, y])
        return o.intr("pow", x, y)
    # integers: torch's powi, exact with wrapping multiplies (a double pow loses bits past 2**53):
    # square-and-multiply over every exponent bit, unrolled into selects so the loop still vectorizes
    t = x.type
    one, zero = ir.Constant(t, 1), ir.Constant(t, 0)
    result, base, e = one, x, y
    for _ in range(t.width):
        result = b.select(b.trunc(e, I1), b.mul(result, base), result)
        base = b.mul(base, base)
        e = b.lshr(e, one)
    if adt in UNSIGNED:
        return result
    # a negative exponent: 1 ** -n == 1, (-1) ** -n == +-1, anything else 0
    minus1 = ir.Constant(t, -1)
    neg = b.select(b.icmp_signed("==", x, one), one,
                   b.select(b.icmp_signed("==", x, minus1), b.select(b.trunc(y, I1), minus1, one), zero))
    return b.select(b.icmp_signed("<", y, zero), neg, result)


def _atan2(o, a, adt, at):
    x = a[0]
    name = "atan2f" if x.type == F32 else "atan2"
    fn = o.module.globals.get(name) or ir.Function(o.module, ir.FunctionType(x.type, [x.type] * 2), name)
    return o.b.call(fn, list(a))


def _minmax(is_max):
    def f(o, a, adt, at):
        b, (x, y) = o.b, a
        if adt == "b8":
            return b.or_(x, y) if is_max else b.and_(x, y)
        if adt not in FLOATS:
            cmp = (b.icmp_unsigned if adt in UNSIGNED else b.icmp_signed)(">" if is_max else "<", x, y)
            return b.select(cmp, x, y)
        m = o.intr("maxnum" if is_max else "minnum", x, y)
        return b.select(b.fcmp_unordered("uno", x, y), b.fadd(x, y), m)  # NaN in either -> NaN
    return f


def _bitwise(iop):
    return lambda o, a, adt, at: getattr(o.b, iop)(a[0], a[1])


def _compare(sym):
    def f(o, a, adt, at):
        if adt in FLOATS:  # ordered but `!=`: NaN compares false, and unequal
            return (o.b.fcmp_unordered if sym == "!=" else o.b.fcmp_ordered)(sym, a[0], a[1])
        return (o.b.icmp_unsigned if adt in UNSIGNED else o.b.icmp_signed)(sym, a[0], a[1])
    return f


def _logical(iop):
    return lambda o, a, adt, at: getattr(o.b, iop)(o.truth(a[0], adt), o.truth(a[1], adt))


# ---- unary -------------------------------------------------------------------------------------------

def _abs(o, a, adt, at):
    x = a[0]
    if adt in FLOATS:
        return o.intr("fabs", x)
    if adt in UNSIGNED:
        return x
    return o.b.select(o.b.icmp_signed("<", x, ir.Constant(x.type, 0)), o.b.neg(x), x)


def _sign(o, a, adt, at):
    b, x = o.b, a[0]
    if adt == "b8":
        return x
    if adt in FLOATS:  # (x > 0) - (x < 0), as torch computes it: sign(NaN) is 0
        zero = o.fconst(x, 0.0)
        pos = b.uitofp(b.fcmp_ordered(">", x, zero), x.type)
        neg = b.uitofp(b.fcmp_ordered("<", x, zero), x.type)
        return b.fsub(pos, neg)
    zero = ir.Constant(x.type, 0)
    if adt in UNSIGNED:
        return b.zext(b.icmp_unsigned(">", x, zero), x.type)
    return b.sub(b.zext(b.icmp_signed(">", x, zero), x.type), b.zext(b.icmp_signed("<", x, zero), x.type))


def _relu(o, a, adt, at):
    b, x = o.b, a[0]
    if adt in FLOATS:  # x where x >= 0 or NaN: relu(-0.0) is -0.0 and relu(NaN) NaN, as in torch
        return b.select(b.fcmp_unordered(">=", x, o.fconst(x, 0.0)), x, o.fconst(x, 0.0))
    if adt in UNSIGNED:
        return x
    return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), ir.Constant(x.type, 0), x)


def _isinf(o, a, adt, at):
    if adt not in FLOATS:
        return I1(0)
    return o.b.fcmp_ordered("==", o.intr("fabs", a[0]), o.fconst(a[0], float("inf")))


def _intrinsic(name):
    return lambda o, a, adt, at: o.intr(name, a[0])


def _poly(name):
    return lambda o, a, adt, at: o.math(name, a[0])


def _libm(name):
    return lambda o, a, adt, at: o.libm(name, a[0]) if a[0].type == F32 else o.math(name[:-1], a[0])


LOWER = {
    "load": _load,
    "const": lambda o, a, adt, at: _size_value(o, adt, at["value"]) if isinstance(at["value"], Sym) else const(adt, at["value"]),
    "index": lambda o, a, adt, at: o.cast(o.gen.index(at["expr"]), "i64", adt),
    "acc": lambda o, a, adt, at: o.gen.accs[id(at["red"])],
    "clamp_index": _clamp_index,
    "add": _arith("fadd", "add"), "sub": _arith("fsub", "sub"), "mul": _arith("fmul", "mul"),
    "div": _div, "div_trunc": _div_trunc, "div_floor": _div_floor, "fmod": _fmod, "remainder": _remainder,
    "pow": _pow, "atan2": _atan2, "maximum": _minmax(True), "minimum": _minmax(False),
    "bitwise_and": _bitwise("and_"), "bitwise_or": _bitwise("or_"), "bitwise_xor": _bitwise("xor"),
    "eq": _compare("=="), "ne": _compare("!="), "lt": _compare("<"), "le": _compare("<="),
    "gt": _compare(">"), "ge": _compare(">="),
    "logical_and": _logical("and_"), "logical_or": _logical("or_"), "logical_xor": _logical("xor"),
    "logical_not": lambda o, a, adt, at: o.b.xor(o.truth(a[0], adt), I1(1)),
    "where": lambda o, a, adt, at: o.b.select(*a),
    "cast": lambda o, a, adt, at: o.cast(a[0], adt, at["dtype"]),
    "neg": lambda o, a, adt, at: o.b.fneg(a[0]) if adt in FLOATS else o.b.neg(a[0]),
    "abs": _abs, "sign": _sign, "relu": _relu, "copy": lambda o, a, adt, at: a[0],
    "sqrt": _intrinsic("sqrt"), "floor": _intrinsic("floor"), "ceil": _intrinsic("ceil"),
    "trunc": _intrinsic("trunc"), "round": _intrinsic("roundeven"),
    "rsqrt": lambda o, a, adt, at: o.b.fdiv(o.fconst(a[0], 1.0), o.intr("sqrt", a[0])),
    "bitwise_not": lambda o, a, adt, at: o.b.xor(a[0], ir.Constant(a[0].type, -1 if adt != "b8" else 1)),
    "isnan": lambda o, a, adt, at: o.b.fcmp_unordered("uno", a[0], a[0]) if adt in FLOATS else I1(0),
    "isinf": _isinf,
    **{n: _poly(n) for n in _POLY},
    **{n: _libm(f) for n, f in _LIBM.items()},
}


def _fold(op):
    """A reduction's step: (accumulator, value) -> the new accumulator by the recipe of its row's
    combine op, unrounded (an f16 sum accumulates in f32); for argmax/argmin, (value, best so far)
    -> whether the value is strictly better. Float sums reassociate and float max/min ignore NaN
    (nnan), so that LLVM vectorizes them; llvm.py tracks NaN beside them."""
    def f(o, a, adt, at):
        if op in ("maximum", "minimum") and adt in FLOATS:
            name = "llvm.maxnum" if op == "maximum" else "llvm.minnum"
            fn = o.module.declare_intrinsic(name, [a[0].type], ir.FunctionType(a[0].type, [a[0].type] * 2))
            return o.b.call(fn, list(a), fastmath=("nnan", "nsz"))
        return LOWER[op](o, a, adt, {"flags": ("reassoc",)})
    return f


LOWER.update({n: _fold(r.combine) for n, r in SCALAR.items() if r.kind == "reduction"})

SUPPORTED_OPS = backend_ops("cpu", LOWER, LEFT_TO_TORCH)
