"""The verifier rejects malformed graphs with a message that quotes the offending line."""
from __future__ import annotations

import textwrap

import pytest
import torch

from minicomp.ir import Node, TensorType, VerifyError, interpret, parse, verify


def graph(body: str, inputs="%x: f32[4], %y: f32[4]", outs="f32[4]"):
    body = textwrap.indent(textwrap.dedent(body).strip(), "  ")
    return parse(f"graph g({inputs}) -> ({outs}) {{\n{body}\n}}\n")


def rejects(g, *fragments):
    with pytest.raises(VerifyError) as e:
        verify(g)
    for f in fragments:
        assert f in str(e.value), f"{f!r} not in {str(e.value)!r}"
    return str(e.value)


def test_well_formed_graph_passes():
    g = graph("""
        %0: f32[4] = add %x %y
        %1: f32[1] = sum %0 [dims=(0,), keepdim=true]
        %2: f32[4] = expand %1 [shape=(4,)]
        return %2
    """)
    assert verify(g) is g


def test_use_before_def():
    g = graph("""
        %0: f32[4] = exp %x
        %1: f32[4] = neg %0
        return %1
    """)
    g.nodes.reverse()  # the parser refuses this order, a buggy pass might not
    rejects(g, "line 2:", "`%0: f32[4] = neg %1`", "operand %1 is used before it is defined")


def test_unknown_op():
    rejects(graph("""
        %0: f32[4] = frobnicate %x
        return %0
    """), "line 2:", "`%0: f32[4] = frobnicate %x`", "unknown op 'frobnicate'")


def test_wrong_arity():
    rejects(graph("""
        %0: f32[4] = add %x
        return %0
    """), "`%0: f32[4] = add %x`", "add takes 2 operand(s), got 1")


def test_missing_attribute():
    rejects(graph("""
        %0: f32[1] = sum %x [keepdim=true]
        %1: f32[4] = expand %0 [shape=(4,)]
        return %1
    """), "line 2:", "`%0: f32[1] = sum %x [keepdim=true]`", "missing attribute(s) dims")


def test_wrong_result_type():
    rejects(graph("""
        %0: f32[4] = sum %x [dims=(0,), keepdim=false]
        return %0
    """), "`%0: f32[4] = sum %x [dims=(0,), keepdim=false]`", "type should be f32[]")


def test_dtype_mismatch_without_cast():
    rejects(graph("""
        %0: f32[4] = mul %x %y
        return %0
    """, inputs="%x: f32[4], %y: f16[4]"), "`%0: f32[4] = mul %x %y`", "dtypes f32 and f16; insert a cast")


def test_shapes_that_do_not_broadcast():
    rejects(graph("""
        %0: f32[4] = add %x %y
        return %0
    """, inputs="%x: f32[4], %y: f32[3]"), "`%0: f32[4] = add %x %y`", "do not broadcast")


def test_bad_getitem_index():
    rejects(graph("""
        %0: (f32[4], i64[4]) = extern %x [args=($0, 0), target="aten.sort.default"]
        %1: f32[4] = getitem %0 [index=2]
        return %1
    """), "line 3:", "`%1: f32[4] = getitem %0 [index=2]`", "index 2 out of range for (f32[4], i64[4])")


def test_getitem_with_the_wrong_type():
    rejects(graph("""
        %0: (f32[4], i64[4]) = extern %x [args=($0, 0), target="aten.sort.default"]
        %1: f32[4] = getitem %0 [index=1]
        return %1
    """), "`%1: f32[4] = getitem %0 [index=1]`", "type should be i64[4]")


def test_getitem_of_a_single_tensor():
    rejects(graph("""
        %0: f32[4] = getitem %x [index=0]
        return %0
    """), "`%0: f32[4] = getitem %x [index=0]`", "getitem of f32[4], which is not a multi-result value")


def test_getitem_of_a_missing_result():
    rejects(graph("""
        %0: (f32[4], None) = extern %x [args=($0,), target="aten.sort.default"]
        %1: f32[4] = getitem %0 [index=1]
        return %1
    """), "element 1 of (f32[4], None), which holds no tensor")


