"""Fusion around torch ops: a matmul operand torch would copy to view is written by a kernel in the
order the matmul reads it, and a column sum of a value stored anyway (a bias gradient) runs in
torch unless a kernel sums that value down the same columns already."""
from minicomp.ir.kernel import walk
from tests.passes.test_fuse import agree, compile_text, kernels


ATTENTION_HEADS = """graph heads(%x: f32[8,16], %w: f32[16,24], %b: f32[24]) -> (f32[8,4,1]) {
  %0: f32[8,24] = mm %x %w
  %1: f32[8,24] = add %0 %b
  %2: f32[8,16] = slice %1 [dim=1, start=0, end=16, step=1]
  %3: f32[2,4,4,4] = reshape %2 [shape=(2, 4, 4, 4)]
  %4: f32[2,4,4,4] = permute %3 [dims=(0, 2, 1, 3)]
  %5: f32[8,4,4] = reshape %4 [shape=(8, 4, 4)]
  %6: f32[8,4] = slice %1 [dim=1, start=16, end=20, step=1]
  %7: f32[8,4,1] = reshape %6 [shape=(8, 4, 1)]
  %8: f32[8,4,1] = bmm %5 %7
  return %8
}
"""


def test_an_operand_torch_would_copy_to_view_is_written_by_a_kernel():
    """bmm's first operand is a reshape of transposed heads: torch would copy it in a reshape. A
    kernel writes it instead, reading the bias-added matmul result through the views as index math.
    The second operand is a plain view of the bias-added result: a torch view of its buffer."""
    fused, ctx = compile_text(ATTENTION_HEADS)
    agree(ATTENTION_HEADS, fused)
    (bmm,) = [n for n in fused.nodes if n.op == "bmm"]
    first, second = bmm.args
    assert first.op == "getitem" and first.args[0].op == "kernel"  # written by a kernel, no torch reshape
    assert second.op == "reshape" and second.args[0].op == "slice"  # torch views of a stored buffer
    why = {n.op: reason for n, reason in ctx.fusion.schedule.why_materialized.items()}
    assert why == {"reshape": "operand of bmm (runs in torch) (a torch view would copy)",
                   "add": "operand of bmm (runs in torch)"}
    assert [n.op for n in fused.nodes].count("reshape") == 1


# attention's backward: bmm(q^T, g) and bmm(g, k) with q and k heads of one projection [B*T, 2*H*hs]
HEADS_TRANSPOSED = """graph heads_t(%qk: f32[16,64], %g1: f32[4,8,8], %g2: f32[4,8,8]) -> (f32[4,16,8], f32[4,8,16]) {
  %0: f32[2,8,64] = reshape %qk [shape=(2, 8, 64)]
  %1: f32[2,8,32] = slice %0 [dim=2, start=0, end=32, step=1]
  %2: f32[2,8,2,16] = reshape %1 [shape=(2, 8, 2, 16)]
  %3: f32[2,2,8,16] = permute %2 [dims=(0, 2, 1, 3)]
  %4: f32[4,8,16] = reshape %3 [shape=(4, 8, 16)]
  %5: f32[4,16,8] = permute %4 [dims=(0, 2, 1)]
  %6: f32[4,16,8] = bmm %5 %g1
  %7: f32[2,8,32] = slice %0 [dim=2, start=32, end=64, step=1]
  %8: f32[2,8,2,16] = reshape %7 [shape=(2, 8, 2, 16)]
  %9: f32[2,2,16,8] = permute %8 [dims=(0, 2, 3, 1)]
  %10: f32[4,16,8] = reshape %9 [shape=(4, 16, 8)]
  %11: f32[4,8,16] = permute %10 [dims=(0, 2, 1)]
  %12: f32[4,8,16] = bmm %g2 %11
  return %6, %12
}
"""


def test_a_transposed_matmul_operand_is_written_in_the_order_it_is_read():
    """q^T = permute(reshape(heads of q)) would be a transposed write (each element a gather across
    rows); the kernel writes the reshape instead, reading q along its rows, and bmm reads a
    transposed view of it. k's operand, whose transposed form reads along the rows, stays as it is."""
    fused, ctx = compile_text(HEADS_TRANSPOSED)
    agree(HEADS_TRANSPOSED, fused)
    first, second = [n for n in fused.nodes if n.op == "bmm"]
    q_t, k_op = first.args[0], second.args[1]
    assert q_t.op == "permute" and q_t.attrs["dims"] == (0, 2, 1) and q_t.args[0].op == "getitem"
    assert k_op.op == "getitem" and k_op.args[0].op == "kernel"  # written as the operand it is
    for kn in kernels(fused):  # every load and store runs along the innermost loop
        k = kn.meta["kernel"]
        inner = (k.outer + k.inner)[-1].name
        stores = k.outer_stores + k.inner_stores
        loads = [x.attrs["index"] for x in walk([st.value for st in stores]) if x.op == "load"]
        for index in [st.index for st in stores] + loads:
            assert {getattr(a, "name", None): c for a, c in index.terms}.get(inner) == 1, index
    why = {n.op: r for n, r in ctx.fusion.schedule.why_materialized.items()}
    assert "written untransposed, read transposed" in why["reshape"]


