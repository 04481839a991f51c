"""Check a Graph's invariants; run after every pass in tests and in debug mode.

Guarantees on success: every operand is defined before use, every op is in the table with the
right arity and attributes, every node's type is what the op table's rule infers, tuple-typed
values (multi-result externs and kernels) are read only through in-range `getitem`s, and every
extern's `$i` slots name one of its operands. An error names the offending node as printed, and its line number
in the printed text, so it can be found in a dump file.
"""
from __future__ import annotations

from .graph import Graph, Node
from .ops import OPS, Ref, resolve_target
from .printer import format_node, format_type, namer
from .types import DTYPES, TensorType


class VerifyError(ValueError):
    pass


def _bad_type(t) -> str | None:
    """Why `t` is not a well-formed tensor type, or None."""
    if not isinstance(t, TensorType):
        return f"{format_type(t)} is not a tensor type"
    if t.dtype not in DTYPES:
        return f"unknown dtype {t.dtype!r}"
    if any(not isinstance(s, int) or s < 0 for s in t.shape):
        return f"bad shape {t.shape}"
    return None


def _refs(value, out: list) -> list:
    """All Ref slots in an extern's args/kwargs template."""
    if isinstance(value, Ref):
        out.append(value.index)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _refs(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _refs(v, out)
    return out


def _check_result_types(n: Node, fail) -> None:
    """Externs and kernels carry their result type (a tuple for several results) instead of inferring it."""
    types = n.type if isinstance(n.type, tuple) and not isinstance(n.type, TensorType) else (n.type,)
    for t in types:
        if t is not None and _bad_type(t):
            fail(f"result type: {_bad_type(t)}")
    if n.type is None or all(t is None for t in types):
        fail(f"a {n.op} node must carry its result type")


def _check_extern(n: Node, fail) -> None:
    slots = _refs((n.attrs["args"], n.attrs.get("kwargs", {})), [])
    if any(not 0 <= i < len(n.args) for i in slots):
        fail(f"argument slots {sorted(set(slots))} do not match its {len(n.args)} operand(s)")
    try:
        resolve_target(n.attrs["target"])
    except (AttributeError, RuntimeError):
        fail(f"unknown target {n.attrs['target']!r}")


def _check_getitem(n: Node, fail) -> None:
    src, index = n.args[0].type, n.attrs["index"]
    if not isinstance(src, tuple) or isinstance(src, TensorType):
        fail(f"getitem of {format_type(src)}, which is not a multi-result value")
    if not isinstance(index, int) or not 0 <= index < len(src):
        fail(f"getitem index {index!r} out of range for {format_type(src)}")
    if src[index] is None:
        fail(f"getitem of element {index} of {format_type(src)}, which holds no tensor")
    if src[index] != n.type:
        fail(f"type should be {format_type(src[index])}")


def verify(graph: Graph) -> Graph:
    names = namer(graph)
    defined: set[Node] = set()
    for n in graph.inputs:
        if n.op != "input" or _bad_type(n.type):
            raise VerifyError(f"graph {graph.name}: input %{n.name} must be an 'input' node with a tensor type")
        if n in defined:
            raise VerifyError(f"graph {graph.name}: input %{n.name} is listed twice")
        defined.add(n)
    if len({n.name for n in graph.inputs}) != len(graph.inputs):
        raise VerifyError(f"graph {graph.name}: two inputs share a name")
    for lineno, n in enumerate(graph.nodes, start=2):  # line 1 of the printed text is the header
        line = format_node(n, names)

        def fail(msg):
            raise VerifyError(f"graph {graph.name}, line {lineno}: `{line}`: {msg}")
        if n in defined:
            fail("node appears twice")
        opdef = OPS.get(n.op)
        if opdef is None:
            fail(f"unknown op {n.op!r}")
        for a in n.args:
            if a not in defined:
                fail(f"operand {names.get(a, repr(a))} is used before it is defined")
        if opdef.arity is not None and len(n.args) != opdef.arity:
            fail(f"{n.op} takes {opdef.arity} operand(s), got {len(n.args)}")
        missing = [k for k in opdef.attrs if k not in n.attrs]
        if missing:
            fail(f"missing attribute(s) {', '.join(missing)}")
        if n.op != "getitem":
            for a in n.args:
                if _bad_type(a.type):
                    fail(f"operand {names[a]} has type {format_type(a.type)}; pick an element with getitem")
        if n.op == "getitem":
            _check_getitem(n, fail)
        elif n.op in ("extern", "kernel"):
            _check_result_types(n, fail)
            if n.op == "extern":
                _check_extern(n, fail)
        elif n.op == "constant":
            if _bad_type(n.type):
                fail(f"result type: {_bad_type(n.type)}")
            if graph.constants and n.attrs["name"] not in graph.constants:
                fail(f"constant {n.attrs['name']!r} has no data in graph.constants")
        else:
            try:
                want = opdef.infer(tuple(a.type for a in n.args), n.attrs)
            except (TypeError, ValueError, KeyError, IndexError) as e:
                fail(str(e))
            if want != n.type:
                fail(f"type should be {format_type(want)}")
        defined.add(n)
    for o in graph.outputs:
        if o is None:
            continue
        if o not in defined:
            raise VerifyError(f"graph {graph.name}: `return`: {names.get(o, repr(o))} is not defined in the graph")
        if _bad_type(o.type):
            raise VerifyError(f"graph {graph.name}: `return`: {names[o]} has type {format_type(o.type)}; "
                              "outputs must be tensors")
    return graph
