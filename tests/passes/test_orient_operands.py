"""orient_operands: a matmul operand's transpose moved outside the reshape a kernel writes."""
import torch

from minicomp.compiler.capture import make_context
from minicomp.compiler.passes import orient_operands
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import interpret, parse
from minicomp.ir.kernel import walk
from minicomp.options import Options
from tests.passes.check import random_inputs

# attention's scores q @ k^T, q and k heads of one projection [B*T, 2*H*hs] (B=2, T=8, H=2, hs=16)
SCORES = """graph scores(%qk: f32[16,64]) -> (f32[4,8,8]) {
  %0: f32[2,8,64] = reshape %qk [shape=(2, 8, 64)]
  %1: f32[2,8,32] = slice %0 [dim=2, start=0, end=32, step=1]
  %2: f32[2,8,2,16] = reshape %1 [shape=(2, 8, 2, 16)]
  %3: f32[2,2,8,16] = permute %2 [dims=(0, 2, 1, 3)]
  %4: f32[4,8,16] = reshape %3 [shape=(4, 8, 16)]
  %5: f32[2,8,32] = slice %0 [dim=2, start=32, end=64, step=1]
  %6: f32[2,8,2,16] = reshape %5 [shape=(2, 8, 2, 16)]
  %7: f32[2,2,16,8] = permute %6 [dims=(0, 2, 3, 1)]
  %8: f32[4,16,8] = reshape %7 [shape=(4, 16, 8)]
  %9: f32[4,8,8] = bmm %4 %8
  return %9
}
"""


def _ctx():
    return make_context(Options(backend="cpu", verify=True), "t", "cpu")


def test_k_transposed_becomes_a_transposed_view_of_a_reshape_read_along_rows():
    g = orient_operands.run(parse(SCORES), _ctx())
    (bmm,) = [n for n in g.nodes if n.op == "bmm"]
    q, kt = bmm.args
    assert q.op == "reshape"  # q's own order already reads along its rows: left alone
    assert kt.op == "permute" and kt.attrs["dims"] == (0, 2, 1) and kt.type == parse(SCORES).nodes[8].type
    r = kt.args[0]
    assert r.op == "reshape" and r.type.shape == (4, 8, 16)
    assert r.args[0].op == "permute" and r.args[0].attrs["dims"] == (0, 2, 1, 3)
    assert not any(n.op == "permute" and n.attrs["dims"] == (0, 2, 3, 1) for n in g.nodes)  # dead, removed
    x = random_inputs(parse(SCORES))
    torch.testing.assert_close(interpret(g, *x)[0], interpret(parse(SCORES), *x)[0])


def test_the_fused_kernels_read_and_write_along_the_innermost_loop():
    fused = run_passes(parse(SCORES), _ctx())
    x = random_inputs(parse(SCORES))
    torch.testing.assert_close(interpret(fused, *x)[0], interpret(parse(SCORES), *x)[0], rtol=1e-5, atol=1e-5)
    ks = [n.meta["kernel"] for n in fused.nodes if n.op == "kernel"]
    assert len(ks) == 1  # q and k heads in one copy kernel
    k = ks[0]
    inner = (k.outer + k.inner)[-1].name
    stores = k.outer_stores + k.inner_stores
    for index in [st.index for st in stores] + [e.attrs["index"] for e in walk([st.value for st in stores])
                                                 if e.op == "load"]:
        assert {getattr(a, "name", None): c for a, c in index.terms}.get(inner) == 1, index


def test_an_operand_torch_views_as_it_is_is_left_alone():
    """[2,2,16,8] transposed in its last two dims, then batched: a view torch makes without a copy
    (the batch dims stay contiguous), which bmm reads transposed as it is."""
    text = """graph plain(%a: f32[4,16,8], %b: f32[2,2,16,8]) -> (f32[4,16,16]) {
  %0: f32[2,2,8,16] = permute %b [dims=(0, 1, 3, 2)]
  %1: f32[4,8,16] = reshape %0 [shape=(4, 8, 16)]
  %2: f32[4,16,16] = bmm %a %1
  return %2
}
"""
    assert str(orient_operands.run(parse(text), _ctx())) == str(parse(text))
    fused = run_passes(parse(text), _ctx())
    assert not [n for n in fused.nodes if n.op == "kernel"]  # bmm reads the view: no copy kernel
