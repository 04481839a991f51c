"""Rematerialization after the first choice: once a value is recomputed in the kernels that read it,
they read what it is computed from, and a value only its own kernel read before may be worth
recomputing too (passes/rematerialize.py ROUNDS)."""
from minicomp.compiler.passes import rematerialize
from tests.passes.test_fuse import agree, compile_text, kernels

# a layer_norm's backward: dx in a row kernel, the weight gradient sum(g * x_hat) down the columns
LN_BACKWARD = """graph ln_bw(%x: f32[64,32], %mean: f32[64,1], %rstd: f32[64,1], %g: f32[64,32], %w: f32[32]) -> (f32[64,32], f32[32]) {
  %0: f32[64,32] = sub %x %mean
  %1: f32[64,32] = mul %0 %rstd
  %2: f32[64,32] = mul %g %w
  %3: f32[64,32] = mul %2 %1
  %4: f32[64,1] = sum %3 [dims=(1,), keepdim=true]
  %5: f32[64,32] = mul %1 %4
  %6: f32[64,32] = sub %2 %5
  %7: f32[64,32] = mul %6 %rstd
  %8: f32[64,32] = mul %g %1
  %9: f32[32] = sum %8 [dims=(0,), keepdim=false]
  return %7, %9
}
"""


def _written(fused) -> list:
    return [b.name for n in kernels(fused) for i, b in enumerate(n.meta["kernel"].buffers)
            if i in n.meta["kernel"].writes]


def test_a_value_under_a_recomputed_one_is_recomputed_in_the_next_round():
    """x_hat = (x - mean) * rstd is read by the row kernel and the column kernel: recomputed in the
    column kernel, which then reads x - mean; x - mean is recomputed there too in the next round, so
    the row kernel writes dx alone and the column kernel reads x and mean."""
    fused, ctx = compile_text(LN_BACKWARD)
    agree(LN_BACKWARD, fused)
    assert len(kernels(fused)) == 2
    assert sorted(_written(fused)) == ["mul", "sum"], _written(fused)  # dx and the weight gradient
    assert {n.op for n in ctx.fusion.recomputed} == {"sub", "mul"}
    column, = [k.meta["kernel"] for k in kernels(fused) if k.type[0].shape == (32,)]
    assert {b.name for b in column.buffers} == {"x", "mean", "rstd", "g", "sum"}


def test_one_round_stores_the_value_under_the_recomputed_one(monkeypatch):
    """With one schedule after the first choice (the rule before the rounds), x - mean is written by
    the row kernel for the column kernel to read: the round is what recomputes it."""
    monkeypatch.setattr(rematerialize, "ROUNDS", 1)
    fused, _ = compile_text(LN_BACKWARD)
    agree(LN_BACKWARD, fused)
    assert "sub" in _written(fused)


def test_without_remat_nothing_is_recomputed():
    """remat=False: x_hat is written once by the row kernel and read by the column kernel."""
    fused, ctx = compile_text(LN_BACKWARD, remat=False)
    agree(LN_BACKWARD, fused)
    assert not ctx.fusion.recomputed and sorted(_written(fused)) == ["mul", "mul", "sum"]
