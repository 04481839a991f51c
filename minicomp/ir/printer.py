"""Print a Graph as text, one typed SSA line per node (like a jaxpr), stable across runs:

    graph forward(%x: f32[64,1024], %w: f32[1024]) -> (f32[64,1024]) {
      %0: f32[64,1] = sum %x [dims=(1,), keepdim=true]
      %1: f32[64,1024] = sub %x %0
      return %1
    }

Body nodes are numbered in order; inputs keep their names. A graph with symbolic sizes (`f32[s0,768]`)
says their ranges and hints on a `sizes` line under the header (`given`: a call passes it as an int). A fused graph's `kernel` node prints its
body inline, in braces under it (ir/kernel.py). `parser.parse` reads this text back.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .kernel import kernel_body
from .text import format_value
from .types import TensorType

__all__ = ["format_attrs", "format_node", "format_type", "format_value", "namer", "node_lines", "print_graph"]

if TYPE_CHECKING:  # annotations only: graph.py imports this module to print a Graph
    from .graph import Graph, Node


def format_type(t) -> str:
    if t is None:
        return "None"
    if isinstance(t, TensorType):
        return str(t)
    return "(" + ", ".join(format_type(x) for x in t) + ")"


def format_attrs(attrs: dict) -> str:
    if not attrs:
        return ""
    return " [" + ", ".join(f"{k}={format_value(attrs[k])}" for k in sorted(attrs)) + "]"


def namer(graph: Graph) -> dict[Node, str]:
    names = {n: f"%{n.name}" for n in graph.inputs}
    for i, n in enumerate(graph.nodes):
        names[n] = f"%{i}"
    return names


def format_node(n: Node, names: dict) -> str:
    args = "".join(" " + names.get(a, "%?") for a in n.args)
    return f"{names[n]}: {format_type(n.type)} = {n.op}{args}{format_attrs(n.attrs)}"


def node_lines(n: Node, names: dict) -> list[str]:
    """A node's lines in the graph text, indented: one, or a kernel node's line and its body."""
    line = "  " + format_node(n, names)
    if n.op != "kernel" or "kernel" not in n.meta:
        return [line]
    return [line + " {"] + ["    " + ln for ln in kernel_body(n, names)] + ["  }"]


def print_graph(graph: Graph) -> str:
    names = namer(graph)
    params = ", ".join(f"{names[n]}: {format_type(n.type)}" for n in graph.inputs)
    outs = ", ".join("None" if o is None else format_type(o.type) for o in graph.outputs)
    lines = [f"graph {graph.name}({params}) -> ({outs}) {{"]
    if graph.sizes:  # `sizes s0 in 2..1024 hint 128, s1 in 2.. hint 7`
        lines.append("  sizes " + ", ".join(f"{s} in {lo}..{'' if hi is None else hi} hint {h}"
                                            + (" given" if s in graph.size_inputs else "")
                                            for s, (lo, hi, h) in sorted(graph.sizes.items())))
    for n in graph.nodes:
        lines += node_lines(n, names)
    rets = ", ".join("None" if o is None else names.get(o, "%?") for o in graph.outputs)
    lines.append(f"  return {rets}".rstrip())
    lines.append("}")
    return "\n".join(lines) + "\n"