def test_tuple_operand_needs_getitem():
    rejects(graph("""
        %0: (f32[4], i64[4]) = extern %x [args=($0, 0), target="aten.sort.default"]
        %1: f32[4] = neg %0
        return %1
    """), "`%1: f32[4] = neg %0`", "operand %0 has type (f32[4], i64[4]); pick an element with getitem")


def test_extern_slot_out_of_range():
    rejects(graph("""
        %0: f32[4] = extern %x [args=($0, $1), target="aten.add.Tensor"]
        return %0
    """), "`%0: f32[4] = extern %x [args=($0, $1), target=\"aten.add.Tensor\"]`",
        "argument slots [0, 1] do not match its 1 operand(s)")


def test_extern_unknown_operator_argument():
    rejects(graph("""
        %0: f32[4] = extern %x [args=($0, op("aten.no_such_op.default")), target="higher_order.with_effects"]
        return %0
    """), "unknown target 'aten.no_such_op.default'")


def test_extern_unknown_target():
    rejects(graph("""
        %0: f32[4] = extern %x [args=($0,), target="aten.no_such_op.default"]
        return %0
    """), "unknown target 'aten.no_such_op.default'")


def test_undefined_output():
    g = graph("""
        %0: f32[4] = neg %x
        return %0
    """)
    g.outputs = [Node("neg", (g.inputs[0],), type=TensorType((4,), "f32"))]
    rejects(g, "`return`", "is not defined in the graph")


def test_node_listed_twice():
    g = graph("""
        %0: f32[4] = neg %x
        return %0
    """)
    g.nodes.append(g.nodes[0])
    rejects(g, "node appears twice")


def test_bad_input():
    g = graph("""
        return %x
    """)
    g.inputs[0].type = TensorType((4,), "q8")
    rejects(g, "input %x must be an 'input' node with a tensor type")


def test_interpret_a_parsed_graph_matches_torch():
    g = verify(graph("""
        %0: f32[4] = mul %x %y
        %1: f32[1] = amax %0 [dims=(0,), keepdim=true]
        %2: f32[4] = sub %0 %1
        %3: f32[4] = exp %2
        %4: f32[] = sum %3 [dims=(0,), keepdim=false]
        %5: f32[4] = div %3 %4
        %6: b8[4] = gt %5 %y
        %7: f32[] = full [dtype=f32, shape=(), value=-inf]
        %8: f32[4] = where %6 %7 %5
        return %8
    """))
    x, y = torch.randn(4), torch.rand(4) * 0.3
    p = torch.softmax(x * y, 0)
    torch.testing.assert_close(interpret(g, x, y)[0], torch.where(p > y, float("-inf"), p))


def test_a_symbolic_size_is_refused_only_when_surely_negative():
    """T - 1 (x[:, 1:] over a symbolic T, decided under the guard 1 <= T, which the ranges do not
    hold) verifies; a size no T makes non-negative does not."""
    ok = parse(textwrap.dedent("""\
        graph g(%x: f32[4,s0]) -> (f32[4,s0-1]) {
          sizes s0 in 0.. hint 6
          %0: f32[4,s0-1] = slice %x [dim=1, start=1, end=size("s0"), step=1]
          %1: f32[4,s0-1] = mul %0 %0
          return %1
        }
        """))
    verify(ok)
    bad = parse(textwrap.dedent("""\
        graph g(%x: f32[4,s0]) -> (f32[4,-s0-1]) {
          sizes s0 in 0.. hint 6
          %0: f32[4,-s0-1] = reshape %x [shape=(4, size("-s0-1"))]
          return %0
        }
        """))
    with pytest.raises(VerifyError):
        verify(bad)


