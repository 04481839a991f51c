"""Read the printer's text back into a Graph (the round trip that makes pass tests 'text in, text out').

Types written on each line are taken as given (run `verify` on the result to check them); the
header's output types must match the return line's values. A kernel node's body, in braces under
it, is read by kernel_parse.py into the node's meta (the Kernel and its io map). Errors name the line.
"""
from __future__ import annotations

import re

from . import sym_read
from .graph import Graph, Node
from .kernel_parse import parse_kernel, resolve_outputs
from .text import Cursor, ParseError, read_attrs, tokens
from .types import DTYPES, TensorType

__all__ = ["ParseError", "parse"]


def _type(c: Cursor):
    kind, val = c.next()
    if val == "None":
        return None
    if val == "(":
        items = []
        while c.peek()[1] != ")":
            items.append(_type(c))
            if c.peek()[1] == ",":
                c.next()
        c.next()
        return tuple(items)
    if kind != "name" or val not in DTYPES:
        raise ParseError(f"line {c.lineno}: expected a type such as f32[4], found {val!r}")
    c.expect("[")
    dims, text, depth = [], "", 0
    while depth or c.peek()[1] != "]":  # a dimension: an int or a symbolic size such as 768*s0+1
        kind, tok = c.next()
        if tok is None:
            raise ParseError(f"line {c.lineno}: a type's dimensions have no closing ]")
        if tok == "," and not depth:
            dims.append(sym_read.parse(text))
            text = ""
            continue
        depth += (tok == "(") - (tok == ")")
        text += tok
    if text:
        dims.append(sym_read.parse(text))
    c.next()
    return TensorType(tuple(dims), val)


_SIZES = re.compile(r"([A-Za-z_][A-Za-z0-9_]*) in (\d+)\.\.(\d*) hint (\d+)( given)?$")


def _sizes(lineno: int, ln: str) -> dict:
    """`sizes s0 in 2..1024 hint 128, s1 in 2.. hint 7` -> {name: (lo, hi, hint)}."""
    out = {}
    for part in ln[len("sizes "):].split(","):
        m = _SIZES.match(part.strip())
        if m is None:
            raise ParseError(f"line {lineno}: cannot read the size {part.strip()!r} (want `s0 in 2..1024 hint 128`)")
        out[m.group(1)] = (int(m.group(2)), int(m.group(3)) if m.group(3) else None, int(m.group(4)), bool(m.group(5)))
    return out


# the common line, `%3: f32[4,8] = add %1 %2 [...]`, read without tokenizing all of it
_SIMPLE = re.compile(r"(%[A-Za-z0-9_.]+): ([a-z0-9]+)\[([0-9,]*)\] = ([A-Za-z_][A-Za-z0-9_]*)((?: %[A-Za-z0-9_.]+)*)( \[.*)?$")


def _simple_line(lineno: int, m, env: dict):
    var, dtype, dims, op, args, rest = m.groups()
    if var in env:
        raise ParseError(f"line {lineno}: {var} is defined twice")
    operands = []
    for a in args.split():
        if a not in env:
            raise ParseError(f"line {lineno}: {var} = {op} uses {a} before it is defined")
        operands.append(env[a])
    attrs = {}
    if rest:
        c = Cursor(tokens(rest, lineno), lineno)
        attrs = read_attrs(c)
        if not c.done():
            raise ParseError(f"line {lineno}: trailing text {c.peek()[1]!r}")
    typ = TensorType(tuple(int(d) for d in dims.split(",")) if dims else (), dtype)
    return "node", var, Node(op, operands, attrs, typ)


def _line(lineno: int, ln: str, env: dict):
    """One body line: returns ('return', outputs) or ('node', var, Node)."""
    m = _SIMPLE.match(ln)
    if m and m.group(2) in DTYPES:
        return _simple_line(lineno, m, env)
    c = Cursor(tokens(ln, lineno), lineno)
    if c.peek()[1] == "return":
        c.next()
        outputs = []
        while not c.done():
            kind, val = c.next()
            if val == ",":
                continue
            if val != "None" and val not in env:
                raise ParseError(f"line {lineno}: return of undefined {val}")
            outputs.append(None if val == "None" else env[val])
        return "return", outputs
    kind, var = c.next()
    if kind != "var":
        raise ParseError(f"line {lineno}: expected `%name: type = op ...`, found {var!r}")
    if var in env:
        raise ParseError(f"line {lineno}: {var} is defined twice")
    c.expect(":")
    typ = _type(c)
    c.expect("=")
    op = c.next()[1]
    args = []
    while c.peek()[0] == "var":
        a = c.next()[1]
        if a not in env:
            raise ParseError(f"line {lineno}: {var} = {op} uses {a} before it is defined")
        args.append(env[a])
    attrs = read_attrs(c)
    if not c.done():
        raise ParseError(f"line {lineno}: trailing text {c.peek()[1]!r}")
    return "node", var, Node(op, args, attrs, typ)


