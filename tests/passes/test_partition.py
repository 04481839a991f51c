"""The training partitioner (compiler/passes/partition.py) on small joint graphs written as IR text:
the saved set it picks, what it never recomputes, the recompute bound, remat_budget, and the forward
and backward graphs it splits the joint graph into, run through `interpret` against the joint."""
from __future__ import annotations

import pytest
import torch

from minicomp.codegen.llvm_ops import SUPPORTED_OPS
from minicomp.errors import MinicompError
from minicomp.ir import interpret, parse, verify
from minicomp.compiler.passes import partition
from tests.passes.check import ir, random_inputs

# y = mm(gelu(mm(x, w1)), w2); the backward needs gelu(h) for w2's gradient and gelu'(h) for h's
MLP = ir("""
    graph joint(%primals_1: f32[4,8], %primals_2: f32[8,16], %primals_3: f32[16,8], %tangents_1: f32[4,8]) -> (f32[4,8], f32[4,8], f32[8,16], f32[16,8]) {
      %0: f32[4,16] = mm %primals_1 %primals_2
      %1: f32[4,16] = gelu %0 [approximate="none"]
      %2: f32[4,8] = mm %1 %primals_3
      %3: f32[8,16] = permute %primals_3 [dims=(1, 0)]
      %4: f32[4,16] = mm %tangents_1 %3
      %5: f32[16,4] = permute %1 [dims=(1, 0)]
      %6: f32[16,8] = mm %5 %tangents_1
      %7: f32[4,16] = sigmoid %0
      %8: f32[4,16] = mul %4 %7
      %9: f32[8,4] = permute %primals_1 [dims=(1, 0)]
      %10: f32[8,16] = mm %9 %8
      %11: f32[16,8] = permute %primals_2 [dims=(1, 0)]
      %12: f32[4,8] = mm %8 %11
      return %2, %12, %10, %6
    }
""")


def _graph(text):
    return verify(parse(text))


def _names(graph, values):
    """Values as the printer numbers them (%0, ...), inputs by name."""
    number = {n: f"%{i}" for i, n in enumerate(graph.nodes)}
    return [f"%{v.name}" if v.op == "input" else number[v] for v in values]


def _check_split(graph, n_fwd, result, seeds=(0, 1)):
    """forward(primals) then backward(saved, tangents) give the joint graph's outputs exactly."""
    fw, bw = partition.split(graph, n_fwd, result.saved, result.in_backward, SUPPORTED_OPS)
    verify(fw)
    verify(bw)
    assert len(fw.outputs) == n_fwd + len(result.saved)
    assert [x.name for x in bw.inputs[len(result.saved):]] == [x.name for x in graph.inputs if x.name.startswith("tangents")]
    for seed in seeds:
        inputs = random_inputs(graph, seed)
        primals = [x for x, n in zip(inputs, graph.inputs) if not n.name.startswith("tangents")]
        tangents = [x for x, n in zip(inputs, graph.inputs) if n.name.startswith("tangents")]
        want = interpret(graph, *inputs)
        fw_out = interpret(fw, *primals)
        got = fw_out[:n_fwd] + interpret(bw, *fw_out[n_fwd:], *tangents)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    return fw, bw


def test_mlp_saves_the_matmul_and_recomputes_gelu():
    g = _graph(MLP)
    result = partition.cut(g, 1, SUPPORTED_OPS)
    assert _names(g, result.saved) == ["%primals_1", "%primals_2", "%primals_3", "%0"]
    assert [n.op for n in result.recomputed] == ["gelu"]
    assert [n.op for n in result.moved if n.op != "permute"] == ["sigmoid"]  # only the backward uses it
    assert result.saved_bytes == 4 * 16 * 4  # inputs are free; h is 4x16 floats
    fw, bw = _check_split(g, 1, result)
    assert [o.op for o in fw.outputs] == ["mm", "input", "input", "input", "mm"]  # y, then the saved values
    assert "gelu" in [n.op for n in fw.nodes] and "gelu" in [n.op for n in bw.nodes]  # computed in both


def test_remat_false_saves_every_forward_value_the_backward_uses():
    g = _graph(MLP)
    result = partition.cut(g, 1, SUPPORTED_OPS, remat=False)
    assert _names(g, result.saved) == ["%primals_1", "%primals_2", "%primals_3", "%0", "%1"]
    assert result.recomputed == [] and result.saved_bytes == 2 * 4 * 16 * 4
    _check_split(g, 1, result)


