"""Vectorizable float32 math functions emitted as LLVM IR.

Why this exists: LLVM keeps ``llvm.exp.f32``, ``llvm.cos.f32`` & co. as scalar
libm calls -- the loop vectorizer in llvmlite 0.50 (LLVM 22) does not widen
them because no vector math library is wired in.  One libm call per element
serialises every elementwise kernel.  Here each function is written with only
operations that *do* vectorize: fadd/fmul/fdiv, fcmp+select, integer ops on
bitcasts, fptosi/sitofp and the ``llvm.fabs/floor/copysign/fma/fmuladd``
intrinsics.  Each function is emitted as an ``internal alwaysinline``
``minicomp_<name>`` so that after inlining a counted loop over it vectorizes.

Algorithms are the classic Cephes/musl single-precision ones (polynomials on a
reduced range plus exponent manipulation); ``erfc``'s tail and ``erf`` (a polynomial
below 0.9, 1 - exp(polynomial) above: no division) were fitted here.
Accuracy is a few ulp over the whole float range; NaN propagates everywhere,
and +-inf, +-0 and overflow/underflow give the IEEE/C99 results.  Results that
underflow into the denormal range are computed (not flushed).

``sin/cos/tan`` use a 3-part Cody-Waite reduction by pi/2 relying on a real
fused multiply-add (``llvm.fma``; the quadrant is picked in double): accurate
for |x| <= 2**24.  Beyond that the result is NaN rather than garbage, since a
correct answer needs Payne-Hanek reduction.  ``erf/erfc`` use ``llvm.fma`` too.
On a CPU without FMA ``llvm.fma`` becomes a correct but scalar ``fmaf`` call
(and ``llvm.floor`` a ``floorf`` call without SSE4.1); the loop still
vectorizes.  ``pow`` works in double internally since y*log2(x) needs ~8 more
bits than float holds.
"""
import math

from llvmlite import ir

F32, F64, I32, I64 = ir.FloatType(), ir.DoubleType(), ir.IntType(32), ir.IntType(64)
INF, NAN = float("inf"), float("nan")

# ln2 = LN2_HI + LN2_LO with LN2_HI short enough that n*LN2_HI is exact (Cephes).
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
LOG2E = 1.4426950408889634
# pi/2 as three float32 parts; fma(n, -P_i, r) keeps the reduction exact enough.
PIO2 = (1.5707963705062866, -4.371138828673793e-08, -1.7151245100058819e-15)

# Minimax polynomial coefficients, highest degree first.
EXP_P = [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,  # (e^r-1-r)/r^2
         4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1]
LOG_P = [7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1,  # (log(1+f)-f+f^2/2)/f^3
         -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
         2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1]
TANH_P = [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2,  # |x| < 0.625
          1.33314422036e-1, -3.33332819422e-1]
SIN_P = [-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1]  # |r| <= pi/4
COS_P = [2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2]
ATAN_P = [8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1]
ERF_P = [7.853861353153693e-5, -8.010193625184903e-4, 5.188327685732524e-3,  # |x| < 1
         -2.685381193529856e-2, 1.128358514861418e-1, -3.761262582423300e-1,
         1.128379165726710]
# erf(x) = x + x P(x^2) for |x| < ERF_SPLIT, and 1 - exp(Q(|x|)) above (Q ~ log erfc, clamped at 4
# where erf rounds to 1): least-squares fits on Chebyshev nodes, < 1 ulp each in float64 evaluation.
ERF_SPLIT = 0.9
ERF_SMALL = [-0.0006123211505332361, 0.0050191117898642805, -0.026784500216731486,
             0.11282327852441701, -0.37612547503853694, 0.1283791611352128]
ERF_LOGC = [1.610240420592143e-06, -4.5512773017957066e-05, 0.0005920927587338347,
            -0.004736950625054505, 0.02635512078694126, -0.10996079944909624,
            -0.6319562413332439, -1.1301551015834737, 0.00030026882562670044]