BIAS_GRAD = """graph bias_grad(%g: f32[64,32], %w: f32[32,16], %y: f32[64,32]) -> (f32[64,16], f32[1,32], f32[1,32]) {
  %0: f32[64,32] = mul %g %y
  %1: f32[64,16] = mm %0 %w
  %2: f32[1,32] = sum %0 [dims=(0,), keepdim=true]
  %3: f32[64,32] = exp %g
  %4: f32[1,32] = sum %3 [dims=(0,), keepdim=true]
  return %1, %2, %4
}
"""


def test_a_column_sum_of_a_stored_value_runs_in_torch():
    """%0 is stored anyway (mm reads it): its column sum (a bias gradient) is torch's, whose reduction
    reads whole rows; exp(g) is stored nowhere, so its column sum stays a kernel that computes it."""
    fused, _ = compile_text(BIAS_GRAD)
    agree(BIAS_GRAD, fused)
    sums = [n for n in fused.nodes if n.op == "sum"]
    assert len(sums) == 1 and sums[0].args[0].op == "getitem"  # the torch sum reads %0's buffer
    assert any("exp sum" in k.attrs["fused"] for k in kernels(fused))


LN_GRADS = """graph f(%dy: f32[64,32], %xhat: f32[64,32], %w: f32[32,16]) -> (f32[64,16], f32[32], f32[32]) {
  %0: f32[64,16] = mm %dy %w
  %1: f32[64,32] = mul %dy %xhat
  %2: f32[32] = sum %1 [dims=(0,), keepdim=false]
  %3: f32[32] = sum %dy [dims=(0,), keepdim=false]
  return %0, %2, %3
}
"""


def test_a_column_sum_of_a_stored_value_joins_a_kernel_summing_it_down_the_same_columns():
    """A layer_norm's bias gradient sum(dy) beside its weight gradient sum(dy * x_hat): dy is stored
    anyway (an input, a matmul's operand), but a kernel reads it down those columns already, so the
    bias gradient is one more accumulator there, not a torch call."""
    fused, _ = compile_text(LN_GRADS)
    agree(LN_GRADS, fused)
    assert not [n for n in fused.nodes if n.op == "sum"]  # no torch sum
    k, = kernels(fused)
    assert k.meta["kernel"].ops.count("sum") == 2


# MultiheadAttention's in-projection weight gradient: the matmul reads a transpose of %3, a reshape
# of permuted heads that torch would copy, so the kernel writes that transpose itself and %3 has no
# buffer of its own; %3's column sum (the bias gradient) must then stay a kernel too
COPIED_VIEW_SUM = """graph f(%h: f32[2,5,3,16], %x: f32[15,16]) -> (f32[32,16], f32[1,32]) {
  %0: f32[2,5,3,16] = exp %h
  %1: f32[2,5,3,1,16] = reshape %0 [shape=(2, 5, 3, 1, 16)]
  %2: f32[1,5,3,2,16] = permute %1 [dims=(3, 1, 2, 0, 4)]
  %3: f32[15,32] = reshape %2 [shape=(15, 32)]
  %4: f32[32,15] = permute %3 [dims=(1, 0)]
  %5: f32[32,16] = mm %4 %x
  %6: f32[1,32] = sum %3 [dims=(0,), keepdim=true]
  return %5, %6
}
"""


def test_a_column_sum_of_a_value_torch_reads_only_through_a_copying_view_is_a_kernel():
    """%3 is 'stored anyway' by the walk up a torch operand's views, but the operand's view would
    copy, so a kernel stores the operand, not %3: a torch sum of %3 would read a value no step makes
    (it crashed the build of nn.MultiheadAttention(need_weights=True)'s backward)."""
    fused, _ = compile_text(COPIED_VIEW_SUM)
    agree(COPIED_VIEW_SUM, fused)
    assert not [n for n in fused.nodes if n.op == "sum"]  # no torch sum of a value with no buffer
    assert any("sum" in k.attrs["fused"] for k in kernels(fused))
