"""Printer and parser: every attribute kind survives print -> parse -> print, and bad text fails
with a ParseError naming the line."""
from __future__ import annotations

import math
import textwrap

import pytest
import torch

from minicomp.ir import Graph, Node, OpArg, ParseError, Ref, TensorType, parse, verify


def ir(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


ALL_ATTR_KINDS = ir("""
    graph g(%x: f32[2,3], %i: i64[2]) -> (f32[2,3], None, b8[]) {
      %0: f32[] = full [dtype=f32, shape=(), value=-inf]
      %1: f32[] = full [dtype=f32, shape=(), value=nan]
      %2: f32[] = full [dtype=f32, shape=(), value=1e-05]
      %3: f64[] = full [dtype=f64, shape=(), value=-3.4028234663852886e+38]
      %4: f32[] = full [dtype=f32, shape=(), value=-0.0]
      %5: i64[] = full [dtype=i64, shape=(), value=-9223372036854775808]
      %6: b8[] = full [dtype=b8, shape=(), value=true]
      %7: f32[2,3] = extern %x %x [args=($0, [$1, 2], (), (3,), none, "a \\"quoted\\" string"), kwargs={"dtype": torch.float32, "layout": torch.strided, "memory_format": torch.contiguous_format}, target="aten.add.Tensor"]
      %8: (f32[2,3], None) = extern %x [args=($0,), kwargs={}, target="aten.max.dim"]
      %9: f32[2,3] = getitem %8 [index=0]
      %10: f16[2,3] = cast %9 [dtype=f16]
      %11: f32[2,3] = gelu %7 [approximate="tanh"]
      %12: (f32[0], None) = extern %x %i [args=($0, op("aten._linalg_check_errors.default"), $1, "linalg.inv"), kwargs={"is_matrix": false}, target="higher_order.with_effects"]
      %13: c64[2,3] = extern %x [args=($0, complex(1.0, -2.5)), target="aten.mul.Tensor"]
      return %11, None, %6
    }
""")


def test_round_trip_of_every_attribute_kind():
    graph = parse(ALL_ATTR_KINDS)
    assert str(graph) == ALL_ATTR_KINDS


def test_parsed_attribute_values():
    g = parse(ALL_ATTR_KINDS)
    vals = [n.attrs.get("value") for n in g.nodes[:7]]
    assert vals[0] == -math.inf and math.isnan(vals[1]) and vals[2] == 1e-05
    assert math.copysign(1, vals[4]) == -1 and vals[5] == -2**63 and vals[6] is True
    assert all(isinstance(v, float) for v in vals[:5]) and isinstance(vals[5], int)
    ext = g.nodes[7]
    assert ext.attrs["args"] == (Ref(0), [Ref(1), 2], (), (3,), None, 'a "quoted" string')
    assert ext.attrs["kwargs"]["dtype"] is torch.float32 and ext.attrs["kwargs"]["layout"] is torch.strided
    assert g.nodes[8].type == (TensorType((2, 3), "f32"), None)
    assert g.nodes[10].attrs == {"dtype": "f16"}  # dtype names are bare words
    assert g.nodes[12].attrs["args"][1] == OpArg("aten._linalg_check_errors.default")  # an operator argument
    assert g.nodes[13].attrs["args"][1] == complex(1.0, -2.5)  # a complex scalar operand
    assert g.outputs[1] is None


def test_printer_is_stable_and_numbers_body_nodes():
    x = Node("input", (), type=TensorType((4,), "f32"), name="x")
    a = Node("neg", (x,), type=TensorType((4,), "f32"))
    b = Node("sum", (a,), {"keepdim": False, "dims": (0,)}, TensorType((), "f32"))
    g = Graph("g", [x], [a, b], [b, a])
    text = ir("""
        graph g(%x: f32[4]) -> (f32[], f32[4]) {
          %0: f32[4] = neg %x
          %1: f32[] = sum %0 [dims=(0,), keepdim=false]
          return %1, %0
        }
    """)
    assert str(g) == text and str(g) == text  # attrs print sorted, whatever their insertion order
    assert str(verify(parse(text))) == text


def test_graph_without_outputs_round_trips():
    text = "graph empty() -> () {\n  return\n}\n"
    assert str(parse(text)) == text


def test_comments_and_blank_lines_are_skipped():
    text = "# a comment\n\ngraph g(%x: f32[2]) -> (f32[2]) {\n  # why\n  %0: f32[2] = exp %x\n  return %0\n}\n"
    assert str(parse(text)) == "graph g(%x: f32[2]) -> (f32[2]) {\n  %0: f32[2] = exp %x\n  return %0\n}\n"


def test_names_starting_with_inf_are_names():
    g = parse("graph inference(%inf: f32[1]) -> (f32[1]) {\n  return %inf\n}\n")
    assert g.name == "inference" and g.inputs[0].name == "inf"


def graph_text(*body, head="graph g(%x: f32[2]) -> (f32[2]) {"):
    return "\n".join([head, *body, "}"])


@pytest.mark.parametrize("text, message", [
    ("", "empty text"),
    (graph_text("%0: f32[2] = exp %y", "return %0"), "line 2: %0 = exp uses %y before it is defined"),
    (graph_text("%0: f32[2] = exp %x", "%0: f32[2] = exp %x", "return %0"), "line 3: %0 is defined twice"),
    (graph_text("%0: f32[2] = exp %x"), "no return line"),
    (graph_text("return %5"), "line 2: return of undefined %5"),
    (graph_text("return %x", head="graph g(%x: q32[2]) -> (f32[2]) {"),
     "line 1: expected a type such as f32[4], found 'q32'"),
    (graph_text("return %x", head="graph g(%x: f32[2]) -> (f32[3]) {"),
     "line 1: header declares outputs (f32[3]) but the return line gives (f32[2])"),
    (graph_text("%0: f32[2] = exp %x ]", "return %0"), "line 2: trailing text ']'"),
    (graph_text("%0: f32[2] = exp %x [a=@]", "return %0"), "line 2: cannot read '@]'"),
    (graph_text("return %x", head="graph g(%x: f32[x]) -> (f32[2]) {"), "line 1: cannot read"),
    (graph_text("0: f32[2] = exp %x", "return %0"), "line 2: expected `%name: type = op ...`"),
    (graph_text("return %x", "%0: f32[2] = exp %x"), "line 3: text after the return line"),
    (graph_text("%0: f32[1,2] = reshape %x [shape=(1 2)]", "return %0", head="graph g(%x: f32[2]) -> (f32[1,2]) {"),
     "line 2: expected ',' or ')', found '2'"),
    (graph_text("%0: f32[s0] = reshape %x [shape=(size(\"s0//0\"),)]", "return %0",
                head="graph g(%x: f32[s0]) -> (f32[s0]) {"), "a size expression divides by zero"),
])
def test_parse_errors_name_the_line(text, message):
    with pytest.raises(ParseError) as e:
        parse(text)
    assert message in str(e.value)