# erfc(a) * exp(a^2) on a in [0.5, 10.5] as a polynomial in t = (a-3)/(a+3)
# (least squares on Chebyshev nodes, coefficients rounded one at a time).
ERFC_K = 3.0
ERFC_G = [9.413179e-06, -5.41099e-4, 7.28745e-4, 4.2503383e-3, -2.4396842e-2,
          7.166854e-2, -1.5011564e-1, 2.4560367e-1, -3.2623357e-1, 1.7900115e-1]
_TRIG_MAX = 2.0 ** 24


class _E:
    """IRBuilder wrapper: Python floats become constants of the operand type,
    compares are NaN-aware (ordered => false on NaN)."""

    def __init__(self, builder):
        self.b = builder

    def _v(self, x, ty=F32):
        return ir.Constant(ty, x) if isinstance(x, (int, float)) else x

    def _ops(self, *xs):
        ty = next((x.type for x in xs if not isinstance(x, (int, float))), F32)
        return [self._v(x, ty) for x in xs]

    def intr(self, name, *args):
        args = self._ops(*args)
        ty = args[0].type
        mod = self.b.module
        fname = "llvm.%s.%s" % (name, "f32" if ty == F32 else "f64")
        fn = mod.globals.get(fname)
        if fn is None:
            fn = ir.Function(mod, ir.FunctionType(ty, [ty] * len(args)), fname)
        return self.b.call(fn, args)

    def add(self, a, b): return self.b.fadd(*self._ops(a, b))
    def sub(self, a, b): return self.b.fsub(*self._ops(a, b))
    def mul(self, a, b): return self.b.fmul(*self._ops(a, b))
    def div(self, a, b): return self.b.fdiv(*self._ops(a, b))
    def madd(self, a, b, c): return self.intr("fmuladd", a, b, c)  # a*b+c, fused if cheap
    def fma(self, a, b, c): return self.intr("fma", a, b, c)  # a*b+c, one rounding
    def abs(self, x): return self.intr("fabs", x)
    def floor(self, x): return self.intr("floor", x)
    def copysign(self, mag, sgn): return self.intr("copysign", mag, sgn)
    def cmp(self, op, a, b): return self.b.fcmp_ordered(op, *self._ops(a, b))
    def isnan(self, x): return self.b.fcmp_unordered("uno", x, x)

    def sel(self, c, a, b):
        return self.b.select(c, *self._ops(a, b))

    def poly(self, x, cs):  # Horner
        acc = self._v(cs[0], x.type)
        for c in cs[1:]:
            acc = self.madd(acc, x, c)
        return acc

    def bits(self, x): return self.b.bitcast(x, I32)
    def flt(self, i): return self.b.bitcast(i, F32)
    def i(self, v): return ir.Constant(I32, v)

    def pow2(self, n):  # 2.0**n for i32 n in [-126, 127], built in the exponent field
        return self.flt(self.b.shl(self.b.add(n, self.i(127)), self.i(23)))

    def nan_pass(self, x, res):  # NaN in -> the same NaN out, whatever res computed
        return self.sel(self.isnan(x), x, res)

    def keep_zero(self, x, res):  # odd functions: f(+-0) = +-0 exactly
        return self.sel(self.cmp("==", x, 0.0), x, res)


# ---------------------------------------------------------------- exp family
def _exp_parts(e, x, lo, hi, base2=False):
    """exp(x) = 2**n * (1 + u): returns (n: i32, u = expm1(r)), |r| <= ln2/2.

    x is clamped to [lo, hi] first; the clamp also maps NaN to lo because
    fptosi(NaN) is poison.  Callers restore NaN with nan_pass."""
    x = e.sel(e.cmp(">", x, lo), x, lo)
    x = e.sel(e.cmp("<", x, hi), x, hi)
    if base2:
        nf = e.floor(e.add(x, 0.5))
        r = e.mul(e.sub(x, nf), math.log(2))  # x - nf is exact
    else:
        nf = e.floor(e.madd(x, LOG2E, 0.5))
        r = e.madd(nf, -LN2_HI, x)  # exact: nf*LN2_HI has few bits
        r = e.madd(nf, -LN2_LO, r)
    # u = r + r^2 P(r): no "+1" yet, so expm1 near 0 keeps full precision.
    u = e.madd(e.poly(r, EXP_P), e.mul(r, r), r)
    return e.b.fptosi(nf, I32), u


