"""Constant folding.

Assumes: `full` nodes hold one value for every element. Guarantees: a pointwise or view op whose
operands are all `full` becomes one `full` of its result type (computed by the op's own torch
reference on 0-d tensors, so rounding matches eager); the fold is skipped if the value is not uniform.
"""
from __future__ import annotations

import torch

from ...ir import OPS, DTYPES, Graph, Node


def _value(n: Node) -> torch.Tensor:
    return torch.full((), n.attrs["value"], dtype=DTYPES[n.attrs["dtype"]])


def run(graph: Graph, ctx=None) -> Graph:
    replace = {}
    for n in graph.nodes:
        n.args = tuple(replace.get(a, a) for a in n.args)
        cat = OPS[n.op].category
        if cat not in ("pointwise", "view") or not n.args or not all(a.op == "full" for a in n.args):
            continue
        if cat == "view":
            value = n.args[0].attrs["value"]
        else:
            out = OPS[n.op].ref([_value(a) for a in n.args], n.attrs, "cpu")
            value = out.item()
        n.op, n.args = "full", ()
        n.attrs = {"shape": n.type.shape, "value": value, "dtype": n.type.dtype}
    return graph
