"""Channels-last convolutions: 2-d convolutions run on [N,H,W,C] data (CPU inference graphs).

On CPU, oneDNN convolves channels-last data with a channels-last weight faster than [N,C,H,W]
data, which it reorders first: the benchmark convnet's nine convolutions take 7.97 ms against
8.64 ms (this CPU, batch 16, interleaved), and with each eval batch norm folded into its
convolution (lower_nn.py) they take what Inductor's take. The IR carries no strides, so the
layout is written into the graph as permutes:

    y = conv(x, w)   ->   z = conv_cl(permute(x, NHWC), permute(w, NHWC));  y = permute(z, NCHW)

conv_cl's input and weight are buffers kernels write in that order (schedule.py materializes
them): the kernel that computes x -- ReLU, a residual add -- writes it that way, reading the
previous conv_cl's contiguous result through the permute as index math, and the weight is
transposed each call (as Inductor's layout optimization does: the parameters may change between
calls). A value some other op reads too is stored once, in [N,H,W,C] order, and read through a
permute back; a conv reading a conv's result reads it as it is. Every value keeps its type, so
outputs and the other ops see [N,C,H,W] as before.

Assumes: the tensor passes have run (it runs before fusion); ctx.channels_last says whether the
graph's torch ops run on CPU in inference (training graphs keep the layout the saved values and
the convolution backward share). Guarantees: the graph computes the same values.
"""
from __future__ import annotations

from ...ir import OPS, Graph, Node, TensorType

NHWC, NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
DTYPES = ("f32", "bf16", "f16")  # oneDNN's; double convolutions take another path
MIN_ELEMENTS = 1 << 14  # a smaller convolution stays as it is: its time is overhead, and the layout
                        # copies and oneDNN's channels-last scratch (12 KiB for an 8x8 image) cost more


def _wanted(n: Node) -> bool:
    if n.op != "conv":
        return False
    x, w = n.args[0].type, n.args[1].type
    return (not n.attrs["transposed"] and x.ndim == 4 and w.ndim == 4 and x.dtype in DTYPES
            and all(isinstance(d, int) for d in x.shape + n.type.shape) and n.type.numel >= MIN_ELEMENTS)


def _permute(x: Node, dims, meta) -> Node:
    return Node("permute", (x,), {"dims": dims}, TensorType(tuple(x.type.shape[d] for d in dims), x.type.dtype),
                meta=meta)


def _kernel_value(n: Node) -> bool:
    """A value one of our kernels computes (not an input, a view or a torch op's result)."""
    return n.op in OPS and OPS[n.op].category in ("pointwise", "reduction", "data", "creation") and n.op != "constant"


def run(graph: Graph, ctx=None) -> Graph:
    if ctx is None or not getattr(ctx, "channels_last", False):
        return graph
    convs = {n for n in graph.nodes if _wanted(n)}
    if not convs:
        return graph
    need = {v for n in convs for v in n.args[:2]}  # values a conv reads: wanted in [N,H,W,C] order
    users = graph.users()
    outputs = {o for o in graph.outputs if o is not None}
    nhwc, replace, nodes = {}, {}, []               # value -> its [N,H,W,C] node; old -> new

    def layout(v, meta):
        nhwc[v] = _permute(v, NHWC, meta)
        nodes.append(nhwc[v])
        if _kernel_value(v) and (v in outputs or any(u not in convs for u in users[v])):
            # its other readers read the [N,H,W,C] buffer through a permute: the value is stored once
            replace[v] = back = _permute(nhwc[v], NCHW, meta)
            nhwc[back] = nhwc[v]
            nodes.append(back)
    for x in graph.inputs:
        if x in need:
            layout(x, {})
    for n in graph.nodes:
        n.args = tuple(replace.get(a, a) for a in n.args)
        if n in convs:
            z = Node("conv_cl", (nhwc[n.args[0]], nhwc[n.args[1]], *n.args[2:]), dict(n.attrs),
                     TensorType(tuple(n.type.shape[d] for d in NHWC), n.type.dtype), meta=n.meta)
            replace[n] = y = Node("permute", (z,), {"dims": NCHW}, n.type, meta=n.meta)
            nhwc[y] = z  # a conv reading this one's result reads it as it is
            nodes += [z, y]
            continue
        nodes.append(n)
        if n in need:
            layout(n, n.meta)
    graph.nodes = nodes
    graph.outputs = [replace.get(o, o) if o is not None else None for o in graph.outputs]
    return graph
