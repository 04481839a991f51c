"""Read the printer's text back into a Graph (the round trip that makes pass tests 'text in, text out').

Types written on each line are taken as given (run `verify` on the result to check them); the
header's output types must match the return line's values. Errors name the line.
"""
from __future__ import annotations

import json
import re

import torch

from .graph import Graph, Node
from .ops import Ref
from .types import DTYPES, TensorType

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<arrow>->)
  | (?P<var>%[A-Za-z0-9_.]+)
  | (?P<ref>\$\d+)
  | (?P<num>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+|inf(?![A-Za-z0-9_])))
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[()\[\]{},:=])
""", re.VERBOSE)


class ParseError(ValueError):
    pass


def _tokens(line: str, lineno: int):
    pos, out = 0, []
    while pos < len(line):
        m = _TOKEN.match(line, pos)
        if not m:
            raise ParseError(f"line {lineno}: cannot read {line[pos:pos + 20]!r}")
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
        pos = m.end()
    return out


class _Cursor:
    def __init__(self, toks, lineno):
        self.toks, self.i, self.lineno = toks, 0, lineno

    def peek(self, k=0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else (None, None)

    def next(self):
        t = self.peek()
        self.i += 1
        return t

    def expect(self, text):
        kind, val = self.next()
        if val != text:
            raise ParseError(f"line {self.lineno}: expected {text!r}, found {val!r}")

    def done(self):
        return self.i >= len(self.toks)


def _type(c: _Cursor):
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
    dims = []
    while c.peek()[1] != "]":
        dims.append(int(c.next()[1]))
        if c.peek()[1] == ",":
            c.next()
    c.next()
    return TensorType(tuple(dims), val)


def _value(c: _Cursor):
    kind, val = c.next()
    if kind == "num":
        return float(val) if any(ch in val for ch in ".eEn") else int(val)
    if kind == "str":
        return json.loads(val)
    if kind == "ref":
        return Ref(int(val[1:]))
    if kind == "name":
        if val in ("true", "false"):
            return val == "true"
        if val == "none":
            return None
        if val == "nan":
            return float("nan")
        if val.startswith("torch."):
            return getattr(torch, val[len("torch."):])
        return val  # bare word: a dtype name such as f32
    if val in ("(", "["):
        close = ")" if val == "(" else "]"
        items = []
        while c.peek()[1] != close:
            items.append(_value(c))
            if c.peek()[1] == ",":
                c.next()
        c.next()
        return tuple(items) if close == ")" else items
    if val == "{":
        d = {}
        while c.peek()[1] != "}":
            k = _value(c)
            c.expect(":")
            d[k] = _value(c)
            if c.peek()[1] == ",":
                c.next()
        c.next()
        return d
    raise ParseError(f"line {c.lineno}: unexpected {val!r}")


def _attrs(c: _Cursor) -> dict:
    attrs = {}
    if c.peek()[1] != "[":
        return attrs
    c.next()
    while c.peek()[1] != "]":
        key = c.next()[1]
        c.expect("=")
        attrs[key] = _value(c)
        if c.peek()[1] == ",":
            c.next()
    c.next()
    return attrs


def _line(lineno: int, ln: str, env: dict):
    """One body line: returns ('return', outputs) or ('node', var, Node)."""
    c = _Cursor(_tokens(ln, lineno), lineno)
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
    attrs = _attrs(c)
    if not c.done():
        raise ParseError(f"line {lineno}: trailing text {c.peek()[1]!r}")
    return "node", var, Node(op, args, attrs, typ)


def _header(lineno: int, head: str):
    """`graph name(%x: f32[4], ...) -> (f32[4], None) {` -> name, {var: input Node}, declared output types."""
    c = _Cursor(_tokens(head, lineno), lineno)
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


def parse(text: str) -> Graph:
    lines = [(i + 1, ln.strip()) for i, ln in enumerate(text.splitlines())
             if ln.strip() and not ln.strip().startswith("#")]
    if not lines:
        raise ParseError("empty text")
    lineno, head = lines[0]
    name, env, out_types = _guarded(lineno, _header, head)
    inputs = list(env.values())
    nodes, outputs = [], None
    for lineno, ln in lines[1:]:
        if ln == "}":
            break
        if outputs is not None:
            raise ParseError(f"line {lineno}: text after the return line")
        parsed = _guarded(lineno, _line, ln, env)
        if parsed[0] == "return":
            outputs = parsed[1]
            continue
        _, var, node = parsed
        env[var] = node
        nodes.append(node)
    if outputs is None:
        raise ParseError("graph has no return line")
    got = tuple(None if o is None else o.type for o in outputs)
    if got != out_types:
        raise ParseError(f"line {lines[0][0]}: header declares outputs ({', '.join(map(str, out_types))}) "
                         f"but the return line gives ({', '.join(map(str, got))})")
    return Graph(name, inputs, nodes, outputs)
