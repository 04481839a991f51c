"""How the LLVM backend holds a scalar: register and memory types, constants, conversions.

Values live in registers as `reg_type(dtype)`: f16/bf16 are computed as float (f32 math) and rounded
back to their precision whenever an op produces them; b8 is i1 in registers and a byte in memory.
`Ops` emits at an IR builder's position the helpers every recipe of llvm_ops.py shares (intrinsics,
libm calls, our polynomial math, casts, the safe integer divisions).

Float -> integer casts follow torch on the CPU bit for bit, out of range and NaN included: torch
truncates through a 32-bit int for i8/i16/i32 and a 64-bit one for u8/i64, where x86's conversion
gives that int's minimum for NaN and anything out of range, and keeps the low bits. LLVM's fptosi
would be poison there, so the conversion selects a safe input and the minimum explicitly (still
vectorizable selects).
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from ..ir import sym
from ..ir.types import DTYPES, FLOATS, LOW_FLOATS, UNSIGNED
from .llvm_math import declare_math

F32, F64, I1, I8, I16, I32, I64 = (ir.FloatType(), ir.DoubleType(), ir.IntType(1), ir.IntType(8),
                                   ir.IntType(16), ir.IntType(32), ir.IntType(64))
_REG = {"f32": F32, "f16": F32, "bf16": F32, "f64": F64, "i64": I64, "i32": I32, "i16": I16,
        "i8": I8, "u8": I8, "b8": I1}
_VIA = {"i8": 32, "i16": 32, "i32": 32, "u8": 64, "i64": 64}  # float -> int: through an int this wide


def reg_type(dtype: str):
    return _REG[dtype]


def mem_type(dtype: str):
    return {"f16": ir.HalfType(), "bf16": I16, "b8": I8}.get(dtype) or reg_type(dtype)


def const(dtype: str, value):
    t = reg_type(dtype)
    if dtype in FLOATS:
        v = float(value)
        if dtype in LOW_FLOATS and math.isfinite(v):
            import torch
            v = float(torch.tensor(v, dtype=DTYPES[dtype]).float())
        return ir.Constant(t, v)
    if dtype == "b8":
        return ir.Constant(I1, int(bool(value)))
    return ir.Constant(t, int(value))


class Ops:
    """Emits scalar ops at the builder's position. `b` is an ir.IRBuilder, `module` its module, `gen`
    the kernel's code generator (llvm.py), whose loads, indices and accumulators the kernel-level
    recipes read."""

    def __init__(self, b: ir.IRBuilder, module: ir.Module, gen=None):
        self.b, self.module, self.gen = b, module, gen
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

    def float_to_int(self, v, bits: int):
        """Truncate float register v to a `bits`-wide int as x86 (and so torch on the CPU) does: the
        int's minimum for NaN and values out of range."""
        b, t = self.b, ir.IntType(bits)
        lo, hi = -2.0 ** (bits - 1), 2.0 ** (bits - 1)
        # everything in (lo - 1, lo) truncates to lo too; only f64 holds such values for 32 bits
        low_ok = b.fcmp_ordered(">", v, self.fconst(v, lo - 1)) if v.type == F64 and bits == 32 else \
            b.fcmp_ordered(">=", v, self.fconst(v, lo))
        ok = b.and_(low_ok, b.fcmp_ordered("<", v, self.fconst(v, hi)))
        out = b.fptosi(b.select(ok, v, self.fconst(v, 0.0)), t)
        return b.select(ok, out, ir.Constant(t, -(1 << (bits - 1))))

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
        if src in FLOATS:  # truncates toward zero, through torch's own route (see the module docstring)
            wide = self.float_to_int(v, _VIA[dst])
            return wide if wide.type == dt else b.trunc(wide, dt)
        if dst in FLOATS:
            out = b.uitofp(v, dt) if src in UNSIGNED else b.sitofp(v, dt)
            return self.round_to(dst, out)
        if st.width == dt.width:
            return v
        if st.width > dt.width:
            return b.trunc(v, dt)
        return b.zext(v, dt) if src in UNSIGNED else b.sext(v, dt)

    def safe_divisor(self, y):
        return self.b.select(self.b.icmp_signed("==", y, ir.Constant(y.type, 0)), ir.Constant(y.type, 1), y)

    def sdivrem(self, x, y):
        """Signed x / y and x % y, truncating, without the divisions that trap in hardware: y == 0
        divides by 1 (torch raises there), y == -1 gives -x (wrapping) and 0, as torch's INT_MIN // -1."""
        b, c = self.b, lambda v: ir.Constant(y.type, v)
        minus1 = b.icmp_signed("==", y, c(-1))
        safe = b.select(b.or_(minus1, b.icmp_signed("==", y, c(0))), c(1), y)
        return b.select(minus1, b.neg(x), b.sdiv(x, safe)), b.srem(x, safe)

    def truth(self, x, adt):
        return x if adt == "b8" else self.cast(x, adt, "b8")


def _floor_div_mod(b, num, d):
    """num // d and num % d rounded toward minus infinity, as Python's (ir/sym.py evaluates them so):
    LLVM's sdiv and srem truncate toward zero."""
    q, r = b.sdiv(num, d), b.srem(num, d)
    off = b.and_(b.icmp_signed("!=", r, I64(0)), b.icmp_signed("!=", b.icmp_signed("<", r, I64(0)),
                                                                 b.icmp_signed("<", d, I64(0))))
    return b.sub(q, b.zext(off, q.type)), b.add(r, b.select(off, d, I64(0)))


def emit_sym(b, x, vals: dict):
    """LLVM code computing size expression x (ir/sym.py) from the symbols' values `vals` (name -> i64)."""
    if not isinstance(x, sym.Sym):
        return I64(x)
    total = I64(x.const) if x.const else None
    for mono, c in x.terms:
        v = None
        for a in mono:
            if isinstance(a, str):
                f = vals[a]
            else:
                num, d = emit_sym(b, a.arg, vals), emit_sym(b, a.d, vals)
                f = _floor_div_mod(b, num, d)[a.kind == "mod"]
            v = f if v is None else b.mul(v, f)
        v = v if c == 1 else b.mul(v, I64(c))
        total = v if total is None else b.add(total, v)
    return total