def _scale(e, y, n):
    """y * 2**n for y in (0.7, 1.5) and n in [-252, 254]: two exponent-field multiplies so that
    overflow gives inf and the denormal range is rounded only once. A result that rounds to zero
    (n <= -151) is 0 without the multiply that would underflow: on x86 every lane of a multiply
    whose result underflows costs a microcode assist, which made a softmax over masked (-inf)
    scores four times slower. Only truly denormal results (e^x for x in [-103.9, -87.3]) pay it."""
    zero = e.b.icmp_signed("<", n, e.i(-150))
    n = e.b.select(zero, e.i(0), n)
    n1 = e.b.ashr(n, e.i(1))
    return e.sel(zero, 0.0, e.mul(e.mul(y, e.pow2(n1)), e.pow2(e.b.sub(n, n1))))


def _exp(e, x):
    n, u = _exp_parts(e, x, -106.0, 89.0)  # e^-106: n = -153, exactly 0; e^89 -> inf
    return e.nan_pass(x, _scale(e, e.add(u, 1.0), n))


def _exp2(e, x):
    n, u = _exp_parts(e, x, -151.0, 129.0, base2=True)
    return e.nan_pass(x, _scale(e, e.add(u, 1.0), n))


def _expm1(e, x):
    n, u = _exp_parts(e, x, -30.0, 89.0)  # expm1(x < -17.4) rounds to -1
    big = e.b.icmp_signed(">", n, e.i(127))  # 2**128 itself is not a float
    s = e.pow2(e.b.select(big, e.i(127), n))
    res = e.madd(s, u, e.sub(s, 1.0))  # 2^n (1+u) - 1; exact s-1 avoids cancellation
    res = e.sel(big, e.mul(e.mul(e.add(u, 1.0), s), 2.0), res)
    return e.nan_pass(x, e.keep_zero(x, res))


# ---------------------------------------------------------------- log family
def _log_parts(e, x):
    """x = 2**k * (1 + f), 1+f in [sqrt(1/2), sqrt(2)).

    Returns (k as float, f, y) with log(1+f) = f + y.  Garbage for x <= 0,
    inf, NaN: _log_specials overrides those."""
    tiny = e.cmp("<", x, 2.0 ** -126)  # denormals: scale into the normal range
    xs = e.sel(tiny, e.mul(x, 2.0 ** 23), x)
    # musl trick: offset the bits so the exponent split falls at sqrt(1/2).
    ix = e.b.add(e.bits(xs), e.i(0x3F800000 - 0x3F3504F3))
    k = e.b.sub(e.b.ashr(ix, e.i(23)), e.i(127))
    m = e.flt(e.b.add(e.b.and_(ix, e.i(0x007FFFFF)), e.i(0x3F3504F3)))
    kf = e.sub(e.b.sitofp(k, F32), e.sel(tiny, 23.0, 0.0))
    f = e.sub(m, 1.0)  # exact (Sterbenz)
    z = e.mul(f, f)
    y = e.madd(z, -0.5, e.mul(e.mul(e.poly(f, LOG_P), f), z))
    return kf, f, y


def _log_specials(e, x, res):
    res = e.sel(e.cmp("==", x, INF), INF, res)
    res = e.sel(e.cmp("<", x, 0.0), NAN, res)
    res = e.sel(e.cmp("==", x, 0.0), -INF, res)
    return e.nan_pass(x, res)


