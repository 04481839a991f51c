"""Constant folding.

Assumes: `full` nodes hold one value for every element. Guarantees: a pointwise or view op whose
operands are all `full` becomes one `full` of its result type (computed by the op's own torch
reference on 0-d tensors, so rounding, nan and inf match eager). An op whose evaluation raises
(integer division by zero) is left alone: eager raises when the program runs, not when it compiles.
"""
from __future__ import annotations

import torch

from ...ir import DTYPES, OPS, Graph, Node


def _value(n: Node) -> torch.Tensor:
    return torch.full((), n.attrs["value"], dtype=DTYPES[n.attrs["dtype"]])


def _folded_value(n: Node):
    """The one value of n's result, or None when it must not fold."""
    if OPS[n.op].category == "view":
        return n.args[0].attrs["value"]
    try:
        return OPS[n.op].ref([_value(a) for a in n.args], n.attrs, "cpu").item()
    except RuntimeError:
        return None


def run(graph: Graph, ctx=None) -> Graph:
    for n in graph.nodes:
        if OPS[n.op].category not in ("pointwise", "view") or not n.args or any(a.op != "full" for a in n.args):
            continue
        if any(not isinstance(a.attrs["value"], (bool, int, float)) for a in n.args):
            continue  # a symbolic size's value is known at run time only
        value = _folded_value(n)
        if value is None:
            continue
        n.op, n.args = "full", ()
        n.attrs = {"shape": n.type.shape, "value": value, "dtype": n.type.dtype}
    return graph
