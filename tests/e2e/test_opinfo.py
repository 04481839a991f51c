"""PyTorch's own OpInfo samples for the common deep-learning ops, through the front end and the passes,
and through `minicomp.compile` on the backends users run.

The reference sweep traces each sample straight to a functional core-ATen fx graph with make_fx (fake
tensors set node.meta['val'], as AOTAutograd's do; no Dynamo, a few ms a sample), compiles it by
`compile_fx_graph` with the interpret backend, and compares with eager. The backend sweeps run every
sample through the public API -- minicomp.compile(fn, backend=...) -- on `cpu` and on `cuda_emu` (the
CUDA backend's source, emulated), Dynamo and AOTAutograd included; the cuda_emu one also hands every
kernel it generated to NVRTC for sm_80 and sm_90 and checks each fits its block (launch_check.py).
Every sample lands in one bucket:
  pass         outputs match eager (dtype, shape, values)
  mismatch     ran, but the values differ: a lowering bug
  bug          a lowering failed or disagreed with torch's types (the front end warned and ran it as extern)
  unsupported  a clean MinicompError before anything ran (e.g. a data-dependent shape), or (public
               API) a graph that ran in torch, which matches eager because it is eager
  crash        any other exception
  skip         eager itself raises, the sample returns non-tensors, or make_fx cannot trace it: not counted
Externs are fine: they run the ATen op itself. `python -m tests.e2e.test_opinfo [BACKEND] [--public]`
prints the per-op table.

Match rates over the 1134 samples (float32, 210 ops; the rest: 3 `narrow` samples with a data-dependent
length, unsupported): before the CUDA generator took reductions without a loop and empty tensors,
cpu 99.7% and cuda_emu 88.9% (120 crashes, 3 mismatches); now both 99.7% (1131/1134), either path.
"""
from __future__ import annotations

import collections
import logging
import os
import shutil
import time
import warnings

import pytest
import torch
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

import minicomp
from minicomp.compiler.capture import compile_fx_graph
from minicomp.errors import MinicompError
from minicomp.options import Options
from minicomp.report import Report
from tests.codegen import launch_check

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


class _Slot:
    """Where the k-th input tensor goes in a sample's arguments."""

    def __init__(self, k):
        self.k = k


def _fill(template, tensors):
    """template with each _Slot replaced by its tensor, through lists, tuples and dicts only: Dynamo
    traces this in a few steps, where pytree.tree_unflatten cost it a quarter of the public sweeps."""
    if isinstance(template, _Slot):
        return tensors[template.k]
    if type(template) in (list, tuple):
        return type(template)(_fill(x, tensors) for x in template)
    if type(template) is dict:
        return {k: _fill(v, tensors) for k, v in template.items()}
    return template


