"""Channels-last convolutions: 2-d convolutions run on [N,H,W,C] data (CPU inference graphs).

On CPU, oneDNN convolves channels-last data with a channels-last weight faster than [N,C,H,W]
data, which it reorders first: the benchmark convnet's nine convolutions take 7.97 ms against
8.64 ms (this CPU, batch 16, interleaved), and with each eval batch norm folded into its
convolution (lower_nn.py) they take what Inductor's take. The IR carries no strides, so the
layout is written into the graph as permutes:

    y = conv(x, w)   ->   z = conv_cl(permute(x, NHWC), permute(w, NHWC));  y = permute(z, NCHW)

conv_cl's input and weight are buffers kernels write in that order (buffers.py materializes
them): the kernel that computes x -- ReLU, a residual add -- writes it that way, reading the
previous conv_cl's contiguous result through the permute as index math, and the weight is
transposed each call (as Inductor's layout optimization does: the parameters may change between
calls). A value some other op reads too is stored once, in [N,H,W,C] order, and read through a
permute back; a conv reading a conv's result reads it as it is. Every value keeps its type, so
outputs and the other ops see [N,C,H,W] as before.

Training graphs (compiler/output_layout.py): a saved value that crosses to the backward in
[N,H,W,C] order is, in the forward, an output permute(copy(permute(v, NHWC)), NCHW): the copy is
the buffer a convolution reading v reads too, and a saved convolution result is handed out as the
permuted view of conv_cl's own result instead of being copied. In the backward, each 2-d
`aten.convolution_backward` becomes conv_backward_cl over [N,H,W,C] buffers (the saved input as it
came, the gradient written so by the kernel computing it), whose input gradient comes back in that
order. A pointwise op reading such a buffer through its permute computes in [N,H,W,C] order too
(`sink`), so the kernels between convolutions (batch norm, ReLU, residual adds and their
backwards) read and write one layout: mixed, their loops ran across the other layout's rows and
the convnet's training step was 1.17x the [N,C,H,W] one's; as one, 0.90-0.95x (this CPU). A
convolution output the graph returns keeps eager's contiguous layout (a copy of it).

Assumes: the tensor passes have run (it runs before fusion); ctx.channels_last says whether the
graph's torch ops run on CPU. Guarantees: the graph computes the same values.
"""
from __future__ import annotations

from ...ir import OPS, Graph, Node, TensorType
from ..output_layout import NCHW, NHWC, permuted
from . import dce

CONV_BACKWARD = "aten.convolution_backward.default"
DTYPES = ("f32", "bf16", "f16")  # oneDNN's; double convolutions take another path
MIN_ELEMENTS = 1 << 14  # a smaller convolution stays as it is: its time is overhead, and the layout
                        # copies and oneDNN's channels-last scratch (12 KiB for an 8x8 image) cost more


def _wanted(n: Node) -> bool:
    """A 2-d convolution that runs channels-last (conv_cl)."""
    if n.op != "conv":
        return False
    x, w = n.args[0].type, n.args[1].type
    return (not n.attrs["transposed"] and x.ndim == 4 and w.ndim == 4 and x.dtype in DTYPES
            and all(isinstance(d, int) for d in x.shape + n.type.shape) and n.type.numel >= MIN_ELEMENTS)


def _wanted_backward(n: Node) -> bool:
    """A 2-d convolution's backward (grad_output, input, weight, ...) that runs on channels-last views."""
    if n.op != "extern" or n.attrs.get("target") != CONV_BACKWARD or len(n.args) < 3:
        return False
    args = n.attrs.get("args", ())
    g, x, w = (a.type for a in n.args[:3])
    return (len(args) > 7 and args[7] is False and g.ndim == 4 and x.ndim == 4 and w.ndim == 4
            and g.dtype in DTYPES and x.dtype == g.dtype and w.dtype == g.dtype
            and all(isinstance(d, int) for d in g.shape + x.shape) and g.numel >= MIN_ELEMENTS)


def saved_nhwc(graph: Graph, saved) -> list:
    """The values of `saved` (a training cut of joint graph `graph`) that cross to the backward in
    [N,H,W,C] order: a channels-last convolution's input or result (not a graph input: those come
    as the caller has them)."""
    inputs = {a for n in graph.nodes if _wanted(n) for a in n.args[:1]}
    return [v for v in saved if v.op != "input" and (v in inputs or _wanted(v))]


def _permute_of(v: Node, dims) -> bool:
    return v.op == "permute" and tuple(v.attrs["dims"]) == dims


def _kernel_value(n: Node) -> bool:
    """A value one of our kernels computes (not an input, a view or a torch op's result)."""
    return n.op in OPS and OPS[n.op].category in ("pointwise", "reduction", "data", "creation") and n.op != "constant"


