"""Lowerings of reductions and the normalizations built from them (softmax, layer/group/batch norm).

Sums of f16/bf16 accumulate in f32 and means divide in f32, as eager's kernels do; every
normalization is spelled out in IR reductions and pointwise ops, so fusion sees all of it.
"""
from __future__ import annotations

import math

from ..ir import dtype_name
from ..ir.sym import decide, is_sym, known
from ..ir.types import dim
from .lower_nn import fold_batch_norm
from .lowering import Unsupported, aten, compute_dtype, lowering, norm_dim, norm_dims


def _sum(b, x, dims, keepdim=False, dtype=None):
    """sum in the accumulation dtype, cast to the result dtype."""
    out_dt = b.out_dtype if dtype is None else dtype
    acc = compute_dtype(out_dt)
    return b.cast(b.emit("sum", b.cast(x, acc), dims=dims, keepdim=keepdim), out_dt)


def _count(x, dims):
    return math.prod(x.type.shape[d] for d in dims)


@lowering(aten.sum.dim_IntList, aten.sum.default)
def _lower_sum(b, x, dims=None, keepdim=False, dtype=None):
    return _sum(b, x, norm_dims(dims, x.type.ndim), keepdim)


@lowering(aten.mean.dim, aten.mean.default)
def _mean(b, x, dims=None, keepdim=False, dtype=None):
    dims = norm_dims(dims, x.type.ndim)
    acc = compute_dtype(b.out_dtype)
    s = b.emit("sum", b.cast(x, acc), dims=dims, keepdim=keepdim)
    return b.cast(b.emit("div", s, b.full(_count(x, dims), acc)), b.out_dtype)


def _nonempty(x, dims) -> None:
    """max, min and their arg- forms have no value over an empty dimension (torch raises): a symbolic
    one is guarded non-empty here, so a call of size 0 runs in torch and gets torch's error."""
    for d in dims:
        size = x.type.shape[d]
        if is_sym(size) and not known(size, ">=", 1):
            decide(size, ">=", 1)


def _minmax(op):
    def lower(b, x, dims=None, keepdim=False):
        dims = norm_dims(dims, x.type.ndim)
        _nonempty(x, dims if dims else range(x.type.ndim))
        return b.emit(op, x, dims=dims, keepdim=keepdim)
    return lower


lowering(aten.amax)(_minmax("amax"))
lowering(aten.amin)(_minmax("amin"))
lowering(aten.max.default)(_minmax("amax"))
lowering(aten.min.default)(_minmax("amin"))


@lowering(aten.max.dim, aten.min.dim)
def _max_dim(b, x, dim, keepdim=False):
    dim = norm_dim(dim, x.type.ndim)
    if x.type.ndim == 0:
        return x, b.full(0, "i64")
    is_max = b.target_name.startswith("aten.max")
    _nonempty(x, (dim,))
    values = b.emit("amax" if is_max else "amin", x, dims=(dim,), keepdim=keepdim)
    # torch's argmax takes no bools; as bytes they order the same
    index_of = b.cast(x, "u8") if x.type.dtype == "b8" else x
    return values, b.emit("argmax" if is_max else "argmin", index_of, dim=dim, keepdim=keepdim)


@lowering(aten.argmax, aten.argmin)
def _argmax(b, x, dim=None, keepdim=False):
    op = "argmax" if b.target_name.startswith("aten.argmax") else "argmin"
    if x.type.ndim == 0:
        return b.full(0, "i64")
    _nonempty(x, range(x.type.ndim) if dim is None else (norm_dim(dim, x.type.ndim),))
    if dim is None:
        flat = b.reshape(x, (x.type.numel,))
        out = b.emit(op, flat, dim=0, keepdim=False)
        return b.reshape(out, b.out_shape)
    return b.emit(op, x, dim=norm_dim(dim, x.type.ndim), keepdim=keepdim)


@lowering(aten.prod.default, aten.prod.dim_int)
def _prod(b, x, dim=None, keepdim=False, dtype=None):
    dims = norm_dims(dim, x.type.ndim)
    if b.out_dtype == "b8":  # a product of bools is their conjunction
        return b.emit("amin", b.cast(x, "b8"), dims=dims, keepdim=keepdim)
    return b.emit("prod", b.cast(x, b.out_dtype), dims=dims, keepdim=keepdim)


