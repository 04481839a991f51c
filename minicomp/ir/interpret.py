"""The reference backend: run a Graph node by node through the op table's torch references.

It is the oracle every pass and backend is tested against, so it does nothing clever: the per-node
work (ref lookup, operand indices) is prepared once, and each call walks the list. A graph with
symbolic sizes binds them from its inputs' shapes at each call and runs every node's attributes at
those sizes.
"""
from __future__ import annotations

import torch

from . import sym_values
from .graph import Graph
from .kernel_interpret import kernel_node_ref
from .ops import OPS


def prepare(graph: Graph):
    """Return `run(*inputs) -> list` for the graph."""
    slot = {n: i for i, n in enumerate(graph.inputs)}
    steps = []
    for n in graph.nodes:
        slot[n] = len(slot)
        if n.op == "constant":
            value = graph.constants[n.attrs["name"]]
            steps.append((None, value, None))
        elif n.op == "kernel":  # a fused graph: run the kernel's own IR with torch
            steps.append((lambda xs, a, d, n=n: kernel_node_ref(n, xs, d, a), tuple(slot[a] for a in n.args), None))
        else:
            steps.append((OPS[n.op].ref, tuple(slot[a] for a in n.args), n.attrs))
    symbolic = bool(graph.sizes) or any(getattr(x.type, "symbolic", False) for x in graph.inputs)
    outs = tuple(None if o is None else slot[o] for o in graph.outputs)
    n_in = len(graph.inputs)
    shapes = [x.type.shape for x in graph.inputs]

    def run(*inputs, sizes=()):
        if len(inputs) != n_in:
            raise TypeError(f"graph {graph.name} takes {n_in} inputs, got {len(inputs)}")
        env = list(inputs)
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        values = None
        if symbolic:
            values = dict(zip(graph.size_inputs, sizes))
            sym_values.bind_inputs(shapes, inputs, values)
        for ref, args, attrs in steps:
            if ref is None:
                env.append(args.to(device))
            elif attrs is None:  # a kernel: its sizes
                env.append(ref([env[i] for i in args], values, device))
            else:
                env.append(ref([env[i] for i in args], attrs if values is None else sym_values.concrete(attrs, values), device))
        return [None if i is None else env[i] for i in outs]
    return run


def interpret(graph: Graph, *inputs):
    return prepare(graph)(*inputs)