def _log(e, x):
    kf, f, y = _log_parts(e, x)
    # Cephes summation order: small terms first, k*LN2_HI (exact) last.
    res = e.madd(kf, LN2_HI, e.add(f, e.madd(kf, LN2_LO, y)))
    return _log_specials(e, x, res)


def _log2(e, x):
    kf, f, y = _log_parts(e, x)
    lm = e.add(f, y)  # log(1+f); log2e split in two so k dominates exactly
    res = e.madd(lm, 1.4426950216293335, e.madd(lm, 1.9259629911266175e-08, kf))
    return _log_specials(e, x, res)


def _log1p(e, x):
    # Goldberg's trick: log(u) * x/(u-1) with u = 1+x cancels the rounding
    # error made in forming u.  u == 1 means |x| < ulp: log1p(x) = x.
    u = e.add(x, 1.0)
    d = e.sub(u, 1.0)
    res = e.mul(_log(e, u), e.div(x, d))
    res = e.sel(e.cmp("==", d, 0.0), x, res)
    return e.sel(e.cmp("==", x, INF), INF, res)  # inf/inf above; NaN flows through


# ------------------------------------------------------ tanh, sigmoid, erf
def _tanh(e, x):
    ax = e.abs(x)
    z = e.mul(x, x)
    small = e.madd(e.mul(x, z), e.poly(z, TANH_P), x)
    # 1 - 2/(e^2|x| + 1): no cancellation for |x| >= 0.625; exp -> inf gives 1.
    big = e.sub(1.0, e.div(2.0, e.add(_exp(e, e.mul(ax, 2.0)), 1.0)))
    res = e.sel(e.cmp("<", ax, 0.625), small, e.copysign(big, x))
    return e.keep_zero(x, res)  # NaN: compare false -> big path -> NaN


def _sigmoid(e, x):
    t = _exp(e, e.sub(0.0, e.abs(x)))  # e^-|x| never overflows
    d = e.add(t, 1.0)
    return e.sel(e.cmp("<", x, 0.0), e.div(t, d), e.div(1.0, d))


def _erfc_tail(e, a):
    """erfc(a) for a in [0.5, 10.5]: exp(-a^2) * g((a-3)/(a+3))."""
    g = e.poly(e.div(e.sub(a, ERFC_K), e.add(a, ERFC_K)), ERFC_G)
    hi = e.mul(a, a)
    lo = e.fma(a, a, e.sub(0.0, hi))  # a^2 = hi + lo exactly
    ex = _exp(e, e.sub(0.0, hi))
    return e.mul(e.madd(ex, e.sub(0.0, lo), ex), g)  # exp(-hi)*(1-lo)


def _erf_small(e, x):  # |x| < 1
    return e.mul(e.poly(e.mul(x, x), ERF_P), x)


def _erf(e, x):
    """No division; one exp, whose argument stays in [-19, 0]: a single exponent-field scale."""
    ax = e.abs(x)
    small = e.madd(x, e.poly(e.mul(x, x), ERF_SMALL), x)
    t = e.sel(e.cmp(">", ax, ERF_SPLIT), ax, ERF_SPLIT)
    t = e.sel(e.cmp("<", t, 4.0), t, 4.0)  # erf(4) rounds to 1.0f; the clamps also eat NaN
    n, u = _exp_parts(e, e.poly(t, ERF_LOGC), -30.0, 1.0)
    big = e.copysign(e.sub(1.0, e.mul(e.add(u, 1.0), e.pow2(n))), x)
    return e.nan_pass(x, e.sel(e.cmp("<", ax, ERF_SPLIT), small, big))


def _erfc(e, x):
    ax = e.abs(x)
    a = e.sel(e.cmp("<", ax, 10.5), ax, 10.5)  # erfc(10.5) underflows to 0
    tail = _erfc_tail(e, e.sel(e.cmp(">", a, 0.5), a, 0.5))
    res = e.sel(e.cmp("<", x, 0.0), e.sub(2.0, tail), tail)
    res = e.sel(e.cmp("<", ax, 0.5), e.sub(1.0, _erf_small(e, x)), res)
    return e.nan_pass(x, res)


