"""The IR text's words, shared by the graph and kernel printers and parsers: attribute values
printed (`format_value`) and read back (`read_value`, `read_attrs`), the tokenizer, and ParseError."""
from __future__ import annotations

import json
import math
import re

import torch

from . import sym, sym_read, sym_values
from .ops import OpArg, Ref
from .types import DTYPES


def format_value(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)
    if isinstance(v, complex):  # a complex scalar operand: x * (1+2j)
        return f"complex({format_value(v.real)}, {format_value(v.imag)})"
    if isinstance(v, str):
        return v if v in DTYPES else json.dumps(v)  # dtype names print bare: cast [dtype=f16]
    if isinstance(v, (Ref, OpArg)):
        return repr(v)
    if isinstance(v, sym.Sym):
        return f'size("{v}")'  # a symbolic size in an attribute: view [shape=(size("4*s0"), 768)]
    if isinstance(v, sym_values.SizeFloat):  # a float of sizes: n / (n - 1) is sizef("/", size("s0"), size("s0-1"))
        return f'sizef("{v.op}", {format_value(v.a)}, {format_value(v.b)})'
    if isinstance(v, (torch.dtype, torch.layout, torch.memory_format)):
        return str(v)  # torch.float32, torch.strided, torch.contiguous_format
    if isinstance(v, tuple):
        inner = ", ".join(format_value(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {format_value(x)}" for k, x in sorted(v.items())) + "}"
    raise TypeError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<arrow>->)
  | (?P<var>%[A-Za-z0-9_.]+)
  | (?P<ref>\$\d+)
  | (?P<num>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+|inf(?![A-Za-z0-9_])))
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[()\[\]{},:=])
  | (?P<op>//|[-+*%])
  | (?P<bad>.)
""", re.VERBOSE)


class ParseError(ValueError):
    pass


def tokens(line: str, lineno: int):
    found = [m for m in _TOKEN.finditer(line) if m.lastgroup != "ws"]
    for m in found:
        if m.lastgroup == "bad":
            raise ParseError(f"line {lineno}: cannot read {line[m.start():m.start() + 20]!r}")
    return [(m.lastgroup, m.group()) for m in found]


class Cursor:
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


def read_value(c: Cursor):
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
        if val == "complex" and c.peek()[1] == "(":
            c.next()
            re_ = read_value(c)
            c.expect(",")
            im = read_value(c)
            c.expect(")")
            return complex(re_, im)
        if val == "op" and c.peek()[1] == "(":
            c.next()
            target = json.loads(c.next()[1])
            c.expect(")")
            return OpArg(target)
        if val == "size" and c.peek()[1] == "(":
            c.next()
            kind, text = c.next()
            c.expect(")")
            return sym_read.parse(json.loads(text))
        if val == "sizef" and c.peek()[1] == "(":
            c.next()
            op = json.loads(c.next()[1])
            c.expect(",")
            a = read_value(c)
            c.expect(",")
            b = read_value(c)
            c.expect(")")
            return sym_values.SizeFloat(op, a, b)
        return val  # bare word: a dtype name such as f32
    if val in ("(", "["):
        close = ")" if val == "(" else "]"
        items = _read_items(c, close, read_value)
        return tuple(items) if close == ")" else items
    if val == "{":
        return dict(_read_items(c, "}", lambda c: _pair(c, read_value(c), ":")))
    raise ParseError(f"line {c.lineno}: unexpected {val!r}")


def _pair(c: Cursor, key, sep: str) -> tuple:
    c.expect(sep)
    return key, read_value(c)


def _read_items(c: Cursor, close: str, item) -> list:
    """Comma-separated `item(c)`s up to `close` (a trailing comma allowed), the close consumed."""
    items = []
    while c.peek()[1] != close:
        items.append(item(c))
        if c.peek()[1] == ",":
            c.next()
        elif c.peek()[1] != close:
            raise ParseError(f"line {c.lineno}: expected ',' or {close!r}, found {c.peek()[1]!r}")
    c.next()
    return items


def read_attrs(c: Cursor) -> dict:
    if c.peek()[1] != "[":
        return {}
    c.next()
    return dict(_read_items(c, "]", lambda c: _pair(c, c.next()[1], "=")))
