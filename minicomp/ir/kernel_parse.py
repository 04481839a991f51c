"""Read a kernel body (the format kernel.py prints) back into a Kernel and its node's io map.

The parser checks only what it needs to build the objects: names are defined once and before use
(values `tN` and reductions `rN` by the text's own names; buffers numbered in order, as loads name
them by position), index expressions name the kernel's loop variables, each buffer holds an operand
of the node or one of its results. What a well-formed kernel must also satisfy (dtypes, ranges,
stages) is the verifier's (kernel_verify.py). Errors are ParseErrors naming the line.
"""
from __future__ import annotations

import json
import re

from . import sym_read
from .index import Expr, Var, _Op
from .kernel import Buffer, Kernel, KExpr, Reduction, Store
from .text import Cursor, read_attrs, read_value, tokens
from .types import DTYPES, itemsize

_EXPR_TOKEN = re.compile(r"-?\d+|\{[^{}]*\}|//|[A-Za-z_][A-Za-z0-9_]*|[()*+%]|\S")
_EXPR_WORD = re.compile(r"-?\d+|\{[^{}]*\}|//|[A-Za-z_][A-Za-z0-9_]*|[()*+%]")
_NAME_ATTR = re.compile(r' \[name=("(?:[^"\\]|\\.)*")\]$')
_VALUE = re.compile(r"(t\d+): (\w+) = (\w+)(.*)$")
_REDUCTION = re.compile(r"(r\d+): (\w+) = (\w+) (t\d+)$")
_STORE = re.compile(r"b(\d+)\[([^\]]*)\] = (t\d+)$")
_BUFFER = re.compile(r"b(\d+): (\w+)\[([^\]]+)\] = (out (\d+)|\$(\d+)|%\S+)( \[.*\])$")
_LOAD = re.compile(r" b(\d+)\[([^\]]*)\](.*)$")
_DOMAIN = re.compile(r"domain \((.*?)\)(?: x \[(.*)\])?$")


def _num(tok: str):
    """An int, or a size expression in braces ({768*s0})."""
    return sym_read.parse(tok[1:-1]) if tok.startswith("{") else int(tok)


class _Body:
    def __init__(self, node, env: dict, error):
        self.node, self.env, self.error = node, env, error
        self.vars: dict = {}
        self.values: dict = {}
        self.reductions: dict = {}

    # -- index expressions -------------------------------------------------------------------------
    def expr(self, text: str) -> Expr:
        toks = _EXPR_TOKEN.findall(text)
        bad = next((t for t in toks if not _EXPR_WORD.fullmatch(t)), None)
        if bad is not None:
            self.error(f"cannot read {bad!r} in the index expression {text!r}")
        self.toks, self.pos = toks, 0
        e = self._sum()
        if self.pos != len(toks):
            self.error(f"trailing {toks[self.pos]!r} in the index expression {text!r}")
        return e

    def _next(self):
        if self.pos >= len(self.toks):
            self.error("index expression ends early")
        self.pos += 1
        return self.toks[self.pos - 1]

    def _expect(self, tok):
        got = self._next()
        if got != tok:
            self.error(f"expected {tok!r} in an index expression, found {got!r}")

    def _sum(self) -> Expr:
        const, terms = 0, []
        while True:
            tok = self.toks[self.pos] if self.pos < len(self.toks) else None
            if tok is not None and (re.fullmatch(r"-?\d+", tok) or tok.startswith("{")):
                self.pos += 1
                if self.pos < len(self.toks) and self.toks[self.pos] == "*":
                    self.pos += 1
                    terms.append((self._atom(), _num(tok)))
                else:
                    const = const + _num(tok)
            else:
                terms.append((self._atom(), 1))
            if self.pos < len(self.toks) and self.toks[self.pos] == "+":
                self.pos += 1
                continue
            return Expr(const, tuple(terms))

    def _atom(self):
        tok = self._next()
        if tok == "data":
            self._expect("(")
            name = self._next()
            self._expect(")")
            return _Op("data", None, self.value(name))
        if tok == "(":
            self._expect("(")
            inner = self._sum()
            self._expect(")")
            kind = {"//": "div", "%": "mod"}.get(self._next())
            c = self._next()
            self._expect(")")
            if kind is None or not (re.fullmatch(r"\d+", c) or c.startswith("{")):
                self.error("expected `((expr) // c)` or `((expr) % c)` in an index expression")
            return _Op(kind, inner, _num(c))
        if tok not in self.vars:
            self.error(f"index expression uses {tok!r}, which is not one of the kernel's loop variables")
        return self.vars[tok]

    # -- values ------------------------------------------------------------------------------------
    def value(self, name: str) -> KExpr:
        if name not in self.values:
            self.error(f"{name} is used before it is defined")
        return self.values[name]

    def attrs(self, text: str) -> dict:
        c = Cursor(tokens(text, self.lineno), self.lineno)
        out = read_attrs(c)
        if not c.done():
            self.error(f"trailing text {c.peek()[1]!r}")
        if isinstance(out.get("guard"), str):
            out["guard"] = self.value(out["guard"])
        return out

    def define(self, name: str, obj, table: dict) -> None:
        """Names are the text's own (the printer numbers them in order; a hand edit need not)."""
        if name in table:
            self.error(f"{name} is defined twice")
        table[name] = obj

    def kexpr(self, m) -> None:
        name, dtype, op, rest = m.groups()
        attrs: dict = {}
        if op == "load":
            lm = _LOAD.match(rest)
            if not lm:
                self.error("expected `load bN[index]`")
            attrs = {"buf": int(lm.group(1)), "index": self.expr(lm.group(2))}
            rest = lm.group(3)
        elif op == "const":
            head, _, rest = rest.strip().partition(" [")
            rest = " [" + rest if rest else ""
            attrs["value"] = read_value(Cursor(tokens(head, self.lineno), self.lineno))
        elif op == "index":
            head, _, rest = rest.partition(" [")
            rest = " [" + rest if rest else ""
            attrs["expr"] = self.expr(head)
        elif op == "acc":
            red, _, rest = rest.strip().partition(" ")
            rest = " " + rest
            if red not in self.reductions:
                self.error(f"acc of {red!r}, which is no reduction defined before it")
            attrs["red"] = self.reductions[red]
        head, bracket, tail = rest.partition(" [")
        args = tuple(self.value(a) for a in head.split())
        if bracket:
            attrs.update(self.attrs("[" + tail))
        self.define(name, KExpr(op, args, attrs, dtype), self.values)