# ------------------------------------------------------------ trigonometry
def _trig_reduce(e, x):
    """x = q*pi/2 + r with |r| <~ pi/4 (Cody-Waite); returns (ok, q: i32, r)."""
    ok = e.cmp("<=", e.abs(x), _TRIG_MAX)  # false for inf and NaN too
    xs = e.sel(ok, x, 0.0)  # keeps fptosi defined
    # q in double: in float, x*2/pi rounds by >= 0.25 once x > 2**21 and q
    # could be off by one (|r| > pi/4, outside the polynomials' range).
    xd = e.b.fpext(xs, F64)
    qf = e.b.fptrunc(e.floor(e.madd(xd, 2.0 / math.pi, 0.5)), F32)  # exact: |q| < 2**24
    r = xs
    for p in PIO2:  # first step is exact: q*P0 and x cancel to <= 24 bits
        r = e.fma(qf, -p, r)
    return ok, e.b.fptosi(qf, I32), r


def _sincos_poly(e, r):
    z = e.mul(r, r)
    s = e.madd(e.mul(r, z), e.poly(z, SIN_P), r)
    c = e.madd(e.mul(z, z), e.poly(z, COS_P), e.madd(z, -0.5, 1.0))
    return s, c


def _sin(e, x, cos=False):
    ok, q, r = _trig_reduce(e, x)
    if cos:
        q = e.b.add(q, e.i(1))  # cos(x) = sin(x + pi/2)
    s, c = _sincos_poly(e, r)
    odd = e.b.icmp_signed("!=", e.b.and_(q, e.i(1)), e.i(0))
    res = e.sel(odd, c, s)
    # quadrants 2 and 3 flip the sign: move bit 1 of q to the sign bit
    sign = e.b.shl(e.b.and_(q, e.i(2)), e.i(30))
    res = e.flt(e.b.xor(e.bits(res), sign))
    if not cos:
        res = e.keep_zero(x, res)
    return e.sel(ok, res, NAN)


def _cos(e, x):
    return _sin(e, x, cos=True)


def _tan(e, x):
    ok, q, r = _trig_reduce(e, x)
    s, c = _sincos_poly(e, r)
    odd = e.b.icmp_signed("!=", e.b.and_(q, e.i(1)), e.i(0))
    res = e.div(e.sel(odd, c, s), e.sel(odd, e.sub(0.0, s), c))  # odd q: -cot(r)
    return e.sel(ok, e.keep_zero(x, res), NAN)


def _atan(e, x):
    ax = e.abs(x)
    big = e.cmp(">", ax, 2.414213562373095)  # tan(3pi/8)
    mid = e.cmp(">", ax, 0.41421356237309503)  # tan(pi/8)
    # reduce: atan(a) = pi/2 + atan(-1/a) = pi/4 + atan((a-1)/(a+1))
    t = e.sel(big, e.div(-1.0, ax), e.sel(mid, e.div(e.sub(ax, 1.0), e.add(ax, 1.0)), ax))
    base_hi = e.sel(big, math.pi / 2, e.sel(mid, math.pi / 4, 0.0))
    base_lo = e.sel(big, -4.371139e-8, e.sel(mid, -2.1855695e-8, 0.0))  # pi/2-fl(pi/2), pi/4-..
    z = e.mul(t, t)
    p = e.madd(e.mul(t, z), e.poly(z, ATAN_P), e.add(t, base_lo))
    return e.copysign(e.add(base_hi, p), x)  # NaN: every compare false -> poly(NaN)