def _header(lineno: int, head: str):
    """`graph name(%x: f32[4], ...) -> (f32[4], None) {` -> name, {var: input Node}, declared output types."""
    c = Cursor(tokens(head, lineno), lineno)
    c.expect("graph")
    name = c.next()[1]
    c.expect("(")
    env = {}
    while c.peek()[1] != ")":
        var = c.next()[1]
        if not isinstance(var, str) or not var.startswith("%") or var in env:
            raise ParseError(f"line {lineno}: bad or repeated input name {var!r}")
        c.expect(":")
        env[var] = Node("input", (), type=_type(c), name=var[1:])
        if c.peek()[1] == ",":
            c.next()
    c.next()
    c.expect("->")
    out_types = _type(c)
    c.expect("{")
    return name, env, out_types


def _guarded(lineno: int, fn, *args):
    """Run one line's parse; a malformed line raises ParseError naming it, never an IndexError."""
    try:
        return fn(lineno, *args)
    except ParseError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ParseError(f"line {lineno}: cannot read {args[0]!r} ({e})") from None


def _kernel_error(lineno, msg):
    raise ParseError(f"line {lineno}: {msg}")


def _kernel(lineno: int, node: Node, body: list, env: dict) -> None:
    """A kernel node's body (the lines between its braces) into node.meta['kernel'] and ['io']."""
    if node.op != "kernel":
        raise ParseError(f"line {lineno}: only a kernel node has a body in braces")
    try:
        node.meta["kernel"], node.meta["io"] = parse_kernel(body, node, env, _kernel_error)
    except ParseError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ParseError(f"line {lineno}: cannot read the body of kernel {node.attrs.get('name')!r} ({e})") from None


def parse(text: str) -> Graph:
    lines = [(i + 1, ln.strip()) for i, ln in enumerate(text.splitlines())
             if ln.strip() and not ln.strip().startswith("#")]
    if not lines:
        raise ParseError("empty text")
    lineno, head = lines[0]
    name, env, out_types = _guarded(lineno, _header, head)
    inputs = list(env.values())
    nodes, outputs, sizes = [], None, {}
    pos = 1
    if pos < len(lines) and lines[pos][1].startswith("sizes "):
        sizes = _sizes(*lines[pos])
        pos += 1
    given = sorted(s for s, v in sizes.items() if v[3])
    sizes = {s: v[:3] for s, v in sizes.items()}
    while pos < len(lines):
        lineno, ln = lines[pos]
        pos += 1
        if ln == "}":
            break
        if outputs is not None:
            raise ParseError(f"line {lineno}: text after the return line")
        body = None
        if ln.endswith("{"):  # a kernel and its body, up to the closing brace
            ln, body = ln[:-1].rstrip(), []
            while pos < len(lines) and lines[pos][1] != "}" and not lines[pos][1].startswith(("%", "return")):
                body.append(lines[pos])
                pos += 1
            if pos == len(lines) or lines[pos][1] != "}":
                raise ParseError(f"line {lineno}: the kernel's body has no closing brace")
            pos += 1
        parsed = _guarded(lineno, _line, ln, env)
        if parsed[0] == "return":
            outputs = parsed[1]
            continue
        _, var, node = parsed
        if body is not None:
            _kernel(lineno, node, body, env)
        env[var] = node
        nodes.append(node)
    resolve_outputs(nodes)
    if outputs is None:
        raise ParseError("graph has no return line")
    got = tuple(None if o is None else o.type for o in outputs)
    if got != out_types:
        raise ParseError(f"line {lines[0][0]}: header declares outputs ({', '.join(map(str, out_types))}) "
                         f"but the return line gives ({', '.join(map(str, got))})")
    return Graph(name, inputs, nodes, outputs, sizes=sizes, size_inputs=given)
