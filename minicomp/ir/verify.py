"""Check a Graph's invariants; run after every pass in tests and in debug mode.

Guarantees on success: every operand is defined before use, every op is in the table with the
right arity and attributes (each of the kind its name means), every size a node uses is bound by
the inputs, every node's type is what the op table's rule infers, tuple-typed values (multi-result
externs and kernels) are read only through in-range `getitem`s, every extern's `$i` slots name one
of its operands and its result types are what its target gives (run on meta tensors, where it
can), and every kernel node's body is well formed (kernel_verify.py). An error names the offending
node as printed, and its line number in the printed text, so it can be found in a dump file.
`round_trip` checks that the text reads back.
"""
from __future__ import annotations

import functools

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import sym
from .graph import Graph, Node
from .ops import OPS, OpArg, Ref, resolve_target
from .kernel import KernelPrinter, buffer_sources
from .kernel_verify import KernelChecker
from .parser import ParseError, parse
from .printer import format_node, format_type, namer, node_lines, print_graph
from .sym_values import SizeBool, SizeFloat
from .text import format_value
from .types import DTYPES, TensorType


class VerifyError(ValueError):
    pass


def _bad_type(t) -> str | None:
    """Why `t` is not a well-formed tensor type, or None."""
    if not isinstance(t, TensorType):
        return f"{format_type(t)} is not a tensor type"
    if t.dtype not in DTYPES:
        return f"unknown dtype {t.dtype!r}"
    # a symbolic size is refused only when surely negative: what the ranges cannot settle (T - 1 after
    # x[:, 1:], true under the guard 1 <= T the slice was decided by) is no fault
    if any(not isinstance(s, (int, sym.Sym)) or isinstance(s, bool) or sym.known(s, "<", 0) for s in t.shape):
        return f"bad shape {t.shape}"
    return None


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _size(v) -> bool:
    return _int(v) or isinstance(v, sym.Sym)


def _number(v) -> bool:  # a scalar operand: an iota's start, a fill value (a float of sizes too)
    return not isinstance(v, bool) and isinstance(v, (int, float, complex, sym.Sym, SizeFloat))


def _seq(item):
    return lambda v: isinstance(v, (tuple, list)) and all(item(x) for x in v)


# what each attribute of the op table's rows holds, by name (one meaning per name across ops)
_ATTR_KINDS = {
    "approximate": ('"none" or "tanh"', lambda v: v in ("none", "tanh")),
    "dtype": ("a dtype", lambda v: isinstance(v, str) and v in DTYPES),
    "dims": ("a tuple of dims", _seq(_int)),
    "keepdim": ("true or false", lambda v: isinstance(v, bool)),
    "dim": ("a dim", _int),
    "shape": ("a tuple of sizes", _seq(_size)),
    "start": ("a number or size", _number),
    "end": ("a size", _size),
    "step": ("a number or size", _number),
    "value": ("a number, size or bool", lambda v: _number(v) or isinstance(v, (bool, SizeBool))),
    "name": ("a string", lambda v: isinstance(v, str)),
    "stride": ("a tuple of sizes >= 1", _seq(lambda v: _size(v) and not sym.known(v, "<", 1))),
    "padding": ("a tuple of sizes", _seq(lambda v: _size(v) and not sym.known(v, "<", 0))),
    "dilation": ("a tuple of sizes >= 1", _seq(lambda v: _size(v) and not sym.known(v, "<", 1))),
    "output_padding": ("a tuple of sizes", _seq(lambda v: _size(v) and not sym.known(v, "<", 0))),
    "groups": ("an int >= 1", lambda v: _int(v) and v >= 1),
    "transposed": ("true or false", lambda v: isinstance(v, bool)),
    "output_mask": ("three of true or false", lambda v: _seq(lambda x: isinstance(x, bool))(v) and len(v) == 3),
    "target": ("an operator name", lambda v: isinstance(v, str)),
    "args": ("a list of arguments", lambda v: isinstance(v, (tuple, list))),
    "index": ("an int", _int),
}


def _symbols(values) -> set:
    """The size symbols in `values` (ints and sizes; anything else is skipped)."""
    return set().union(*(sym.free_symbols(v) for v in values if isinstance(v, sym.Sym)))


def _check_attrs(n: Node, opdef, fail) -> None:
    """Each attribute the op's row names holds what that name means (`keepdim=tue` reads as a word)."""
    for k in opdef.attrs:
        kind = _ATTR_KINDS.get(k)
        if kind is not None and not kind[1](n.attrs[k]):
            fail(f"attribute {k}={format_value(n.attrs[k])} is not {kind[0]}")