# --------------------------------------------------------------------- pow
def _pow(e, x, y):
    """x**y = 2**(y*log2|x|) with the log and exp2 in double, plus C99 specials."""
    b = e.b
    ax = e.abs(x)
    kf, f, _ = _log_parts(e, ax)
    m = b.fpext(e.add(f, 1.0), F64)
    s = e.div(e.sub(m, 1.0), e.add(m, 1.0))  # log(m) = 2 atanh(s), |s| < 0.172
    s2 = e.mul(s, s)
    ln_m = e.mul(e.mul(s, 2.0), e.poly(s2, [1.0 / (2 * k + 1) for k in range(7, -1, -1)]))
    lg = e.madd(ln_m, 1.0 / math.log(2), b.fpext(kf, F64))
    lg = e.sel(e.cmp("==", ax, 0.0), -INF, e.sel(e.cmp("==", ax, INF), INF, lg))
    t = e.mul(b.fpext(y, F64), lg)
    t = e.sel(e.cmp(">", t, -160.0), t, -160.0)  # 2^-160 -> 0, 2^130 -> inf after fptrunc;
    t = e.sel(e.cmp("<", t, 130.0), t, 130.0)  # also NaN -> -160 (fixed below)
    nf = e.floor(e.add(t, 0.5))
    w = e.mul(e.sub(t, nf), math.log(2))  # 2^(t-n) = e^w, |w| <= 0.35
    p = e.poly(w, [1.0 / math.factorial(k) for k in range(9, -1, -1)])
    n = b.fptosi(nf, I64)
    scale = b.bitcast(b.shl(b.add(n, ir.Constant(I64, 1023)), ir.Constant(I64, 52)), F64)
    res = b.fptrunc(e.mul(p, scale), F32)  # one rounding: overflow and denormals correct
    # sign: negative x needs integer y; odd y keeps the sign (|y| >= 2^24 is even)
    yint = e.cmp("==", e.floor(y), y)
    odd = b.and_(yint, e.cmp("!=", e.mul(e.floor(e.mul(y, 0.5)), 2.0), y))
    res = e.sel(odd, e.copysign(res, x), res)
    neg_finite = b.and_(e.cmp("<", x, 0.0), e.cmp(">", x, -INF))
    res = e.sel(b.and_(neg_finite, b.not_(yint)), NAN, res)
    res = e.sel(b.or_(e.isnan(x), e.isnan(y)), NAN, res)
    one = b.or_(e.cmp("==", y, 0.0), e.cmp("==", x, 1.0))  # pow(x, 0) = pow(1, y) = 1
    one = b.or_(one, b.and_(e.cmp("==", x, -1.0), e.cmp("==", e.abs(y), INF)))
    return e.sel(one, 1.0, res)


# name -> (number of float arguments, emitter)
_FUNCS = {
    "exp": (1, _exp), "exp2": (1, _exp2), "expm1": (1, _expm1),
    "log": (1, _log), "log2": (1, _log2), "log1p": (1, _log1p),
    "tanh": (1, _tanh), "sigmoid": (1, _sigmoid), "erf": (1, _erf), "erfc": (1, _erfc),
    "sin": (1, _sin), "cos": (1, _cos), "tan": (1, _tan), "atan": (1, _atan),
    "pow": (2, _pow),
}
MATH_FUNCTIONS = tuple(_FUNCS)


def declare_math(module: ir.Module, name: str) -> ir.Function:
    """Return ``float minicomp_<name>(float[, float])`` in ``module``, emitting
    it on first use.  Internal + alwaysinline so it disappears into (and
    vectorizes with) the calling loop."""
    fname = "minicomp_" + name
    fn = module.globals.get(fname)
    if fn is not None:
        return fn
    if name not in _FUNCS:
        raise KeyError("unknown math function %r (have: %s)" % (name, ", ".join(_FUNCS)))
    nargs, emit = _FUNCS[name]
    fn = ir.Function(module, ir.FunctionType(F32, [F32] * nargs), fname)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(emit(_E(builder), *fn.args))
    return fn
