"""Check a Graph's invariants; run after every pass in tests and in debug mode.

Guarantees on success: every operand is defined before use, every op is in the table with the
right arity and attributes, and every node's type is what the op table's rule infers.
"""
from __future__ import annotations

from .graph import Graph
from .ops import OPS
from .printer import format_node, format_type, namer
from .types import TensorType


class VerifyError(ValueError):
    pass


def verify(graph: Graph) -> Graph:
    names = namer(graph)
    defined = set()
    for n in graph.inputs:
        if n.op != "input" or not isinstance(n.type, TensorType):
            raise VerifyError(f"graph {graph.name}: input %{n.name} must be an 'input' node with a tensor type")
        defined.add(n)
    for n in graph.nodes:
        line = format_node(n, names)

        def fail(msg):
            raise VerifyError(f"graph {graph.name}: `{line}`: {msg}")
        if n in defined:
            fail("node appears twice")
        opdef = OPS.get(n.op)
        if opdef is None:
            fail(f"unknown op {n.op!r}")
        for a in n.args:
            if a not in defined:
                fail(f"operand {names.get(a, repr(a))} is used before it is defined")
        if opdef.arity is not None and len(n.args) != opdef.arity:
            fail(f"{n.op} takes {opdef.arity} operands, got {len(n.args)}")
        missing = [k for k in opdef.attrs if k not in n.attrs]
        if missing:
            fail(f"missing attribute(s) {', '.join(missing)}")
        if n.op == "getitem":
            src = n.args[0].type
            if not isinstance(src, tuple) or not 0 <= n.attrs["index"] < len(src) or src[n.attrs["index"]] != n.type:
                fail(f"getitem does not match the operand's type {format_type(src)}")
        elif n.op in ("extern", "constant"):
            if n.type is None:
                fail("extern/constant nodes must carry their type")
            if n.op == "constant" and graph.constants and n.attrs["name"] not in graph.constants:
                fail(f"constant {n.attrs['name']!r} has no data in graph.constants")
        else:
            for a in n.args:
                if not isinstance(a.type, TensorType):
                    fail(f"operand {names[a]} is a tuple; pick an element with getitem")
            try:
                want = opdef.infer(tuple(a.type for a in n.args), n.attrs)
            except (TypeError, ValueError, KeyError) as e:
                fail(str(e))
            if want != n.type:
                fail(f"type should be {format_type(want)}")
        defined.add(n)
    for o in graph.outputs:
        if o is not None and o not in defined:
            raise VerifyError(f"graph {graph.name}: returns {names.get(o, repr(o))}, which is not defined")
    return graph