def _as_flat_fn(op, sample):
    """(fn(*tensors) -> list of output tensors, the same fn returning the op's result as it is (the
    public sweeps flatten it outside Dynamo), tensors): the sample's non-tensor arguments baked in."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    template = pytree.tree_unflatten([_Slot(slots.index(i)) if i in slots else x for i, x in enumerate(leaves)], spec)

    if not any(isinstance(x, _Slot) for x in pytree.tree_leaves(_fill(template, [object()] * len(slots)))):
        def fn(*tensors):
            inp, args, kwargs = _fill(template, tensors)
            return op(inp, *args, **kwargs)
    else:  # a tensor inside another kind of container, which _fill does not enter
        def fn(*tensors):
            filled = list(leaves)
            for i, t in zip(slots, tensors):
                filled[i] = t
            inp, args, kwargs = pytree.tree_unflatten(filled, spec)
            return op(inp, *args, **kwargs)
    return (lambda *tensors: pytree.tree_leaves(fn(*tensors))), fn, [leaves[i] for i in slots]


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
        log = logging.getLogger("minicomp")
        self.level = log.level
        log.setLevel(min(log.getEffectiveLevel(), logging.WARNING))  # another test may have quieted it
        log.addHandler(self)
        return self

    def __exit__(self, *exc):
        log = logging.getLogger("minicomp")
        log.removeHandler(self)
        log.setLevel(self.level)


def run_sample(op, sample, strict=False, decompositions=_DECOMP, backend="interpret", public=False):
    """-> (bucket, detail, extern targets). `public`: through `minicomp.compile` (Dynamo, AOTAutograd,
    the graph cache: what a user runs), else make_fx straight into `compile_fx_graph`."""
    fn, unflat, tensors = _as_flat_fn(op, sample)
    try:
        with warnings.catch_warnings():  # deprecation notes some samples trigger in eager
            warnings.simplefilter("ignore")
            expected = fn(*_clone(tensors))
    except Exception:
        return "skip", "eager raises", []
    if not expected or not all(isinstance(e, torch.Tensor) for e in expected):
        return "skip", "non-tensor output", []
    if public:
        bucket, detail, actual, externs = _run_public(unflat, tensors, backend, strict)  # outputs flattened outside
    else:
        bucket, detail, actual, externs = _run_fx(fn, tensors, backend, strict, decompositions)
    if bucket is not None:
        return bucket, detail, externs
    try:
        assert len(actual) == len(expected), f"{len(actual)} outputs, eager has {len(expected)}"
        for a, e in zip(actual, expected):
            assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
            torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL, equal_nan=True)
    except AssertionError as e:
        return "mismatch", str(e).strip().splitlines()[0], externs
    return "pass", "", externs


def _run_fx(fn, tensors, backend, strict, decompositions):
    """-> (bucket or None when it ran, detail, outputs, externs)."""
    try:
        gm = trace(fn, _clone(tensors), decompositions)
    except Exception as e:  # a data-dependent op: Dynamo would break the graph before it
        return "skip", f"untraceable: {type(e).__name__}", None, []
    report = Report()
    try:
        with _InternalWarnings() as internal:
            run = compile_fx_graph(gm, tensors, Options.make(backend, strict=strict), report, "inference")
    except MinicompError as e:
        return "unsupported", str(e).splitlines()[0], None, []
    except Exception as e:
        return "crash", f"compile: {type(e).__name__}: {e}", None, []
    externs = [e for g in report.graphs for e in g.externs]
    if internal.messages:
        return "bug", internal.messages[0], None, externs
    try:
        return None, "", run(_clone(tensors)), externs
    except Exception as e:
        return "crash", f"run: {type(e).__name__}: {e}", None, externs


def _run_public(fn, tensors, backend, strict):
    """minicomp.compile(fn) called once. Whatever ran eagerly (a graph break, a graph minicomp
    refused) is 'unsupported': it matches eager because it is eager."""
    compiled = minicomp.compile(fn, backend=backend, strict=strict)
    try:
        with _InternalWarnings() as internal, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = compiled(*_clone(tensors))
    except Exception as e:
        inner = getattr(e, "inner_exception", None) or e  # Dynamo wraps a backend's exception
        if isinstance(inner, MinicompError):
            return "unsupported", str(inner).splitlines()[0], None, []
        return "crash", f"{type(inner).__name__}: {inner}".splitlines()[0], None, []
    report = compiled.report()
    externs = [e for g in report.graphs for e in g.externs]
    if internal.messages:
        return "bug", internal.messages[0], None, externs
    if report.eager:
        return "unsupported", report.eager[0].splitlines()[0], None, externs
    return None, "", pytree.tree_leaves(actual), externs


class OpResult:
    def __init__(self):
        self.counts = collections.Counter()
        self.externs: set = set()
        self.problems: list = []     # (bucket, detail) of the samples that did not pass


def sweep(ops=None, max_samples=MAX_SAMPLES, max_extremal=MAX_EXTREMAL, backend="interpret", public=False) -> dict:
    """{op name: OpResult} over the selected ops' samples."""
    results = {}
    for name, info in ops or selected_ops():
        r = results[name] = OpResult()
        for sample in samples_of(info, max_samples, max_extremal):
            bucket, detail, externs = run_sample(info.op, sample, backend=backend, public=public)
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


_BACKEND_SWEEPS: dict = {}


def backend_sweep(backend):
    """(results, kernels generated) of the whole sweep through minicomp.compile on `backend`, once
    per session (the cuda_emu sweep feeds two tests)."""
    if backend not in _BACKEND_SWEEPS:
        t0 = time.perf_counter()
        with launch_check.recording() as kernels:
            results = sweep(backend=backend, public=True)
        _BACKEND_SWEEPS[backend] = results, kernels, time.perf_counter() - t0
    return _BACKEND_SWEEPS[backend]


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_opinfo_sweep_through_compile(backend):
    """Every sample through the public API on a real backend: none crashes or mismatches, and both
    backends pass what the reference sweep passes (cuda_emu was at 88.9%: 0-d reductions raised a
    bare KeyError in the CUDA generator, empty tensors divided by zero there, layer_norm over size-1
    dims stored nothing)."""
    if backend == "cuda_emu" and shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("cuda_emu needs a host C++20 compiler (g++)")
    results, _, seconds = backend_sweep(backend)
    table = format_table(results)
    print(f"\n{backend}: {table}\nOpInfo sweep through minicomp.compile on {backend} in {seconds:.1f} s")
    total = totals(results)
    ran = sum(total[b] for b in BUCKETS)
    assert total["crash"] == 0 and total["bug"] == 0 and total["mismatch"] == 0, table
    assert ran >= 1000 and total["pass"] >= ran - 3, table  # the 3 are narrow's data-dependent lengths


def test_opinfo_kernels_fit_on_sm80_and_sm90():
    """Every distinct kernel the cuda_emu sweep generated compiles with NVRTC to CUBIN for sm_80 and
    sm_90, and its planned block fits (registers x threads, threads, static shared memory)."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs the [cuda] extras (cuda-bindings)")
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("the sweep's kernels come from cuda_emu, which needs a host C++20 compiler (g++)")
    _, kernels, _ = backend_sweep("cuda_emu")
    distinct = launch_check.distinct(kernels, "op")
    assert len(distinct) >= 300
    found = launch_check.compile_and_check(distinct)
    assert all(len(found[arch]) == len(distinct) for arch in launch_check.ARCHS)


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
    import sys
    t0 = time.perf_counter()
    print(format_table(sweep(backend=sys.argv[1] if len(sys.argv) > 1 else "interpret", public="--public" in sys.argv)))
    print(f"{time.perf_counter() - t0:.1f} s")