def run(graph: Graph, ctx=None) -> Graph:
    if ctx is None or not getattr(ctx, "channels_last", False):
        return graph
    convs = {n for n in graph.nodes if _wanted(n)}
    backs = {n: None for n in graph.nodes if _wanted_backward(n)}  # -> its conv_backward_cl
    if not convs and not backs:
        return graph
    users = graph.users()
    # a saved value the forward hands out in [N,H,W,C] order: its copy is that buffer (output_layout.in_nhwc)
    copies = {p.args[0]: c for p in graph.nodes if _permute_of(p, NHWC)
              for c in users.get(p, ()) if c.op == "copy"}
    # a backward's [N,H,W,C] input, viewed back: the buffer is the input itself
    nhwc = {v: v.args[0] for v in graph.nodes if _permute_of(v, NCHW) and v.args[0].op == "input"}
    # values a conv or a conv backward reads: wanted in [N,H,W,C] order
    need = {v for n in convs for v in n.args[:2]} | {v for n in backs for v in n.args[:2]}
    outputs = {o for o in graph.outputs if o is not None}
    replace, nodes, convert, moved = {}, [], {}, set()  # old -> new; {conv: its conv_cl result}

    def node(op, args, attrs, type_, meta):
        n = Node(op, args, attrs, type_, meta=meta)
        nodes.append(n)
        return n

    def view_back(v, z, meta):
        """v's readers read [N,H,W,C] buffer z through a permute (which a conv reads as z)."""
        replace[v] = back = node("permute", (z,), {"dims": NCHW}, v.type, meta)
        nhwc[back] = z
        return back

    def layout(v, meta):
        if v in nhwc:
            return
        if v in copies:  # moved up, to just after v: the convolution reads it where the copy was at the end
            nhwc[v] = c = copies[v]
            nodes.extend((c.args[0], c))
            moved.update((c.args[0], c))
            if _kernel_value(v):  # its other readers read that buffer too
                view_back(v, c, meta)
            return
        nhwc[v] = node("permute", (v,), {"dims": NHWC}, permuted(v.type, NHWC), meta)
        if _kernel_value(v) and (v in outputs or any(u not in convs and u not in backs for u in users[v])):
            # its other readers read the [N,H,W,C] buffer through a permute: the value is stored once
            view_back(v, nhwc[v], meta)

    def backward(n):
        """conv_backward_cl over n's grad_output and input in [N,H,W,C] order (its results for n's)."""
        args = n.attrs["args"]
        attrs = {"stride": tuple(args[4]), "padding": tuple(args[5]), "dilation": tuple(args[6]),
                 "groups": args[9], "output_mask": tuple(bool(m) for m in args[10])}
        g, x, w = n.args[:3]
        t = (permuted(x.type, NHWC) if attrs["output_mask"][0] else None, *n.type[1:])
        backs[n] = node("conv_backward_cl", (nhwc[g], nhwc[x], w), attrs, t, n.meta)

    def sink(n) -> bool:
        """A pointwise op reading an [N,H,W,C] buffer through a permute computes in that order
        instead: its kernel then writes (and the next reads) [N,H,W,C] too, as eager's channels-last
        ops do. Its other operands are read through permutes (a [1,C,1,1] scale as [1,1,1,C])."""
        if (not (n.op in OPS and OPS[n.op].category == "pointwise") or n in copies
                or not isinstance(n.type, TensorType) or n.type.ndim != 4
                or not all(isinstance(d, int) for d in n.type.shape)
                or not any(_permute_of(a, NCHW) and nhwc.get(a) is a.args[0] for a in n.args)):
            return False
        args = []
        for a in n.args:
            if _permute_of(a, NCHW) and nhwc.get(a) is a.args[0]:
                args.append(a.args[0])
            elif not isinstance(a.type, TensorType) or a.type.ndim == 0:
                args.append(a)
            else:
                if a.type.ndim < 4:  # broadcast from the right: the same as its 4-d reshape
                    shape = (1,) * (4 - a.type.ndim) + tuple(a.type.shape)
                    a = node("reshape", (a,), {"shape": shape}, TensorType(shape, a.type.dtype), n.meta)
                args.append(node("permute", (a,), {"dims": NHWC}, permuted(a.type, NHWC), n.meta))
        view_back(n, node(n.op, tuple(args), dict(n.attrs), permuted(n.type, NHWC), n.meta), n.meta)
        return True

    for x in graph.inputs:
        if x in need:
            layout(x, {})
    for n in graph.nodes:
        if n in moved:
            if n in need:
                layout(n, n.meta)
            continue
        n.args = tuple(replace.get(a, a) for a in n.args)
        if n in convs:
            z = node("conv_cl", (nhwc[n.args[0]], nhwc[n.args[1]], *n.args[2:]), dict(n.attrs),
                     permuted(n.type, NHWC), n.meta)
            view_back(n, z, n.meta)  # a conv reading this one's result reads it as it is
            convert[n] = z
            continue
        if n in backs:
            backward(n)
            continue
        if n.op == "getitem" and n.args[0] in backs:  # grad_input comes in [N,H,W,C] order: viewed back
            new = node("getitem", (backs[n.args[0]],), dict(n.attrs), backs[n.args[0]].type[n.attrs["index"]], n.meta)
            if n.attrs["index"] == 0:
                view_back(n, new, n.meta)  # a convolution backward reading it reads it as it is
            else:
                replace[n] = new
            continue
        if sink(n):
            continue
        if n.op == "copy" and _permute_of(n.args[0], NHWC) and n.args[0].args[0] in nhwc \
                and nhwc[n.args[0].args[0]].op == "conv_cl":
            replace[n] = nhwc[n.args[0].args[0]]  # a saved conv result: handed out as conv_cl's own
            continue
        nodes.append(n)
        if n in need:
            layout(n, n.meta)
    graph.nodes = nodes
    outs = []
    for o in graph.outputs:
        new = replace.get(o, o) if o is not None else None
        if o in convert:  # returned as eager returns it, contiguous (a view of conv_cl's result is not)
            new = Node("copy", (new,), {}, o.type, meta=o.meta)
            nodes.append(new)
        outs.append(new)
    graph.outputs = outs
    return dce.run(graph)  # a saved conv result's permute, its copy replaced
