"""JIT-compile a counted loop around each minicomp_<fn> and compare with torch float32."""
import ctypes
import re

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np
import pytest
import torch

from minicomp.codegen.llvm_math import MATH_FUNCTIONS, declare_math

F32, I64 = ir.FloatType(), ir.IntType(64)
RTOL = 2e-6  # ~16 ulp; the implementations are within ~4 ulp of the true value
ATOL = 1e-38  # only denormal outputs may be compared absolutely

TORCH = {name: getattr(torch, name) for name in MATH_FUNCTIONS}
TORCH["sigmoid"] = torch.sigmoid


def _add_kernel(mod, name):
    """void k_<name>(float* out, float* in0[, float* in1], i64 n): out[i] = f(in[i])."""
    fn = declare_math(mod, name)
    nargs = len(fn.args)
    ptr = F32.as_pointer()
    k = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr] * (1 + nargs) + [I64]), "k_" + name)
    entry, loop, done = (k.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    n = k.args[-1]
    b.cbranch(b.icmp_signed(">", n, I64(0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(I64)
    i.add_incoming(I64(0), entry)
    args = [b.load(b.gep(a, [i])) for a in k.args[1:1 + nargs]]
    b.store(b.call(fn, args), b.gep(k.args[0], [i]))
    i_next = b.add(i, I64(1))
    i.add_incoming(i_next, loop)
    b.cbranch(b.icmp_signed("<", i_next, n), loop, done)
    b.position_at_end(done)
    b.ret_void()


class _Jit:
    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        mod = ir.Module("llvm_math_test")
        mod.triple = llvm.get_process_triple()
        for name in MATH_FUNCTIONS:
            _add_kernel(mod, name)
        self.tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
        m = llvm.parse_assembly(str(mod))
        m.verify()
        pb = llvm.create_pass_builder(self.tm, llvm.PipelineTuningOptions(speed_level=3))
        pb.getModulePassManager().run(m, pb)
        self.optimized_ir = str(m)
        self.engine = llvm.create_mcjit_compiler(m, self.tm)
        self.engine.finalize_object()

    def __call__(self, name, *inputs):
        ins = [np.ascontiguousarray(x, dtype=np.float32) for x in inputs]
        out = np.empty_like(ins[0])
        proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (1 + len(ins)), ctypes.c_int64)
        proto(self.engine.get_function_address("k_" + name))(
            out.ctypes.data, *[x.ctypes.data for x in ins], out.size)
        return out


@pytest.fixture(scope="module")
def jit():
    return _Jit()


def _check(got, ref, inputs, what):
    got_t, ref_t = torch.from_numpy(got), torch.from_numpy(ref)
    ok = torch.isclose(got_t, ref_t, rtol=RTOL, atol=ATOL, equal_nan=True)
    if not bool(ok.all()):
        bad = (~ok).nonzero().flatten()[:5].tolist()
        rows = [(tuple(float(x[j]) for x in inputs), float(got[j]), float(ref[j])) for j in bad]
        pytest.fail("%s: %d mismatches, e.g. (input, got, torch): %s"
                    % (what, int((~ok).sum()), rows))


_rng = np.random.default_rng(1234)


def _logu(lo, hi, n=50000, signed=True):
    """Random magnitudes log-uniform in [lo, hi] (both signs if signed)."""
    v = np.exp(_rng.uniform(np.log(lo), np.log(hi), n))
    return (v * _rng.choice([-1.0, 1.0], n) if signed else v).astype(np.float32)


def _lin(lo, hi, n=100001):
    return np.linspace(lo, hi, n, dtype=np.float32)


# Dense sweeps over each function's interesting range plus log-uniform magnitudes.
SWEEPS = {
    "exp": [_lin(-104, 89), _logu(1e-30, 110)],
    "exp2": [_lin(-151, 129), _logu(1e-30, 160)],
    "expm1": [_lin(-20, 89), _lin(-1, 1), _logu(1e-38, 100)],
    "log": [_lin(0.25, 4), _logu(1e-45, 3e38, signed=False)],
    "log2": [_lin(0.25, 4), _logu(1e-45, 3e38, signed=False)],
    "log1p": [_lin(-0.99, 3), _logu(1e-38, 3e38, signed=False), -_logu(1e-38, 1, signed=False)],
    "tanh": [_lin(-10, 10), _logu(1e-38, 100)],
    "sigmoid": [_lin(-100, 100), _logu(1e-38, 200)],
    "erf": [_lin(-5, 5), _logu(1e-38, 100)],
    "erfc": [_lin(-5, 10.5), _logu(1e-38, 100)],
    "sin": [_lin(-10, 10), _logu(1e-38, 1e5), _logu(1e5, 2 ** 24)],
    "cos": [_lin(-10, 10), _logu(1e-38, 1e5), _logu(1e5, 2 ** 24)],
    "tan": [_lin(-10, 10), _logu(1e-38, 1e5)],
    "atan": [_lin(-10, 10), _logu(1e-38, 1e38)],
}
DENORMALS = [1e-45, 1e-40, 5e-39, 1.1754942e-38]
SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-30, -1e-30,
     1.1754944e-38, 3.4e38, -3.4e38, 88.72, 88.73, -87.3, -103.9, -104.5, 100.0, -100.0,
     1.5707964, 3.1415927, 1e5, -1e5]
    + DENORMALS + [-d for d in DENORMALS], np.float32)


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_sweep_matches_torch(jit, name):
    for x in SWEEPS[name]:
        ref = TORCH[name](torch.from_numpy(x)).numpy()
        _check(jit(name, x), ref, [x], "%s on [%g, %g]" % (name, x.min(), x.max()))


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_special_values(jit, name):
    x = SPECIALS
    if name in ("sin", "cos", "tan"):  # see test_trig_beyond_reduction_range_is_nan
        x = x[~(np.abs(x) > 2.0 ** 24)]
    got = jit(name, x)
    ref = TORCH[name](torch.from_numpy(x)).numpy()
    _check(got, ref, [x], name + " specials")
    _check_exact_inf_zero(got, ref, name)


def _check_exact_inf_zero(got, ref, what):
    """Infinite results must match exactly; zero results too, sign included,
    except that we may return a denormal where torch flushes to zero."""
    inf = np.isinf(ref)
    np.testing.assert_array_equal(got[inf], ref[inf], err_msg=what)
    zero = (ref == 0) & (got == 0)
    assert (np.abs(got[ref == 0]) < np.finfo(np.float32).tiny).all(), what
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(ref[zero]), err_msg=what)


