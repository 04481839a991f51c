"""Scalar ops for the LLVM backend: one IR-builder recipe per pointwise op of the op table.

Values live in registers as `reg_type(dtype)`: f16/bf16 are computed as float (f32 math, as the
issue of low-precision storage asks) and rounded back to their precision whenever an op produces
them; b8 is i1. Float ops are NaN-faithful to torch: maximum/minimum propagate NaN, `ne` is
unordered. Transcendentals come from llvm_math (vectorizable polynomials); the rare ones without a
polynomial call libm (scalar) and erfinv is left to torch (not in SUPPORTED_OPS).
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from .llvm_math import declare_math

F32, F64, I1, I8, I16, I32, I64 = (ir.FloatType(), ir.DoubleType(), ir.IntType(1), ir.IntType(8),
                                   ir.IntType(16), ir.IntType(32), ir.IntType(64))
FLOATS = ("f32", "f64", "f16", "bf16")
UNSIGNED = ("u8", "b8")
_POLY = {"exp", "expm1", "log", "log1p", "tanh", "erf", "erfc", "sin", "cos", "tan", "atan", "sigmoid",
         "exp2", "log2"}
_LIBM = {"asin": "asinf", "acos": "acosf", "sinh": "sinhf", "cosh": "coshf", "asinh": "asinhf",
         "acosh": "acoshf", "atanh": "atanhf", "log10": "log10f"}
SUPPORTED_OPS = (set(_POLY) | set(_LIBM) | {
    "neg", "abs", "sqrt", "rsqrt", "reciprocal", "floor", "ceil", "round", "trunc", "frac", "sign", "relu", "copy",
    "silu", "gelu", "bitwise_not", "logical_not", "isnan", "isinf", "cast", "add", "sub", "mul", "div",
    "div_floor", "div_trunc", "pow", "maximum", "minimum", "remainder", "fmod", "atan2", "bitwise_and",
    "bitwise_or", "bitwise_xor", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_xor", "where", "sum", "prod", "amax", "amin", "argmax", "argmin"})


def reg_type(dtype: str):
    return {"f32": F32, "f16": F32, "bf16": F32, "f64": F64, "i64": I64, "i32": I32, "i16": I16,
            "i8": I8, "u8": I8, "b8": I1}[dtype]


def mem_type(dtype: str):
    return {"f16": ir.HalfType(), "bf16": I16, "b8": I8}.get(dtype) or reg_type(dtype)


def const(dtype: str, value):
    t = reg_type(dtype)
    if dtype in FLOATS:
        v = float(value)
        if dtype in ("f16", "bf16") and math.isfinite(v):
            import torch
            v = float(torch.tensor(v, dtype={"f16": torch.float16, "bf16": torch.bfloat16}[dtype]).float())
        return ir.Constant(t, v)
    if dtype == "b8":
        return ir.Constant(I1, int(bool(value)))
    return ir.Constant(t, int(value))


class Ops:
    """Emits scalar ops at the builder's position. `b` is an ir.IRBuilder, `module` its module."""

    def __init__(self, b: ir.IRBuilder, module: ir.Module):
        self.b, self.module = b, module
        self.math_calls = 0  # calls of our polynomial math emitted so far (llvm.py interleaves such loops)

    # -- helpers ----------------------------------------------------------------------------------
    def intr(self, name, *args, ty=None):
        ty = ty or args[0].type
        fn = self.module.declare_intrinsic(f"llvm.{name}", [ty], ir.FunctionType(ty, [a.type for a in args]))
        return self.b.call(fn, list(args))

    def libm(self, name, *args):
        fn = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(F32, [F32] * len(args)), name)
        return self.b.call(fn, list(args))

    def math(self, name, x):
        if x.type == F64:  # f64 math: through f32 polynomials would lose precision; use libm
            if name == "sigmoid":  # libm has none (an unresolved symbol would jump to address 0)
                one = self.fconst(x, 1.0)
                return self.b.fdiv(one, self.b.fadd(one, self.math("exp", self.b.fneg(x))))
            fn = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(F64, [F64]), name)
            return self.b.call(fn, [x])
        self.math_calls += 1
        return self.b.call(declare_math(self.module, name), [x])

    def fconst(self, x, v):
        return ir.Constant(x.type, v)

    def round_to(self, dtype: str, v):
        """Round a float register to the precision `dtype` stores (f16/bf16); others unchanged."""
        if dtype == "f16":
            return self.b.fpext(self.b.fptrunc(v, ir.HalfType()), F32)
        if dtype == "bf16":
            return self.from_mem("bf16", self.to_mem("bf16", v))
        return v

    def to_mem(self, dtype: str, v):
        b = self.b
        if dtype == "f16":
            return b.fptrunc(v, ir.HalfType())
        if dtype == "bf16":  # round to nearest even on the top 16 bits; NaN stays a quiet NaN
            bits = b.bitcast(v, I32)
            lsb = b.and_(b.lshr(bits, I32(16)), I32(1))
            rounded = b.lshr(b.add(bits, b.add(I32(0x7FFF), lsb)), I32(16))
            isnan = b.fcmp_unordered("uno", v, v)
            return b.trunc(b.select(isnan, I32(0x7FC0), rounded), I16)
        if dtype == "b8":
            return b.zext(v, I8)
        return v

    def from_mem(self, dtype: str, v):
        b = self.b
        if dtype == "f16":
            return b.fpext(v, F32)
        if dtype == "bf16":
            return b.bitcast(b.shl(b.zext(v, I32), I32(16)), F32)
        if dtype == "b8":
            return b.icmp_unsigned("!=", v, I8(0))
        return v

    def cast(self, v, src: str, dst: str):
        b = self.b
        st, dt = reg_type(src), reg_type(dst)
        if src == dst:
            return v
        if dst == "b8":
            return b.fcmp_unordered("une", v, ir.Constant(st, 0.0)) if src in FLOATS else b.icmp_unsigned("!=", v, ir.Constant(st, 0))
        if src in FLOATS and dst in FLOATS:
            out = v if st == dt else (b.fpext(v, dt) if dt == F64 else b.fptrunc(v, dt))
            return self.round_to(dst, out)
        if src in FLOATS:  # float -> int truncates toward zero, like torch
            return b.fptoui(v, dt) if dst == "u8" else b.fptosi(v, dt)
        if dst in FLOATS:
            out = b.uitofp(v, dt) if src in UNSIGNED else b.sitofp(v, dt)
            return self.round_to(dst, out)
        if st.width == dt.width:
            return v
        if st.width > dt.width:
            return b.trunc(v, dt)
        return b.zext(v, dt) if src in UNSIGNED else b.sext(v, dt)

    # -- the op table's pointwise ops ----------------------------------------------------------------
    def emit(self, op: str, args, dtype: str, attrs: dict, arg_dtypes):
        """args in registers; returns the result register of IR dtype `dtype` (rounded for f16/bf16)."""
        fn = getattr(self, "op_" + op, None)
        a0 = arg_dtypes[0] if arg_dtypes else dtype
        if fn is not None:
            out = fn(*args, adt=a0, **{k: v for k, v in attrs.items() if k != "guard"})
        elif op in _POLY:
            out = self.math(op, args[0])
        elif op in _LIBM:
            out = self.libm(_LIBM[op], args[0]) if args[0].type == F32 else self.math(_LIBM[op][:-1], args[0])
        else:
            raise NotImplementedError(f"LLVM codegen has no recipe for {op}")
        return self.round_to(dtype, out) if dtype in ("f16", "bf16") and op != "cast" else out

    def _arith(fop, iop):
        def f(self, x, y, adt, **_):
            return getattr(self.b, fop)(x, y) if adt in FLOATS else getattr(self.b, iop)(x, y)
        return f

    op_add = _arith("fadd", "add")
    op_sub = _arith("fsub", "sub")
    op_mul = _arith("fmul", "mul")

    def op_div(self, x, y, adt, **_):
        # arcp: x / s with s fixed for a row (softmax, norms) becomes x * (1/s), the reciprocal hoisted
        return self.b.fdiv(x, y, flags=("arcp",))

    def _safe_divisor(self, y):
        return self.b.select(self.b.icmp_signed("==", y, ir.Constant(y.type, 0)), ir.Constant(y.type, 1), y)

    def _sdivrem(self, x, y):
        """Signed x / y and x % y, truncating, without the divisions that trap in hardware: y == 0
        divides by 1 (torch raises there), y == -1 gives -x (wrapping) and 0, as torch's INT_MIN // -1."""
        b, c = self.b, lambda v: ir.Constant(y.type, v)
        minus1 = b.icmp_signed("==", y, c(-1))
        safe = b.select(b.or_(minus1, b.icmp_signed("==", y, c(0))), c(1), y)
        return b.select(minus1, b.neg(x), b.sdiv(x, safe)), b.srem(x, safe)

    def op_div_trunc(self, x, y, adt, **_):
        if adt in FLOATS:
            return self.intr("trunc", self.b.fdiv(x, y))
        if adt in UNSIGNED:
            return self.b.udiv(x, self._safe_divisor(y))
        return self._sdivrem(x, y)[0]

    def op_div_floor(self, x, y, adt, **_):
        b = self.b
        if adt in FLOATS:  # torch's div_floor_floating: Python's // (-4.5 // inf == -1, not -0)
            zero, one = self.fconst(x, 0.0), self.fconst(x, 1.0)
            q = b.fdiv(x, y)
            m = b.frem(x, y)
            div = b.fdiv(b.fsub(x, m), y)
            fix = b.and_(b.fcmp_ordered("!=", m, zero), b.xor(b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", m, zero)))
            div = b.select(fix, b.fsub(div, one), div)
            fl = self.intr("floor", div)
            fl = b.select(b.fcmp_ordered(">", b.fsub(div, fl), self.fconst(x, 0.5)), b.fadd(fl, one), fl)
            out = b.select(b.fcmp_unordered("une", div, zero), fl, self.intr("copysign", zero, q))
            return b.select(b.fcmp_ordered("==", y, zero), q, out)
        if adt in UNSIGNED:
            return b.udiv(x, self._safe_divisor(y))
        q, r = self._sdivrem(x, y)
        zero = ir.Constant(x.type, 0)
        fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
        return b.sub(q, b.zext(fix, x.type))

    def op_fmod(self, x, y, adt, **_):
        if adt in FLOATS:
            return self.b.frem(x, y)
        if adt in UNSIGNED:
            return self.b.urem(x, self._safe_divisor(y))
        return self._sdivrem(x, y)[1]

    def op_remainder(self, x, y, adt, **_):
        b = self.b
        if adt in UNSIGNED:
            return b.urem(x, self._safe_divisor(y))
        if adt in FLOATS:
            m = b.frem(x, y)
            zero = self.fconst(x, 0.0)
            fix = b.and_(b.fcmp_ordered("!=", m, zero), b.xor(b.fcmp_ordered("<", m, zero), b.fcmp_ordered("<", y, zero)))
            return b.select(fix, b.fadd(m, y), m)
        m = self._sdivrem(x, y)[1]
        zero = ir.Constant(x.type, 0)
        fix = b.and_(b.icmp_signed("!=", m, zero), b.xor(b.icmp_signed("<", m, zero), b.icmp_signed("<", y, zero)))
        return b.select(fix, b.add(m, y), m)

    def op_pow(self, x, y, adt, **_):
        if adt in FLOATS:
            if x.type == F32:
                self.math_calls += 1
                return self.b.call(declare_math(self.module, "pow"), [x, y])
            return self.intr("pow", x, y)
        # integers: torch's powi, exact with wrapping multiplies (a double pow loses bits past 2**53):
        # square-and-multiply over every exponent bit, unrolled into selects so the loop still vectorizes
        b, t = self.b, x.type
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

    def op_atan2(self, x, y, adt, **_):
        name = "atan2f" if x.type == F32 else "atan2"
        fn = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(x.type, [x.type] * 2), name)
        return self.b.call(fn, [x, y])

    def _minmax(self, x, y, adt, is_max):
        b = self.b
        if adt == "b8":
            return b.or_(x, y) if is_max else b.and_(x, y)
        if adt not in FLOATS:
            cmp = (b.icmp_unsigned if adt in UNSIGNED else b.icmp_signed)(">" if is_max else "<", x, y)
            return b.select(cmp, x, y)
        m = self.intr("maxnum" if is_max else "minnum", x, y)
        return b.select(b.fcmp_unordered("uno", x, y), b.fadd(x, y), m)  # NaN in either -> NaN

    def op_maximum(self, x, y, adt, **_):
        return self._minmax(x, y, adt, True)

    def op_minimum(self, x, y, adt, **_):
        return self._minmax(x, y, adt, False)

    def _bitwise(iop):
        def f(self, x, y, adt, **_):
            return getattr(self.b, iop)(x, y)
        return f

    op_bitwise_and = _bitwise("and_")
    op_bitwise_or = _bitwise("or_")
    op_bitwise_xor = _bitwise("xor")

    def _compare(fop, sop, uop):
        def f(self, x, y, adt, **_):
            if adt in FLOATS:
                return (self.b.fcmp_unordered if fop == "!=" else self.b.fcmp_ordered)(fop, x, y)
            return (self.b.icmp_unsigned if adt in UNSIGNED else self.b.icmp_signed)(sop if adt not in UNSIGNED else uop, x, y)
        return f

    op_eq = _compare("==", "==", "==")
    op_ne = _compare("!=", "!=", "!=")
    op_lt = _compare("<", "<", "<")
    op_le = _compare("<=", "<=", "<=")
    op_gt = _compare(">", ">", ">")
    op_ge = _compare(">=", ">=", ">=")

    def _truth(self, x, adt):
        return x if adt == "b8" else self.cast(x, adt, "b8")

    def op_logical_and(self, x, y, adt, **_):
        return self.b.and_(self._truth(x, adt), self._truth(y, adt))

    def op_logical_or(self, x, y, adt, **_):
        return self.b.or_(self._truth(x, adt), self._truth(y, adt))

    def op_logical_xor(self, x, y, adt, **_):
        return self.b.xor(self._truth(x, adt), self._truth(y, adt))

    def op_logical_not(self, x, adt, **_):
        return self.b.xor(self._truth(x, adt), I1(1))

    def op_where(self, c, x, y, adt, **_):
        return self.b.select(c, x, y)

    def op_cast(self, x, adt, dtype, **_):
        return self.cast(x, adt, dtype)

    # unary
    def op_neg(self, x, adt, **_):
        return self.b.fneg(x) if adt in FLOATS else self.b.neg(x)

    def op_abs(self, x, adt, **_):
        if adt in FLOATS:
            return self.intr("fabs", x)
        if adt in UNSIGNED:
            return x
        return self.b.select(self.b.icmp_signed("<", x, ir.Constant(x.type, 0)), self.b.neg(x), x)

    def op_sqrt(self, x, adt, **_):
        return self.intr("sqrt", x)

    def op_rsqrt(self, x, adt, **_):
        return self.b.fdiv(self.fconst(x, 1.0), self.intr("sqrt", x))

    def op_reciprocal(self, x, adt, **_):
        return self.b.fdiv(self.fconst(x, 1.0), x)

    def op_floor(self, x, adt, **_):
        return self.intr("floor", x)

    def op_ceil(self, x, adt, **_):
        return self.intr("ceil", x)

    def op_trunc(self, x, adt, **_):
        return self.intr("trunc", x)

    def op_round(self, x, adt, **_):
        return self.intr("roundeven", x)

    def op_frac(self, x, adt, **_):
        return self.b.fsub(x, self.intr("trunc", x))

    def op_sign(self, x, adt, **_):
        b = self.b
        if adt == "b8":
            return x
        if adt in FLOATS:  # (x > 0) - (x < 0), as torch computes it: sign(NaN) is 0
            zero = self.fconst(x, 0.0)
            pos = b.uitofp(b.fcmp_ordered(">", x, zero), x.type)
            neg = b.uitofp(b.fcmp_ordered("<", x, zero), x.type)
            return b.fsub(pos, neg)
        zero = ir.Constant(x.type, 0)
        if adt in UNSIGNED:
            return b.zext(b.icmp_unsigned(">", x, zero), x.type)
        return b.sub(b.zext(b.icmp_signed(">", x, zero), x.type), b.zext(b.icmp_signed("<", x, zero), x.type))

    def op_copy(self, x, adt, **_):
        return x

    def op_relu(self, x, adt, **_):
        b = self.b
        if adt in FLOATS:
            return b.select(b.fcmp_ordered("<", x, self.fconst(x, 0.0)), self.fconst(x, 0.0), x)
        if adt in UNSIGNED:
            return x
        return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), ir.Constant(x.type, 0), x)

    def op_silu(self, x, adt, **_):
        return self.b.fmul(x, self.math("sigmoid", x))

    def op_gelu(self, x, adt, approximate="none", **_):
        b, c = self.b, lambda v: self.fconst(x, v)
        if approximate == "tanh":
            inner = b.fmul(c(math.sqrt(2 / math.pi)), b.fadd(x, b.fmul(c(0.044715), b.fmul(x, b.fmul(x, x)))))
            return b.fmul(b.fmul(c(0.5), x), b.fadd(c(1.0), self.math("tanh", inner)))
        return b.fmul(b.fmul(c(0.5), x), b.fadd(c(1.0), self.math("erf", b.fmul(x, c(math.sqrt(0.5))))))

    def op_bitwise_not(self, x, adt, **_):
        return self.b.xor(x, ir.Constant(x.type, -1 if adt != "b8" else 1))

    def op_isnan(self, x, adt, **_):
        return self.b.fcmp_unordered("uno", x, x) if adt in FLOATS else I1(0)

    def op_isinf(self, x, adt, **_):
        if adt not in FLOATS:
            return I1(0)
        return self.b.fcmp_ordered("==", self.intr("fabs", x), self.fconst(x, float("inf")))
