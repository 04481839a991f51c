"""Golden IR: small real models captured through Dynamo + AOTAutograd and lowered by the front end,
printed, and compared with the files in golden/. Each file must also parse back to the same text,
verify, and (for forward graphs) interpret to eager's results.

Refresh after an intended front-end change, then review the diff:
    MINICOMP_UPDATE_GOLDEN=1 python -m pytest tests/ir/test_golden.py
"""
from __future__ import annotations

import os
import pathlib
import types

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func

from minicomp.compiler.decompositions import aot_backend
from minicomp.compiler.frontend import lower
from minicomp.compiler.output_layout import laid_out
from minicomp.ir import interpret, parse, verify

GOLDEN = pathlib.Path(__file__).parent / "golden"
UPDATE = os.environ.get("MINICOMP_UPDATE_GOLDEN") == "1"


def capture(fn, *inputs) -> dict:
    """kind ('forward' | 'backward' | 'inference') -> the lowered ir.Graph, named by its kind so the
    text does not depend on how many graphs this process compiled before."""
    graphs = {}

    def compiler(kind):
        def run(gm, example_inputs):
            graphs[kind] = lower(gm, kind, layout_outputs=laid_out(kind, gm))[0]  # as capture.py lowers
            return make_boxed_func(gm.forward)
        return run
    backend = aot_backend(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),  # as capture.py
                          inference_compiler=compiler("inference"))
    # a fresh code object: Dynamo's cache from an earlier capture of `fn` must not swallow this one
    fresh = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    out = torch.compile(fresh, backend=backend, dynamic=False)(*inputs)
    if "forward" in graphs:
        sum(o.sum() for o in pytree_tensors(out)).backward()
    return graphs


def pytree_tensors(out):
    return [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]


# ---- the models: each covers a few IR features ---------------------------------------------------

def mlp(x, w1, b1, w2, b2):  # mm, permute, broadcast add, gelu's string attr; backward: None outputs
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def causal_softmax(x):  # bmm, iota, bool full, -inf, where, amax/sum, cast with a dtype attr
    t = x.shape[1]
    s = x @ x.transpose(1, 2) / 2.0
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    return F.softmax(s, -1).to(torch.float16)


def topk_nan(x):  # an extern with a tuple result and getitems; nan, inf and a huge float in attrs
    v, i = torch.topk(x, 2, dim=-1)
    return v * 2, i, torch.nan_to_num(x / 0, nan=float("nan"), posinf=1.0)


def reductions(x, w, b):  # mean/var via sums, rsqrt, 1e-05, amax, argmax, integer result
    y = F.layer_norm(x, (8,), w, b)
    return y.mean(0), x.amax(-1, keepdim=True), x.argmax(0)


def views(x, idx):  # slice, permute, expand, reshape, cat, index_select
    a = x[:, 1:3].t()
    e = x[:1].expand(4, 6)
    return torch.cat([a.reshape(-1), e.reshape(-1)]), x.index_select(1, idx)


def _mlp_inputs():
    p = lambda *s: torch.randn(*s, requires_grad=True)  # noqa: E731
    return torch.randn(3, 8), p(16, 8), p(16), p(4, 16), p(4)


CASES = {
    "mlp": (mlp, _mlp_inputs),
    "causal_softmax": (causal_softmax, lambda: (torch.randn(2, 4, 8),)),
    "topk_nan": (topk_nan, lambda: (torch.randn(3, 5),)),
    "reductions": (reductions, lambda: (torch.randn(3, 8), torch.randn(8), torch.randn(8))),
    "views": (views, lambda: (torch.randn(4, 6), torch.tensor([5, 0, 2]))),
}


@pytest.fixture(scope="module")
def captured():
    """Capture every case once per module: Dynamo compiles cost ~0.3 s each."""
    out = {}
    for name, (fn, make_inputs) in CASES.items():
        torch.manual_seed(0)
        inputs = make_inputs()
        out[name] = (fn, inputs, capture(fn, *inputs))
    return out


GOLDEN_FILES = ["mlp_forward", "mlp_backward", "causal_softmax_inference", "topk_nan_inference",
                "reductions_inference", "views_inference"]


@pytest.mark.parametrize("golden", GOLDEN_FILES)
def test_captured_ir_matches_golden(captured, golden):
    case, kind = golden.rsplit("_", 1)
    text = str(captured[case][2][kind])
    path = GOLDEN / f"{golden}.ir"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path.name} missing; run with MINICOMP_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), (f"IR of {golden} changed; if intended, refresh with "
                                      "MINICOMP_UPDATE_GOLDEN=1 and review the diff")


def test_capture_is_stable_across_runs(captured):
    fn, inputs, first = captured["causal_softmax"]
    again = capture(fn, *inputs)
    assert str(again["inference"]) == str(first["inference"])


def test_golden_set_is_complete():
    assert sorted(p.stem for p in GOLDEN.glob("*.ir")) == sorted(GOLDEN_FILES)


@pytest.mark.parametrize("golden", GOLDEN_FILES)
def test_golden_round_trips(golden):
    text = (GOLDEN / f"{golden}.ir").read_text()
    graph = verify(parse(text))
    assert str(graph) == text


def test_golden_files_cover_the_features():
    text = "".join(p.read_text() for p in GOLDEN.glob("*.ir"))
    for feature in ("= extern ", "= getitem ", "= iota ", "= full ", "= cast ", "[dtype=f16]", "value=-inf",
                    "value=nan", "return None,", "= amax ", "= sum ", "= argmax ", "= slice ", "= permute ",
                    "= expand ", "= reshape ", "= cat ", "= index_select ", "b8[", "i64["):
        assert feature in text, f"no golden file contains {feature!r}"


@pytest.mark.parametrize("case", ["mlp", "causal_softmax", "topk_nan", "reductions", "views"])
def test_parsed_golden_interprets_like_eager(captured, case):
    fn, inputs, graphs = captured[case]
    kind = "forward" if "forward" in graphs else "inference"
    graph = parse((GOLDEN / f"{case}_{kind}.ir").read_text())
    want = fn(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    got = interpret(graph, *[x.detach() for x in inputs])[:len(want)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.detach(), equal_nan=True)