def test_recomputed_gelu_fuses_into_the_backward_kernel_after_the_matmul():
    """gelu(h) is a matmul operand in the backward: its recomputation is stored by the kernel that
    computes dh, placed after the matmul that kernel needs (its first user comes after that)."""
    from minicomp.compiler.passes.fuse import conservative_schedule
    from minicomp.compiler.schedule import KernelStep
    g = _graph(MLP)
    result = partition.cut(g, 1, SUPPORTED_OPS)
    _, bw = partition.split(g, 1, result.saved, result.in_backward, SUPPORTED_OPS)
    sch, _ = conservative_schedule(bw, SUPPORTED_OPS)
    kernels = [sorted(r.op for r in s.roots) for s in sch.steps if isinstance(s, KernelStep)]
    assert ["gelu", "mul"] in kernels


BANNED = ir("""
    graph joint(%primals_1: f32[4,8], %primals_2: f32[8,8], %tangents_1: f32[4,8]) -> (f32[4,8], f32[4,8]) {
      %0: f32[4,8] = mm %primals_1 %primals_2
      %1: f32[4,8] = extern %0 [args=($0,), target="aten.relu.default"]
      %2: f32[4,1] = sum %1 [dims=(1,), keepdim=true]
      %3: f32[4,8] = sub %1 %2
      %4: f32[4,8] = exp %3
      %5: f32[4,8] = mul %tangents_1 %4
      %6: f32[4,8] = mul %5 %0
      %7: f32[4,8] = mul %6 %1
      return %4, %7
    }
""")


def test_matmul_extern_and_reduction_results_are_saved_never_recomputed():
    g = _graph(BANNED)
    result = partition.cut(g, 1, SUPPORTED_OPS)
    mm, ext, red = g.nodes[0], g.nodes[1], g.nodes[2]
    assert mm in result.saved and mm not in result.recomputed
    assert ext not in result.recomputed and red not in result.recomputed
    assert "compute-bound" in result.banned[mm] and "extern" in result.banned[ext] and "reduction" in result.banned[red]
    # the backward needs mm and the extern result; exp(x - sum) costs less to recompute from the
    # extern result and the (small) row sums than to save, though the forward computes it anyway
    assert set(result.saved) == {mm, ext, red}
    assert [n.op for n in result.recomputed] == ["sub", "exp"]
    assert result.saved_bytes == (32 + 32 + 4) * 4
    _check_split(g, 1, result)


def _chain(n_ops: int) -> str:
    body = "\n".join(f"      %{i}: f32[64] = sin %{'primals_1' if i == 0 else i - 1}" for i in range(n_ops))
    last = n_ops - 1
    return ir(f"""
        graph joint(%primals_1: f32[64], %tangents_1: f32[64]) -> (f32[64], f32[64]) {{
    {body}
          %{n_ops}: f32[64] = mul %tangents_1 %{last}
          return %{last}, %{n_ops}
        }}
    """)