@lowering(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def _any_all(b, x, dim=None, keepdim=False):
    dims = norm_dims(dim, x.type.ndim)
    as_bool = b.cast(x, "b8") if x.type.dtype != "b8" else x
    op = "amax" if b.target_name.startswith("aten.any") else "amin"
    return b.cast(b.emit(op, as_bool, dims=dims, keepdim=keepdim), b.out_dtype)


def _count_less(b, n, correction, acc):
    """max(n - correction, 0) as torch divides by it; over a symbolic n the max is an op at run time
    (a guard on `n > correction` would split the program at the small sizes)."""
    if not is_sym(n) or known(n, ">=", correction):
        return b.full(max(n - correction, 0), acc)
    return b.emit("maximum", b.full(n - correction, acc), b.full(0, acc))


def _var_mean(b, x, dims, correction, keepdim):
    """(var, mean) in the accumulation dtype, two-pass (mean first) for accuracy."""
    acc = compute_dtype(x.type.dtype)
    xf = b.cast(x, acc)
    n = _count(x, dims)
    mean = b.emit("div", b.emit("sum", xf, dims=dims, keepdim=True), b.full(n, acc))
    d = b.emit("sub", xf, mean)
    ss = b.emit("sum", b.emit("mul", d, d), dims=dims, keepdim=keepdim)
    var = b.emit("div", ss, _count_less(b, n, correction, acc))
    if not keepdim:
        mean = b.reshape(mean, var.type.shape)
    return var, mean


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased in (None, True) else 0


@lowering(aten.var.correction, aten.var.dim, aten.var.default)
def _var(b, x, dims=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dims, bool):
        dims, unbiased = None, dims
    var, _ = _var_mean(b, x, norm_dims(dims, x.type.ndim), _correction(correction, unbiased), keepdim)
    return b.cast(var, b.out_dtype)


@lowering(aten.var_mean.correction, aten.var_mean.dim, aten.var_mean.default)
def _lower_var_mean(b, x, dims=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dims, bool):
        dims, unbiased = None, dims
    var, mean = _var_mean(b, x, norm_dims(dims, x.type.ndim), _correction(correction, unbiased), keepdim)
    return b.cast(var, x.type.dtype), b.cast(mean, x.type.dtype)


@lowering(aten.std.correction, aten.std.dim, aten.std.default)
def _std(b, x, dims=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dims, bool):
        dims, unbiased = None, dims
    var, _ = _var_mean(b, x, norm_dims(dims, x.type.ndim), _correction(correction, unbiased), keepdim)
    return b.cast(b.emit("sqrt", var), b.out_dtype)


@lowering(aten._softmax, aten._log_softmax, aten.softmax.int, aten.log_softmax.int)
def _softmax(b, x, dim, half_to_float=False, dtype=None):
    log = "log_softmax" in b.target_name
    dim = norm_dim(dim, x.type.ndim)
    acc = compute_dtype(b.out_dtype if x.type.dtype not in ("f16", "bf16") else x.type.dtype)
    xf = b.cast(x, acc)
    if x.type.ndim == 0:
        return b.cast(b.full(0.0 if log else 1.0, acc), b.out_dtype)
    m = b.emit("amax", xf, dims=(dim,), keepdim=True)
    # a row of all -inf has max -inf and x - max = nan; eager's softmax gives nan there too
    shifted = b.emit("sub", xf, m)
    e = b.emit("exp", shifted)
    s = b.emit("sum", e, dims=(dim,), keepdim=True)
    out = b.emit("sub", shifted, b.emit("log", s)) if log else b.emit("div", e, s)
    return b.cast(out, b.out_dtype)


def _affine(b, y, weight, bias, shape):
    """y * weight + bias, with weight/bias reshaped to broadcast as `shape`."""
    if weight is not None:
        y = b.emit("mul", y, b.reshape(b.cast(weight, y.type.dtype), shape))
    if bias is not None:
        y = b.emit("add", y, b.reshape(b.cast(bias, y.type.dtype), shape))
    return y


def _normalize(b, x, dims, eps):
    """(x - mean) * rstd over `dims` in f32 for low precision; returns (y, mean, rstd) keepdim."""
    acc = compute_dtype(x.type.dtype)
    var, mean = _var_mean(b, x, dims, 0, True)
    rstd = b.emit("rsqrt", b.emit("add", var, b.full(eps, acc)))
    y = b.emit("mul", b.emit("sub", b.cast(x, acc), mean), rstd)
    return y, mean, rstd


@lowering(aten.native_layer_norm)
def _layer_norm(b, x, normalized_shape, weight, bias, eps):
    k = len(normalized_shape)
    nd = x.type.ndim
    dims = tuple(range(nd - k, nd))
    y, mean, rstd = _normalize(b, x, dims, eps)
    out = _affine(b, y, weight, bias, (1,) * (nd - k) + tuple(normalized_shape))
    stat_dt = b.val[1].dtype
    return (b.cast(out, x.type.dtype), b.cast(mean, dtype_name(stat_dt)), b.cast(rstd, dtype_name(stat_dt)))


@lowering(aten.native_layer_norm_backward.default)
def _layer_norm_backward(b, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """(d input, d weight, d bias), each None where output_mask says so, as torch's decomposition
    computes them (in f32 for low precision): with x_hat = (x - mean) * rstd and g = grad * weight,
    d input = rstd / N * (N * g - sum(g) - x_hat * sum(g * x_hat)) over the normalized dims."""
    nd, k = x.type.ndim, len(normalized_shape)
    inner, outer = tuple(range(nd - k, nd)), tuple(range(nd - k))
    acc = compute_dtype(x.type.dtype)
    n = _count(x, inner)
    want = [bool(m) for m in output_mask]
    if not want[0] and not (want[1] and weight is not None) and not (want[2] and bias is not None):
        return None, None, None
    if known(_count(x, outer), "==", 0) or known(n, "==", 0):
        return tuple(None if v is None else b.full(0, dtype_name(v.dtype), tuple(dim(s) for s in v.shape))
                     for v in b.val)
    stat_shape = x.type.shape[:nd - k] + (1,) * k
    g, xf = b.cast(grad, acc), b.cast(x, acc)
    rstd = b.reshape(b.cast(rstd, acc), stat_shape)
    x_hat = b.emit("mul", b.emit("sub", xf, b.reshape(b.cast(mean, acc), stat_shape)), rstd)
    d_input = d_weight = d_bias = None
    if want[0]:
        gw = _affine(b, g, weight, None, (1,) * (nd - k) + x.type.shape[nd - k:])
        count = b.full(n, acc)
        s1 = b.emit("sum", gw, dims=inner, keepdim=True)
        s2 = b.emit("sum", b.emit("mul", gw, x_hat), dims=inner, keepdim=True)
        inner_sum = b.emit("sub", b.emit("sub", b.emit("mul", gw, count), s1), b.emit("mul", x_hat, s2))
        d_input = b.cast(b.emit("mul", b.emit("div", rstd, count), inner_sum), x.type.dtype)
    if want[1] and weight is not None:
        prod = b.emit("mul", g, x_hat)
        d_weight = b.cast(b.emit("sum", prod, dims=outer, keepdim=False) if outer else prod, weight.type.dtype)
    if want[2] and bias is not None:
        d_bias = b.cast(b.emit("sum", g, dims=outer, keepdim=False) if outer else g, bias.type.dtype)
    return d_input, d_weight, d_bias


@lowering(aten.native_group_norm)
def _group_norm(b, x, weight, bias, N, C, HxW, group, eps):
    grouped = b.reshape(x, (N, group, (C // group) * HxW))
    y, mean, rstd = _normalize(b, grouped, (2,), eps)
    y = b.reshape(y, x.type.shape)
    out = _affine(b, y, weight, bias, (1, C) + (1,) * (x.type.ndim - 2))
    stat = dtype_name(b.val[1].dtype)
    return (b.cast(out, x.type.dtype), b.cast(b.reshape(mean, (N, group)), stat),
            b.cast(b.reshape(rstd, (N, group)), stat))


def _bn_shape(x):
    return (1, x.type.shape[1]) + (1,) * (x.type.ndim - 2)


@lowering(aten._native_batch_norm_legit_functional.default, aten.native_batch_norm.default,
          aten._native_batch_norm_legit.default, aten._native_batch_norm_legit.no_stats)
def _batch_norm_train(b, x, weight, bias, running_mean, running_var, training=None, momentum=None, eps=None):
    if b.target_name.endswith("no_stats"):  # (x, w, b, training, momentum, eps)
        training, momentum, eps, running_mean, running_var = running_mean, running_var, training, None, None
    if not training:
        return _batch_norm_eval(b, x, weight, bias, running_mean, running_var, momentum, eps)
    if x.type.ndim < 2:
        raise Unsupported("batch_norm of fewer than 2 dims")
    dims = (0,) + tuple(range(2, x.type.ndim))
    y, mean, rstd = _normalize(b, x, dims, eps)
    shape = _bn_shape(x)
    out = b.cast(_affine(b, y, weight, bias, shape), x.type.dtype)
    C = x.type.shape[1]
    stat = dtype_name(b.val[1].dtype)
    results = [out, b.cast(b.reshape(mean, (C,)), stat), b.cast(b.reshape(rstd, (C,)), stat)]
    if running_mean is not None and "functional" in b.target_name:
        n = math.prod(x.type.shape[d] for d in dims)
        acc = mean.type.dtype
        # eager refuses one value per channel in training, so over a symbolic n (never 1) correction is 1
        var_unbiased, _ = _var_mean(b, x, dims, 1 if is_sym(n) or n > 1 else 0, False)
        for run, new in ((running_mean, b.reshape(mean, (C,))), (running_var, var_unbiased)):
            keep = b.emit("mul", b.cast(run, acc), b.full(1 - momentum, acc))
            results.append(b.cast(b.emit("add", keep, b.emit("mul", new, b.full(momentum, acc))), run.type.dtype))
    elif running_mean is not None:
        raise Unsupported("batch_norm updating running stats in place")
    return tuple(results)


@lowering(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(b, x, weight, bias, running_mean, running_var, momentum, eps):
    acc = compute_dtype(x.type.dtype)
    empty = b.full(0, dtype_name(b.val[1].dtype), (0,))
    folded = fold_batch_norm(b, x, running_mean, running_var, eps, weight, bias)
    if folded is not None:
        return folded, empty, empty
    shape = _bn_shape(x)
    mean = b.reshape(b.cast(running_mean, acc), shape)
    rstd = b.emit("rsqrt", b.emit("add", b.reshape(b.cast(running_var, acc), shape), b.full(eps, acc)))
    y = b.emit("mul", b.emit("sub", b.cast(x, acc), mean), rstd)
    out = b.cast(_affine(b, y, weight, bias, shape), x.type.dtype)
    return out, empty, empty


@lowering(aten.logsumexp)
def _logsumexp(b, x, dims, keepdim=False):
    dims = norm_dims(dims, x.type.ndim)
    acc = compute_dtype(b.out_dtype)
    xf = b.cast(x, acc)
    m = b.emit("amax", xf, dims=dims, keepdim=True)
    # keep rows of all -inf (or +inf) finite in the shift: exp(x - 0) then log gives the right inf
    finite_m = b.emit("where", b.emit("isinf", m), b.full(0.0, acc), m)
    s = b.emit("sum", b.emit("exp", b.emit("sub", xf, finite_m)), dims=dims, keepdim=keepdim)
    m_out = finite_m if keepdim else b.reshape(finite_m, s.type.shape)
    return b.cast(b.emit("add", b.emit("log", s), m_out), b.out_dtype)


@lowering(aten.linalg_vector_norm)
def _vector_norm(b, x, ord=2, dims=None, keepdim=False, *, dtype=None):
    dims = norm_dims(dims, x.type.ndim)
    acc = compute_dtype(b.out_dtype)
    a = b.emit("abs", b.cast(x, acc))
    if ord == float("inf") or ord == float("-inf"):
        return b.cast(b.emit("amax" if ord > 0 else "amin", a, dims=dims, keepdim=keepdim), b.out_dtype)
    if ord == 0:
        nonzero = b.cast(b.emit("ne", a, b.full(0, acc)), acc)
        return b.cast(b.emit("sum", nonzero, dims=dims, keepdim=keepdim), b.out_dtype)
    if ord == 1:
        return b.cast(b.emit("sum", a, dims=dims, keepdim=keepdim), b.out_dtype)
    if ord == 2:
        return b.cast(b.emit("sqrt", b.emit("sum", b.emit("mul", a, a), dims=dims, keepdim=keepdim)), b.out_dtype)
    s = b.emit("sum", b.emit("pow", a, b.full(ord, acc)), dims=dims, keepdim=keepdim)
    return b.cast(b.emit("pow", s, b.full(1.0 / ord, acc)), b.out_dtype)
