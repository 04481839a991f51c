"""PyTorch's own OpInfo samples for the common deep-learning ops, through the front end and the passes.

Dynamo costs ~0.5 s a graph, so each sample is traced straight to a functional core-ATen fx graph with
make_fx (fake tensors set node.meta['val'], as AOTAutograd's do), compiled by `compile_fx_graph` with the
interpret backend, and compared with eager. Every sample lands in one bucket:
  pass         outputs match eager (dtype, shape, values)
  mismatch     ran, but the values differ: a lowering bug
  bug          a lowering failed or disagreed with torch's types (the front end warned and ran it as extern)
  unsupported  a clean MinicompError before anything ran (e.g. a data-dependent shape)
  crash        any other exception
  skip         eager itself raises, the sample returns non-tensors, or make_fx cannot trace it: not counted
Externs are fine: they run the ATen op itself. `python -m tests.e2e.test_opinfo` prints the per-op table.
"""
from __future__ import annotations

import collections
import logging
import time
import warnings

import pytest
import torch
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp.compiler.capture import compile_fx_graph
from minicomp.errors import MinicompError
from minicomp.options import Options
from minicomp.report import Report

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db
from torch.testing._internal.opinfo.core import SampleInput  # noqa: E402  (after the skip check)

OP_NAMES = """
abs neg exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal square sin cos tan tanh sigmoid erf erfc
erfinv asin acos atan sinh cosh asinh acosh atanh floor ceil round round.decimals_3 round.decimals_neg_3 trunc
frac sign sgn nan_to_num
add sub rsub mul div.no_rounding_mode div.trunc_rounding div.floor_rounding true_divide floor_divide pow
maximum minimum fmax fmin remainder fmod atan2 lerp addcmul addcdiv logaddexp xlogy hypot
eq ne lt le gt ge logical_not logical_and logical_or logical_xor isnan isinf isfinite where clamp clamp_min
clamp_max masked_fill
sum mean amax amin prod var std var_mean std_mean argmax argmin max.reduction_no_dim max.reduction_with_dim
max.binary min.reduction_no_dim min.reduction_with_dim min.binary logsumexp any all linalg.vector_norm nansum
cumsum softmax log_softmax nn.functional.softmin
view reshape reshape_as view_as permute transpose t expand expand_as broadcast_to squeeze squeeze.multiple
unsqueeze flatten unflatten movedim narrow select slice cat stack hstack split split_with_sizes chunk
unbind flip roll repeat tile diagonal tril triu clone contiguous
index_select gather take_along_dim __getitem__ scatter slice_scatter select_scatter
nn.functional.gelu nn.functional.silu nn.functional.relu nn.functional.relu6 nn.functional.leaky_relu
nn.functional.hardtanh nn.functional.elu nn.functional.selu nn.functional.celu nn.functional.softplus
nn.functional.mish nn.functional.hardsigmoid nn.functional.hardswish nn.functional.logsigmoid
nn.functional.threshold nn.functional.softsign nn.functional.tanhshrink nn.functional.glu
nn.functional.layer_norm nn.functional.group_norm nn.functional.batch_norm nn.functional.rms_norm
nn.functional.normalize nn.functional.embedding nn.functional.linear nn.functional.conv2d
nn.functional.max_pool2d nn.functional.avg_pool2d nn.functional.adaptive_avg_pool2d
nn.functional.mse_loss nn.functional.l1_loss nn.functional.smooth_l1_loss nn.functional.huber_loss
nn.functional.cross_entropy nn.functional.nll_loss nn.functional.binary_cross_entropy_with_logits
nn.functional.pad.constant nn.functional.pad.reflect nn.functional.pad.replicate
nn.functional.interpolate.nearest nn.functional.one_hot nn.functional.cosine_similarity
matmul mm bmm addmm baddbmm addmv mv outer einsum
arange full zeros ones full_like zeros_like ones_like new_full new_zeros new_ones scalar_tensor
""".split()
MAX_SAMPLES = 6      # per op: enough to cover its overloads and broadcasting cases, bounded runtime
MAX_EXTREMAL = 2     # per op, from its reference inputs: samples with NaN / Inf values
RTOL, ATOL = 1e-4, 1e-5
BUCKETS = ("pass", "mismatch", "bug", "unsupported", "crash")