def test_a_chain_longer_than_the_bound_is_not_recomputed_whole():
    ops = int(partition.MAX_RECOMPUTE_COST // 8) * 3 + 2  # sin costs 8: three bounds' worth and more
    g = _graph(_chain(ops))
    result = partition.cut(g, 1, SUPPORTED_OPS)
    assert len(result.recomputed) <= partition.MAX_RECOMPUTE_COST // 8
    assert any(n.op == "sin" for n in result.saved)  # a checkpoint inside the chain
    assert any("recompute chain" in why for why in result.banned.values())
    _check_split(g, 1, result)
    short = partition.cut(_graph(_chain(3)), 1, SUPPORTED_OPS)  # within the bound: only the input is saved
    assert [n.op for n in short.saved] == ["input"] and len(short.recomputed) == 3


def test_remat_budget_relaxes_the_bound_to_fit():
    ops = int(partition.MAX_RECOMPUTE_COST // 8) + 2
    g = _graph(_chain(ops))
    base = partition.cut(g, 1, SUPPORTED_OPS, remat=False)
    assert base.saved_bytes == 64 * 4
    default = partition.cut(g, 1, SUPPORTED_OPS)
    assert default.saved_bytes == 64 * 4  # one checkpoint: as much as saving the end
    tight = partition.cut(g, 1, SUPPORTED_OPS, budget=0.5)
    assert tight.saved_bytes == 0 and tight.level == "longer chains"
    _check_split(g, 1, tight)


def test_remat_budget_that_cannot_be_met_says_why():
    g = _graph(MLP)
    with pytest.raises(MinicompError) as e:
        partition.cut(g, 1, SUPPORTED_OPS, budget=0.1)
    msg = str(e.value)
    assert "remat_budget=0.1" in msg and "remat=False saves" in msg and "mm" in msg and "compute-bound" in msg
    assert "graph input" not in msg  # a saved input costs nothing: never a reason the budget cannot be met
    with pytest.raises(ValueError, match="remat_budget"):
        partition.cut(g, 1, SUPPORTED_OPS, budget=1.5)


def test_must_save_and_must_recompute_marks_are_honoured():
    g = _graph(MLP)
    gelu = g.nodes[1]
    kept = partition.cut(g, 1, SUPPORTED_OPS, must_save=lambda n: n is gelu)
    assert gelu in kept.saved and kept.banned[gelu] == "marked must-save"
    _check_split(g, 1, kept)


def test_a_value_with_no_kernel_on_the_backend_is_saved():
    g = _graph(MLP)
    result = partition.cut(g, 1, SUPPORTED_OPS - {"gelu"})
    assert g.nodes[1] in result.saved and "no kernel" in result.banned[g.nodes[1]]


# y = mm(silu(g) * u, wd) with g = mm(x, wg), u = mm(x, wu); AOTAutograd's order: the weight
# gradient mm(p^T, dy) comes before dp and silu's backward (simplified here to dg = dp * u * sig)
SWIGLU = ir("""
    graph joint(%primals_1: f32[4,8], %primals_2: f32[8,16], %primals_3: f32[8,16], %primals_4: f32[16,8], %tangents_1: f32[4,8]) -> (f32[4,8], f32[4,8], f32[8,16], f32[8,16], f32[16,8]) {
      %0: f32[4,16] = mm %primals_1 %primals_2
      %1: f32[4,16] = sigmoid %0
      %2: f32[4,16] = mul %0 %1
      %3: f32[4,16] = mm %primals_1 %primals_3
      %4: f32[4,16] = mul %2 %3
      %5: f32[4,8] = mm %4 %primals_4
      %6: f32[16,4] = permute %4 [dims=(1, 0)]
      %7: f32[16,8] = mm %6 %tangents_1
      %8: f32[8,16] = permute %primals_4 [dims=(1, 0)]
      %9: f32[4,16] = mm %tangents_1 %8
      %10: f32[4,16] = mul %9 %3
      %11: f32[4,16] = mul %9 %2
      %12: f32[4,16] = mul %10 %1
      %13: f32[8,4] = permute %primals_1 [dims=(1, 0)]
      %14: f32[8,16] = mm %13 %11
      %15: f32[8,16] = mm %13 %12
      %16: f32[16,8] = permute %primals_3 [dims=(1, 0)]
      %17: f32[4,8] = mm %11 %16
      %18: f32[16,8] = permute %primals_2 [dims=(1, 0)]
      %19: f32[4,8] = mm %12 %18
      %20: f32[4,8] = add %17 %19
      return %5, %20, %15, %14, %7
    }
""")


def test_a_product_only_weight_gradients_read_is_recomputed_in_the_kernel_of_its_backward():
    """p = silu(g) * u feeds only the weight gradient in the backward, a matmul traced before the
    kernel that reads g and u: the matmul waits for that kernel, which stores p as well."""
    from minicomp.compiler.passes.fuse import conservative_schedule
    from minicomp.compiler.schedule import KernelStep
    g = _graph(SWIGLU)
    result = partition.cut(g, 1, SUPPORTED_OPS)
    assert _names(g, result.saved) == ["%primals_1", "%primals_2", "%primals_3", "%primals_4", "%0", "%3"]
    assert {n.op for n in result.recomputed if n.op != "permute"} == {"sigmoid", "mul"}
    _, bw = _check_split(g, 1, result)
    sch, _ = conservative_schedule(bw, SUPPORTED_OPS)
    kernels = [sorted(r.op for r in s.roots) for s in sch.steps if isinstance(s, KernelStep)]
    assert kernels == [["mul", "mul", "mul"], ["add"]]  # p, du and dg in one kernel; dx = dx_u + dx_g
