"""Outputs that are views of an input or of another output, made in torch after the program runs.

An fx output that is a chain of views of a graph input (x[T // 2], x.narrow(...)) is an alias
AOTAutograd rebuilds after the call: it replays the views on the caller's tensor -- except when a
view took a symbolic argument, where it takes the size, strides and storage offset of what the
compiled graph returned and applies them with as_strided. A program returns a fresh copy (offset 0),
so x[T // 2] came back as row 0. Here each such output is the view itself, made by the graph's own
view nodes on the tensors the caller passed: eager's exact metadata, whatever the sizes.

So is an output that is a chain of views of another output (z and z.t(); an input's new value after
x.mul_(2) and x[T // 2], which AOTAutograd rebuilds from x the same way): the view of the tensor the
program returned for that output, sharing its memory as eager's do. An output whose chain passes
through a clone is no view: the IR has no clones, and such an output keeps its own buffer.

Outputs that view one value the graph does not return (y[1:] and y.t() of y = x * 2) share y's
memory in eager too: y becomes an extra, last output of an inference graph (share_bases), each of
them a view of it, and the call drops y again.
"""
from __future__ import annotations

import collections
import operator

import torch
import torch.fx as fx


def _is_view(n: fx.Node) -> bool:
    """A view op's result, or one of the views a split or unbind returns (getitem of it)."""
    if n.op != "call_function":
        return False
    if n.target is operator.getitem:
        return isinstance(n.args[0], fx.Node) and _is_view(n.args[0])
    return isinstance(n.target, torch._ops.OpOverload) and n.target.is_view


def _ancestors(o: fx.Node, leaf=None) -> list | None:
    """The nodes that compute output o from the placeholders (and `leaf`, taken as given), when
    every tensor among them is a view of one of those (sizes may come from anywhere); else None."""
    seen, order, stack = set(), [], [(o, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen or n.op == "placeholder" or n is leaf:
            continue
        seen.add(n)
        is_tensor = isinstance(n.meta.get("val"), torch.Tensor)
        if n.op != "call_function" or (is_tensor and not _is_view(n)):
            return None
        stack.append((n, True))
        stack.extend((a, False) for a in n.all_input_nodes)
    return order


def _root(o: fx.Node) -> fx.Node:
    while _is_view(o):
        o = o.args[0]
    return o


def share_bases(gm: fx.GraphModule) -> int:
    """Append to `gm`'s outputs each value it does not return that two or more outputs are views
    of; returns how many (with_input_views drops them from each call's outputs)."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    count: collections.Counter = collections.Counter()
    for o in outs:
        if isinstance(o, fx.Node) and _is_view(o):
            root = _root(o)
            if (root.op != "placeholder" and root not in outs and isinstance(root.meta.get("val"), torch.Tensor)
                    and _ancestors(o, leaf=root) is not None):
                count[root] += 1
    bases = [r for r, c in count.items() if c > 1]
    if bases:
        out_node.args = (type(out_node.args[0])(outs + bases),)
        gm.recompile()
    return len(bases)


def input_views(gm: fx.GraphModule, limit=None) -> list:
    """[(output position, position of the output it views or None for an input, a GraphModule taking
    the graph's arguments (and that output's tensor) and returning the view)] for the first `limit`
    outputs (None: all) that are views of an input or of another output."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for i, o in enumerate(outs[:limit]):
        if not isinstance(o, fx.Node) or not _is_view(o):
            continue
        root = _root(o)
        base = next((k for k, r in enumerate(outs) if r is root and k != i), None)
        if root.op != "placeholder" and base is None:
            continue
        nodes = _ancestors(o, leaf=root if base is not None else None)
        if nodes is None:
            continue
        g = fx.Graph()
        env = {p: g.placeholder(p.name) for p in placeholders}
        if base is not None:
            env[root] = g.placeholder("minicomp_base")
        for n in nodes:
            env[n] = g.node_copy(n, env.__getitem__)
        g.output(env[o])
        found.append((i, base, fx.GraphModule(gm, g)))
    return found


def view_bases(gm: fx.GraphModule, limit=None) -> set:
    """Positions of the outputs that one of the first `limit` outputs (None: all) is a view of: the
    view is made from the tensor the program returns there, so that tensor needs eager's layout
    (output_layout.py) even where the rest of its kind does not (a training forward's saved value:
    attention's output, which eager lays out as (B, T, H, D), viewed by the user's
    out.transpose(1, 2).view(B, T, C))."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    bases = set()
    for i, o in enumerate(outs[:limit]):
        if isinstance(o, fx.Node) and _is_view(o):
            root = _root(o)
            base = next((k for k, r in enumerate(outs) if r is root and k != i), None)
            if base is not None and _ancestors(o, leaf=root) is not None:
                bases.add(base)
    return bases


def with_input_views(run, gm: fx.GraphModule, limit=None, hidden: int = 0):
    """`run` (the compiled graph's call, Dynamo's convention), with each output that is a view of an
    input or of another output replaced by that view of the caller's tensor or of that output, and
    the last `hidden` outputs (share_bases) dropped."""
    views = input_views(gm, limit)
    if not views and not hidden:
        return run

    def call(*args):
        out = list(run(*args))
        for i, base, view in views:
            out[i] = view(*args) if base is None else view(*args, out[base])
        if hidden:
            del out[-hidden:]
        return out
    return call