_DECOMP = dict(core_aten_decompositions())  # a plain dict: the lazy table makes tracing ~3x slower


def selected_ops(names=OP_NAMES):
    by_name = {(o.name + ("." + o.variant_test_name if o.variant_test_name else "")): o for o in op_db}
    missing = [n for n in names if n not in by_name]
    assert not missing, f"OpInfo names not in this torch's op_db: {missing}"
    return [(n, by_name[n]) for n in names]


def _nonfinite(sample) -> bool:
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    return any(isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() <= 4096
               and not torch.isfinite(x).all() for x in leaves)


def samples_of(info, max_samples=MAX_SAMPLES, max_extremal=MAX_EXTREMAL):
    """The op's first float32 CPU samples, plus a few of its reference inputs holding NaN or Inf
    (straight from the sample functions: OpInfo's tracking wrapper inspects the call stack per call,
    which costs more than the compile)."""
    torch.manual_seed(0)
    samples = info.sample_inputs_func(info, "cpu", torch.float32, False)
    picked = [s for _, s in zip(range(max_samples), samples)]
    if info.reference_inputs_func is not None and max_extremal:
        refs = info.reference_inputs_func(info, "cpu", torch.float32, False)
        picked += [s for _, s in zip(range(max_extremal), filter(_nonfinite, refs))]
    return picked


def _as_flat_fn(op, sample):
    """(fn(*tensors) -> list of output tensors, tensors): the sample's non-tensor arguments baked in."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def fn(*tensors):
        filled = list(leaves)
        for i, t in zip(slots, tensors):
            filled[i] = t
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        return pytree.tree_leaves(op(inp, *args, **kwargs))
    return fn, [leaves[i] for i in slots]


def _clone(tensors):
    return [t.detach().clone() for t in tensors]


def trace(fn, tensors, decompositions=_DECOMP):
    """A functional core-ATen graph, as AOTAutograd gives us. Decompositions may emit in-place ops
    (`add_`) below make_fx's functionalization, so a graph holding any is traced once more through it."""
    gm = make_fx(fn, decomposition_table=decompositions, tracing_mode="fake")(*tensors)
    if any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in gm.graph.nodes):
        gm = make_fx(functionalize(gm), tracing_mode="fake")(*tensors)
    return gm


class _InternalWarnings(logging.Handler):
    """Collects the front end's 'internal:' warnings: a lowering that failed or disagreed with torch's types."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        if "internal:" in record.getMessage():
            self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("minicomp").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("minicomp").removeHandler(self)


def run_sample(op, sample, strict=False, decompositions=_DECOMP):
    """-> (bucket, detail, extern targets)."""
    fn, tensors = _as_flat_fn(op, sample)
    try:
        with warnings.catch_warnings():  # deprecation notes some samples trigger in eager
            warnings.simplefilter("ignore")
            expected = fn(*_clone(tensors))
    except Exception:
        return "skip", "eager raises", []
    if not expected or not all(isinstance(e, torch.Tensor) for e in expected):
        return "skip", "non-tensor output", []
    try:
        gm = trace(fn, _clone(tensors), decompositions)
    except Exception as e:  # a data-dependent op: Dynamo would break the graph before it
        return "skip", f"untraceable: {type(e).__name__}", []
    report = Report()
    try:
        with _InternalWarnings() as internal:
            run = compile_fx_graph(gm, tensors, Options.make("interpret", strict=strict), report, "inference")
    except MinicompError as e:
        return "unsupported", str(e).splitlines()[0], []
    except Exception as e:
        return "crash", f"compile: {type(e).__name__}: {e}", []
    externs = [e for g in report.graphs for e in g.externs]
    if internal.messages:
        return "bug", internal.messages[0], externs
    try:
        actual = run(_clone(tensors))
    except Exception as e:
        return "crash", f"run: {type(e).__name__}: {e}", externs
    try:
        assert len(actual) == len(expected), f"{len(actual)} outputs, eager has {len(expected)}"
        for a, e in zip(actual, expected):
            assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
            torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL, equal_nan=True)
    except AssertionError as e:
        return "mismatch", str(e).strip().splitlines()[0], externs
    return "pass", "", externs


class OpResult:
    def __init__(self):
        self.counts = collections.Counter()
        self.externs: set = set()
        self.problems: list = []     # (bucket, detail) of the samples that did not pass


def sweep(ops=None, max_samples=MAX_SAMPLES, max_extremal=MAX_EXTREMAL) -> dict:
    """{op name: OpResult} over the selected ops' samples."""
    results = {}
    for name, info in ops or selected_ops():
        r = results[name] = OpResult()
        for sample in samples_of(info, max_samples, max_extremal):
            bucket, detail, externs = run_sample(info.op, sample)
            r.counts[bucket] += 1
            r.externs.update(externs)
            if bucket not in ("pass", "skip"):
                r.problems.append((bucket, detail))
    return results