def test_trig_beyond_reduction_range_is_nan(jit):
    # Cody-Waite reduction is only valid up to 2**24; beyond we return NaN, not garbage.
    x = np.array([2.0 ** 25, -1e10, 3e38], np.float32)
    for name in ("sin", "cos", "tan"):
        assert np.isnan(jit(name, x)).all()


def test_pow(jit):
    x = np.concatenate([_logu(1e-6, 1e6, signed=False), _lin(0, 3, 50000),
                        -_logu(0.1, 10, 20000, signed=False)])
    y = np.concatenate([_rng.uniform(-6, 6, 50000), _rng.uniform(-60, 60, 50000),
                        _rng.integers(-30, 30, 20000)]).astype(np.float32)
    ref = torch.pow(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    _check(jit("pow", x, y), ref, [x, y], "pow sweep")
    sp = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, np.inf, -np.inf, np.nan,
                   1e-45, 3e38, -8.0], np.float32)
    xs, ys = (a.ravel().copy() for a in np.meshgrid(sp, sp))
    got = jit("pow", xs, ys)
    ref = torch.pow(torch.from_numpy(xs), torch.from_numpy(ys)).numpy()
    _check(got, ref, [xs, ys], "pow specials")
    _check_exact_inf_zero(got, ref, "pow specials")


def test_exp_loop_vectorizes(jit):
    body = jit.optimized_ir.split("@k_exp(", 1)[1].split("\n}", 1)[0]
    assert re.search(r"<(4|8|16) x float>", body), "exp loop was not vectorized"
    assert "@llvm.exp" not in body and "@expf" not in body


def test_declare_math_caches_and_inlines():
    mod = ir.Module()
    f = declare_math(mod, "exp")
    assert declare_math(mod, "exp") is f
    assert f.name == "minicomp_exp" and f.linkage == "internal"
    assert "alwaysinline" in f.attributes
    assert len(declare_math(mod, "pow").args) == 2
    with pytest.raises(KeyError):
        declare_math(mod, "no_such_fn")


def test_exp_underflow_is_exactly_zero(jit):
    """Below ln(2^-150) exp, sigmoid's e^-|x| and erfc's tail are 0 exactly: computed without the
    multiply that would underflow (a microcode assist per lane on x86: a masked softmax hits it for
    every masked score)."""
    x = np.array([-np.inf, -1e4, -106.0, -105.0, -104.0], np.float32)
    assert (jit("exp", x) == 0).all() and not np.signbit(jit("exp", x)).any()
    assert (jit("sigmoid", -x[1:]) == 1).all() and (jit("sigmoid", x[1:]) == 0).all()
    near = np.array([-103.9, -100.0, -88.0], np.float32)  # true denormals are still computed
    np.testing.assert_array_equal(jit("exp", near), torch.exp(torch.from_numpy(near)).numpy())