@pytest.mark.parametrize("line, message", [
    ("%0: f32[1] = sum %x [dims=(0,), keepdim=tue]", 'attribute keepdim="tue" is not true or false'),
    ("%0: f32[1] = sum %x [dims=0, keepdim=true]", "attribute dims=0 is not a tuple of dims"),
    ("%0: f32[4] = cast %x [dtype=f31]", 'attribute dtype="f31" is not a dtype'),
    ("%0: f32[4] = gelu %x [approximate=\"fast\"]", "attribute approximate=\"fast\" is not \"none\" or \"tanh\""),
    ("%0: f32[4] = full [dtype=f32, shape=(4,), value=s0]", 'attribute value="s0" is not a number, size or bool'),
    ("%0: f32[2] = slice %x [dim=0, start=0, end=2.5, step=1]", "attribute end=2.5 is not a size"),
])
def test_attribute_of_the_wrong_kind(line, message):
    """A word where a value belongs reads as a string (`keepdim=tue` as "tue"): the verifier names
    it, before the op's type rule or torch meets it."""
    body = line + "\n" + "return %0"
    outs = line.split(": ", 1)[1].split(" = ")[0]
    rejects(graph(body, inputs="%x: f32[4]", outs=outs), message)


def test_conv_attributes_in_range():
    inputs = "%x: f32[1,1,5,5], %w: f32[1,1,3,3]"
    conv = "%0: f32[1,1,3,3] = conv %x %w [dilation=(1, 1), groups=1, output_padding=({op}), padding=(0, 0), " \
           "stride=(1, 1), transposed=false]\nreturn %0"
    verify(graph(conv.format(op="0, 0"), inputs=inputs, outs="f32[1,1,3,3]"))
    rejects(graph(conv.format(op="-1, 0"), inputs=inputs, outs="f32[1,1,3,3]"), "attribute output_padding=(-1, 0)")


def test_extern_result_type_against_its_target():
    """An extern's declared type is what torch's op gives for its operands' types (run on meta
    tensors): a pass that grew an operand and not its extern would have torch write past the result."""
    verify(graph("""
        %0: f32[4] = extern %x [args=($0, 0), target="aten.cumsum.default"]
        return %0
    """, inputs="%x: f32[4]"))
    rejects(graph("""
        %0: f32[5] = extern %x [args=($0, 0), target="aten.cumsum.default"]
        return %0
    """, inputs="%x: f32[4]", outs="f32[5]"), "its result is typed f32[5], but aten.cumsum.default gives f32[4]")
    rejects(graph("""
        %0: (f32[4], i32[4]) = extern %x [args=($0,), target="aten.sort.default"]
        %1: f32[4] = getitem %0 [index=0]
        return %1
    """, inputs="%x: f32[4]"), "result 1 is typed i32[4], but aten.sort.default gives i64[4]")
    # a target that needs its operand's values (nonzero's count) cannot run on meta: not judged
    verify(graph("""
        %0: i64[3,1] = extern %x [args=($0,), target="aten.nonzero.default"]
        return %0
    """, inputs="%x: f32[4]", outs="i64[3,1]"))


def test_extern_target_must_be_an_operator():
    rejects(graph("""
        %0: f32[4] = extern %x [args=($0,), target="aten"]
        return %0
    """, inputs="%x: f32[4]"), "unknown target 'aten'")


def test_every_size_is_bound_by_the_inputs():
    """A size no input has as a dimension (nor passes as a size input) has no value at a call."""
    text = """\
        graph g(%x: f32[s0]) -> (f32[s0]) {
          sizes s0 in 2.. hint 4
          %0: f32[] = full [dtype=f32, shape=(), value=size("VALUE")]
          %1: f32[s0] = mul %x %0
          return %1
        }
        """
    verify(parse(textwrap.dedent(text.replace("VALUE", "s0"))))
    rejects(parse(textwrap.dedent(text.replace("VALUE", "s1"))), "size s1 is neither a dimension of an input")
    undeclared = textwrap.dedent(text.replace("VALUE", "s0").replace("sizes s0", "sizes s9"))
    rejects(parse(undeclared), "size s0 of its inputs is not in its sizes")