def totals(results) -> collections.Counter:
    total = collections.Counter()
    for r in results.values():
        total.update(r.counts)
    return total


def format_table(results) -> str:
    cols = BUCKETS + ("skip",)
    lines = [f"{'op':36}" + "".join(f"{c:>12}" for c in cols) + "  externs"]
    for name, r in results.items():
        if r.problems or r.externs:
            counts = "".join(f"{r.counts[c]:>12}" for c in cols)
            lines.append(f"{name:36}{counts}  {' '.join(sorted(r.externs))}")
    total = totals(results)
    ran = sum(total[b] for b in BUCKETS)
    lines.append(f"total over {len(results)} ops: {total['pass']}/{ran} samples pass "
                 f"({total['pass'] / max(ran, 1):.1%}), " + ", ".join(f"{total[c]} {c}" for c in cols[1:]))
    lines += [f"  {name}: {bucket}: {detail[:150]}"
              for name, r in results.items() for bucket, detail in r.problems]
    return "\n".join(lines)


def test_opinfo_sweep():
    t0 = time.perf_counter()
    results = sweep()
    table = format_table(results)
    print(f"\n{table}\nOpInfo sweep in {time.perf_counter() - t0:.1f} s")
    total = totals(results)
    assert len(results) >= 60
    assert total["crash"] == 0 and total["bug"] == 0 and total["mismatch"] == 0, table
    assert total["pass"] >= 0.9 * sum(total[b] for b in BUCKETS), table


@pytest.mark.parametrize("name", ["add", "softmax", "nn.functional.layer_norm", "sum", "permute", "where",
                                  "nn.functional.cross_entropy", "__getitem__"])
def test_strict_mode_lowers_common_ops(name):
    (_, info), = selected_ops([name])
    for sample in samples_of(info, 3, 0):
        bucket, detail, externs = run_sample(info.op, sample, strict=True)
        assert bucket in ("pass", "skip"), detail
        assert externs == []


_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_KEEP_FLASH = {op: fn for op, fn in _DECOMP.items() if op is not _FLASH.default}


def _flash_backward(q, k, v, grad, is_causal, scale):
    out, lse = _FLASH(q, k, v, is_causal=is_causal, scale=scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, is_causal, scale=scale)


def test_attention_lowers_flash_forward_and_backward():
    """sdpa's CPU flash op and its backward kept whole (as capture should: ATen's decomposition of the
    forward is inference-only) lower to matmuls and a softmax, with no extern."""
    (_, info), = selected_ops(["nn.functional.scaled_dot_product_attention"])
    cases = [(info.op, s) for s in info.sample_inputs_func(info, "cpu", torch.float32, False)
             if not s.kwargs.get("dropout_p")]
    q, k, v, grad = (torch.randn(2, 3, 5, 8) for _ in range(4))
    cases += [(_flash_backward, SampleInput(q, args=(k, v, grad, causal, scale)))
              for causal in (False, True) for scale in (None, 0.3)]
    for op, sample in cases:
        bucket, detail, externs = run_sample(op, sample, decompositions=_KEEP_FLASH)
        assert bucket in ("pass", "skip") and externs == [], (bucket, detail, externs)


if __name__ == "__main__":
    t0 = time.perf_counter()
    print(format_table(sweep()))
    print(f"{time.perf_counter() - t0:.1f} s")
