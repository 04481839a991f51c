"""Program instances of a graph over symbolic sizes (runtime/sized.py), for any kernel backend.

A backend compiles the symbolic graph's kernels once; `sized_program` then makes, for each call
size, a concrete copy of the fused graph (types and attributes at those sizes, the kernels' IR
shared), plans its arena with the same pass a static graph gets, and assembles it as a static
program over the same machine code, with `make_launch(kernel, slots, values)` giving each kernel its
launch at those sizes. The first instance is made now, at the hints, for the compile's report.
"""
from __future__ import annotations

import copy

from ..errors import MinicompError
from ..ir import Graph, Node, TensorType, sym, sym_values
from ..report import Report
from ..runtime.sized import SizedProgram
from . import arena
from .assemble import assemble


def _type(t, values):
    if isinstance(t, TensorType):
        return TensorType(tuple(sym.evaluate(s, values) for s in t.shape), t.dtype)
    if isinstance(t, tuple):
        return tuple(_type(x, values) for x in t)
    return t


def concretize(graph: Graph, values: dict) -> Graph:
    """A copy of `graph` at sizes `values`: every type and attribute evaluated; kernel nodes keep
    their (symbolic) Kernel, which the machine code runs at these sizes."""
    new: dict = {}
    inputs = []
    for x in graph.inputs:
        new[x] = Node("input", (), type=_type(x.type, values), name=x.name, meta=x.meta)
        inputs.append(new[x])
    nodes = []
    for n in graph.nodes:
        attrs = sym_values.concrete(n.attrs, values) if sym_values.has_sym(n.attrs) else n.attrs
        c = Node(n.op, tuple(new[a] for a in n.args), attrs, _type(n.type, values), n.name, dict(n.meta))
        c.meta.pop("arena_offset", None)
        new[n] = c
        nodes.append(c)
    return Graph(graph.name, inputs, nodes, [None if o is None else new[o] for o in graph.outputs], graph.constants)


def symbol_sources(graph: Graph) -> dict:
    """symbol -> (input position, dimension) where a call's inputs carry it as a bare dimension."""
    where: dict = {}
    for i, x in enumerate(graph.inputs):
        for d, s in enumerate(x.type.shape):
            name = sym_values.as_symbol(s)
            if name is not None:
                where.setdefault(name, (i, d))
    missing = sorted(set(graph.sizes) - set(where) - set(graph.size_inputs))
    if missing:
        raise MinicompError(f"minicomp: {graph.name}: size(s) {', '.join(missing)} are not a dimension of any "
                            "input, so a call cannot tell them")
    return where


def sized_program(graph: Graph, ctx, kernels, make_launch, keepalive, device="cpu", wrap=None):
    """(SizedProgram, report detail of the instance at the hints); `wrap`: SizedProgram's."""
    where = {s: w for s, w in symbol_sources(graph).items() if s not in graph.size_inputs}
    first = [True]

    def make(values: dict):
        g = concretize(graph, values)
        c = copy.copy(ctx)
        if not first[0]:  # the compile's report lists the kernels and steps once, from the first instance
            c.report = Report()
        first[0] = False
        c.arena_bytes = arena.plan(g)
        program, detail = assemble(g, c, kernels, lambda k, slots: make_launch(k, slots, values), keepalive, device,
                                   values)
        program.detail = detail
        return program

    hints = {s: sym.hint(sym.symbol(s)) for s in list(where) + graph.size_inputs}
    prog = SizedProgram(where, make, keepalive, sym.current().guards, graph.size_inputs, wrap)
    detail = dict(prog.make(hints).detail)
    detail["arena_bytes_at_hint"] = detail.pop("arena_bytes", 0)
    return prog, detail

