"""Outputs that are views of an input, made in torch from the caller's tensors.

An fx output that is a chain of views of a graph input (x[T // 2], x.narrow(...)) is an alias
AOTAutograd rebuilds after the call: it replays the views on the caller's tensor -- except when a
view took a symbolic argument, where it takes the size, strides and storage offset of what the
compiled graph returned and applies them with as_strided. A program returns a fresh copy (offset 0),
so x[T // 2] came back as row 0. Here each such output is the view itself, made by the graph's own
view nodes on the tensors the caller passed: eager's exact metadata, whatever the sizes.
"""
from __future__ import annotations

import torch
import torch.fx as fx


def _is_view(n: fx.Node) -> bool:
    return n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target.is_view


def _ancestors(o: fx.Node) -> list | None:
    """The nodes that compute output o from the placeholders, when every tensor among them is a view
    of a placeholder (sizes may come from anywhere); None otherwise."""
    seen, order, stack = set(), [], [(o, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen or n.op == "placeholder":
            continue
        seen.add(n)
        is_tensor = isinstance(n.meta.get("val"), torch.Tensor)
        if n.op != "call_function" or (is_tensor and not _is_view(n)):
            return None
        stack.append((n, True))
        stack.extend((a, False) for a in n.all_input_nodes)
    return order


def input_views(gm: fx.GraphModule) -> list:
    """[(output position, a GraphModule taking the graph's arguments and returning that output)] for
    the outputs that are views of an input."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for i, o in enumerate(out_node.args[0]):
        if not isinstance(o, fx.Node) or not _is_view(o):
            continue
        nodes = _ancestors(o)
        if nodes is None:
            continue
        g = fx.Graph()
        env = {p: g.placeholder(p.name) for p in placeholders}
        for n in nodes:
            env[n] = g.node_copy(n, env.__getitem__)
        g.output(env[o])
        found.append((i, fx.GraphModule(gm, g)))
    return found


def with_input_views(run, gm: fx.GraphModule):
    """`run` (the compiled graph's call, Dynamo's convention), with each output that is a view of an
    input replaced by that view of the caller's tensor."""
    views = input_views(gm)
    if not views:
        return run

    def call(*args):
        out = list(run(*args))
        for i, view in views:
            out[i] = view(*args)
        return out
    return call
