"""Print a Graph as text, one typed SSA line per node (like a jaxpr), stable across runs:

    graph forward(%x: f32[64,1024], %w: f32[1024]) -> (f32[64,1024]) {
      %0: f32[64,1] = sum %x [dims=(1,), keepdim=true]
      %1: f32[64,1024] = sub %x %0
      return %1
    }

Body nodes are numbered in order; inputs keep their names. `parser.parse` reads this text back.
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import torch

from .ops import Ref
from .types import DTYPES, TensorType

if TYPE_CHECKING:  # annotations only: graph.py imports this module to print a Graph
    from .graph import Graph, Node


def format_type(t) -> str:
    if t is None:
        return "None"
    if isinstance(t, TensorType):
        return str(t)
    return "(" + ", ".join(format_type(x) for x in t) + ")"


def format_value(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)
    if isinstance(v, str):
        return v if v in DTYPES else json.dumps(v)  # dtype names print bare: cast [dtype=f16]
    if isinstance(v, Ref):
        return repr(v)
    if isinstance(v, (torch.dtype, torch.layout, torch.memory_format)):
        return str(v)  # torch.float32, torch.strided, torch.contiguous_format
    if isinstance(v, tuple):
        inner = ", ".join(format_value(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {format_value(x)}" for k, x in sorted(v.items())) + "}"
    raise TypeError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


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


def print_graph(graph: Graph) -> str:
    names = namer(graph)
    params = ", ".join(f"{names[n]}: {format_type(n.type)}" for n in graph.inputs)
    outs = ", ".join("None" if o is None else format_type(o.type) for o in graph.outputs)
    lines = [f"graph {graph.name}({params}) -> ({outs}) {{"]
    lines += ["  " + format_node(n, names) for n in graph.nodes]
    rets = ", ".join("None" if o is None else names.get(o, "%?") for o in graph.outputs)
    lines.append(f"  return {rets}".rstrip())
    lines.append("}")
    return "\n".join(lines) + "\n"