def parse_kernel(body: list, node, env: dict, error) -> tuple[Kernel, list]:
    """body: [(lineno, stripped line)] between the braces; node: the kernel node (args, attrs, type);
    env: graph names -> nodes; error(lineno, msg) raises. Returns (Kernel, io)."""
    p = _Body(node, env, None)
    k = Kernel(node.attrs.get("name", "?"), (), (), [])
    io: list = []
    section = None
    for lineno, ln in body:
        p.lineno = lineno
        p.error = lambda msg, lineno=lineno: error(lineno, msg)
        if ln.startswith("domain ") and section is None:
            m = _DOMAIN.match(ln)
            if not m:
                p.error("expected `domain (i0: 8, ...) x [i1: 16, ...]`")
            loops = []
            for part in (m.group(1), m.group(2) or ""):
                vs = []
                for item in filter(None, (s.strip() for s in part.split(","))):
                    vname, _, size = item.partition(":")
                    try:
                        extent = sym_read.parse(size)
                    except ValueError:
                        extent = None
                    if vname in p.vars or extent is None:
                        p.error(f"bad or repeated loop variable {item!r}")
                    p.vars[vname] = Var(vname, extent)
                    vs.append(p.vars[vname])
                loops.append(tuple(vs))
            k.outer, k.inner = loops
        elif ln.startswith("flops ") and section is None:
            k.flops = sym_read.parse(ln.split()[1])
        elif ln.startswith("b") and section is None:
            m = _BUFFER.match(ln)
            if not m or int(m.group(1)) != len(k.buffers):
                p.error(f"expected buffer b{len(k.buffers)}: `b{len(k.buffers)}: f32[N] = %x | $j | out j [name=...]`")
            src = m.group(4)
            if m.group(5) is not None:
                io.append(("out", int(m.group(5))))
                holder = None
            else:
                j = int(m.group(6)) if m.group(6) is not None else (
                    node.args.index(env[src]) if src in env and env[src] in node.args else None)
                if j is None or not 0 <= j < len(node.args):
                    p.error(f"buffer {src} is not an operand of the kernel")
                io.append(("arg", j))
                holder = node.args[j]
            fast = _NAME_ATTR.match(m.group(7))
            name = json.loads(fast.group(1)) if fast else p.attrs(m.group(7)).get("name")
            k.buffers.append(Buffer(name, m.group(2), sym_read.parse(m.group(3)), holder))
        elif re.fullmatch(r"stage \d+:", ln):
            if int(ln[6:-1]) != len(k.stages):
                p.error(f"expected stage {len(k.stages)}")
            k.stages.append([])
            section = "stage"
        elif ln in ("inner stores:", "outer stores:"):
            section = ln.split()[0]
        elif section is None:
            p.error("expected domain, flops, a buffer or a section (`stage 0:`, `inner stores:`, `outer stores:`)")
        elif m := _VALUE.match(ln):
            p.kexpr(m)
        elif m := _REDUCTION.match(ln):
            if section != "stage":
                p.error("a reduction outside a stage")
            r = Reduction(m.group(3), p.value(m.group(4)), m.group(2), len(k.stages) - 1)
            p.define(m.group(1), r, p.reductions)
            k.stages[-1].append(r)
        elif m := _STORE.match(ln):
            if section == "stage":
                p.error("a store inside a stage")
            st = Store(int(m.group(1)), p.expr(m.group(2)), p.value(m.group(3)))
            (k.inner_stores if section == "inner" else k.outer_stores).append(st)
        else:
            p.error("expected `tN: dtype = op ...`, `rN: dtype = op tN` or `bN[index] = tN`")
    _derive(k, node)
    return k, io


def _derive(k: Kernel, node) -> None:
    """The fields fuse.py derives from the rest: fused ops, read/written buffers and their bytes."""
    fused = node.attrs.get("fused", "")
    k.ops = fused.split() if isinstance(fused, str) else []
    written = {s.buf for s in k.inner_stores + k.outer_stores}
    for i, b in enumerate(k.buffers):
        nbytes = b.numel * itemsize(b.dtype) if b.dtype in DTYPES else 0
        if i in written:
            k.writes.append(i)
            k.bytes_written += nbytes
        else:
            k.reads.append(i)
            k.bytes_read += nbytes
    k.comment = f"{' '.join(k.ops)} over {k.domain_str()}"


def resolve_outputs(nodes: list) -> None:
    """Point each written buffer at the getitem that picks its result (Buffer.node: the graph value)."""
    picked = {(n.args[0], n.attrs.get("index")): n for n in nodes if n.op == "getitem" and n.args}
    for n in nodes:
        if n.op == "kernel" and "kernel" in n.meta:
            for b, (kind, j) in zip(n.meta["kernel"].buffers, n.meta["io"]):
                if kind == "out":
                    b.node = picked.get((n, j))