def _leaves(value, out: list) -> list:
    """Every value in an extern's args/kwargs template, its lists, tuples and dicts walked."""
    if isinstance(value, (list, tuple)):
        for v in value:
            _leaves(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _leaves(v, out)
    else:
        out.append(value)
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
    leaves = _leaves((n.attrs["args"], n.attrs.get("kwargs", {})), [])
    slots = [v.index for v in leaves if isinstance(v, Ref)]
    if any(not 0 <= i < len(n.args) for i in slots):
        fail(f"argument slots {sorted(set(slots))} do not match its {len(n.args)} operand(s)")
    for target in [n.attrs["target"]] + [v.target for v in leaves if isinstance(v, OpArg)]:  # operators it passes
        try:
            resolve_target(target)
        except (AttributeError, RuntimeError):
            fail(f"unknown target {target!r}")
    _check_extern_types(n, fail)


def _static(t) -> bool:
    return not isinstance(t, TensorType) or all(isinstance(s, int) for s in t.shape)


def _check_extern_types(n: Node, fail) -> None:
    """An extern's result types against what its target gives on meta tensors of its operands'
    types: a pass that changed an operand without its extern (torch's kernels trust their operands,
    and one fed a larger operand writes past its result). Not judged: symbolic types, higher-order
    targets, and targets that do not run on meta tensors (they need values: item(), nonzero)."""
    want = n.type if isinstance(n.type, tuple) and not isinstance(n.type, TensorType) else (n.type,)
    if n.attrs["target"].startswith("higher_order.") or not all(_static(t) for t in [a.type for a in n.args] + list(want)):
        return
    try:
        with torch.no_grad(), unset_fake_temporarily():  # plain meta tensors, inside a compile's fake mode too
            metas = [torch.empty(a.type.shape, dtype=DTYPES[a.type.dtype], device="meta") for a in n.args]
            got = OPS["extern"].ref(metas, n.attrs, "meta")
    except Exception:  # noqa: BLE001 -- any failure to run on meta leaves the extern unjudged
        return
    got = got if isinstance(got, (tuple, list)) else (got,)
    for i, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, TensorType) and isinstance(g, torch.Tensor) and g.device.type == "meta":
            if (tuple(g.shape), g.dtype) != (w.shape, DTYPES[w.dtype]):
                at = f"result {i}" if len(want) > 1 else "its result"
                fail(f"{at} is typed {format_type(w)}, but {n.attrs['target']} gives "
                     f"{format_type(TensorType.of(g))} for these operands")


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


def _lineno(graph: Graph, names: dict, pos: int) -> int:
    """The line of graph.nodes[pos] in the printed text (the header is line 1; kernels span several)."""
    return 2 + sum(len(node_lines(m, names)) for m in graph.nodes[:pos])


def _kernel_fail(graph: Graph, names: dict, pos: int):
    """fail(msg, obj) for a kernel's body: names the kernel and quotes obj's line as printed."""
    n = graph.nodes[pos]

    def fail(msg, obj=None):
        start, at = _lineno(graph, names, pos), ""
        try:
            p = KernelPrinter(n.meta["kernel"])
            body = p.body(buffer_sources(n, names))
            if id(obj) in p.where:
                at = f"`{body[p.where[id(obj)]].strip()}`: "
                start += 1 + p.where[id(obj)]
        except Exception:  # a body too broken to print: name the kernel's own line
            pass
        raise VerifyError(f"graph {graph.name}, line {start}: kernel {n.attrs.get('name')}: {at}{msg}")
    return fail


def round_trip(graph: Graph) -> Graph:
    """Check that the graph's text parses back to a graph that prints the same (kernel bodies too):
    what the dump files, pass tests and the graph cache rely on. Raises VerifyError at the first
    line that differs."""
    text = print_graph(graph)
    error, again = _read_back(text)
    if error:
        raise VerifyError(f"graph {graph.name}: its text does not parse back: {error}")
    if again != text:
        a, b = text.splitlines(), again.splitlines()
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise VerifyError(f"graph {graph.name}, line {i + 1}: printed `{a[i] if i < len(a) else ''}` "
                          f"but reads back as `{b[i] if i < len(b) else ''}`")
    return graph


@functools.lru_cache(maxsize=16)
def _read_back(text: str):
    """(parse error or None, the text of parse(text)): cached, since a pass that changes nothing
    (most do, on most graphs) hands the driver a text it has just read back."""
    try:
        return None, print_graph(parse(text))
    except ParseError as e:
        return str(e), None


def verify(graph: Graph) -> Graph:
    if graph.sizes and sym.current() is sym.current_default():  # a graph read from text: its own sizes
        with sym.using(sym.env_for(graph.sizes)):
            return _verify(graph)
    return _verify(graph)


def _verify(graph: Graph) -> Graph:
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
    bound = set(graph.size_inputs).union(*(_symbols(n.type.shape) for n in graph.inputs))
    if graph.sizes and bound - set(graph.sizes):
        raise VerifyError(f"graph {graph.name}: size {', '.join(sorted(bound - set(graph.sizes)))} of its inputs "
                          "is not in its sizes")
    for pos, n in enumerate(graph.nodes):
        line = format_node(n, names)

        def fail(msg):
            raise VerifyError(f"graph {graph.name}, line {_lineno(graph, names, pos)}: `{line}`: {msg}")
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
        _check_attrs(n, opdef, fail)
        types = n.type if isinstance(n.type, tuple) and not isinstance(n.type, TensorType) else (n.type,)
        unbound = _symbols([d for t in types if isinstance(t, TensorType) for d in t.shape]
                           + _leaves(list(n.attrs.values()), [])) - bound
        if unbound:
            fail(f"size {', '.join(sorted(unbound))} is neither a dimension of an input nor a size input")
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
            else:
                KernelChecker(n, _kernel_fail(graph, names, pos)).run()
        elif n.op == "constant":
            if _bad_type(n.type):
                fail(f"result type: {_bad_type(n.type)}")
            if graph.constants and n.attrs["name"] not in graph.constants:
                fail(f"constant {n.attrs['name']!r} has no data in graph.constants")
        else:
            try:
                want = opdef.infer(tuple(a.type for a in n.args), n.attrs)
            except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as e:  # RuntimeError: conv's meta
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
