"""The lowering table and the builder lowerings write IR with.

A lowering is `fn(b, *args, **kwargs)` for one ATen overload: tensor operands arrive as IR Nodes,
everything else as the Python values fx recorded; it returns a Node (or a tuple of them for
multi-result ops). `b.val` is the fx node's FakeTensor result, so a lowering knows the result's
shape and dtype without re-deriving torch's rules; `b.emit` infers and checks the IR type.
A lowering raises `Unsupported(reason)` for a case it does not cover; the op then runs as an extern.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..ir import DTYPES, OPS, Node, TensorType, dtype_name
from ..ir.sym import Sym
from ..ir.sym_values import SizeFloat
from ..ir.types import FLOATS, dim

LOWERINGS: dict[Any, Callable] = {}
aten = torch.ops.aten


class Unsupported(Exception):
    pass


def lowering(*targets):
    """Register one function for several ATen overloads (packets register all their overloads)."""
    def wrap(fn):
        for t in targets:
            if isinstance(t, torch._ops.OpOverloadPacket):
                for name in t.overloads():
                    LOWERINGS.setdefault(getattr(t, name), fn)
            else:
                LOWERINGS[t] = fn
        return fn
    return wrap


class Builder:
    def __init__(self, graph_name: str):
        self.graph_name = graph_name
        self.nodes: list[Node] = []
        self.val = None        # FakeTensor (or tuple) result of the fx node being lowered
        self.meta: dict = {}   # carried onto every node the current lowering emits

    # -- emitting ----------------------------------------------------------------------------------
    def emit(self, op: str, *args: Node, **attrs) -> Node:
        try:
            typ = OPS[op].infer(tuple(a.type for a in args), attrs)
        except (TypeError, ValueError) as e:
            raise Unsupported(f"{op}: {e}") from e
        node = Node(op, args, attrs, typ, meta=self.meta)
        self.nodes.append(node)
        return node

    def full(self, value, dtype: str, shape=()) -> Node:
        if isinstance(value, Sym):  # a size as a value (a mean's count): read at run time
            if dtype == "b8":
                raise Unsupported(f"a symbolic size {value} as a boolean")
            return self.emit("full", shape=tuple(shape), value=value, dtype=dtype)
        if dtype == "b8":
            value = bool(value)
        elif dtype not in FLOATS:
            if isinstance(value, float) and not value.is_integer():
                raise Unsupported(f"fractional value {value} for {dtype}")
            value = int(value)
        else:
            value = float(value)
        return self.emit("full", shape=tuple(shape), value=value, dtype=dtype)

    def cast(self, x: Node, dtype: str) -> Node:
        return x if x.type.dtype == dtype else self.emit("cast", x, dtype=dtype)

    def tensor(self, x, dtype: str) -> Node:
        """An operand as a Node of `dtype`: Python scalars become 0-d `full` nodes."""
        if isinstance(x, Node):
            return self.cast(x, dtype)
        if isinstance(x, (bool, int, float)):
            return self.full(x, dtype)
        raise Unsupported(f"operand {x!r} of type {type(x).__name__}")

    def reshape(self, x: Node, shape) -> Node:
        shape = tuple(size(s) for s in shape)
        return x if x.type.shape == shape else self.emit("reshape", x, shape=shape)

    def expand(self, x: Node, shape) -> Node:
        shape = tuple(shape)
        return x if x.type.shape == shape else self.emit("expand", x, shape=shape)

    # -- facts about the result being lowered ------------------------------------------------------
    @property
    def out_dtype(self) -> str:
        return dtype_name(self.val.dtype)

    @property
    def out_shape(self) -> tuple:
        return tuple(dim(s) for s in self.val.shape)


def size(s):
    """A size argument: an int, or a symbolic size (ir/sym.py), never specialized to its hint."""
    if isinstance(s, Sym):
        return s
    return dim(s)


def result_dtype(x, y) -> str:
    """torch's type promotion for two operands: IR nodes (0-d ones rank below the rest) or scalars."""
    def probe(v):
        if isinstance(v, Node):
            return torch.empty((1,) if v.type.ndim else (), dtype=DTYPES[v.type.dtype])
        if isinstance(v, Sym):  # a size as a scalar (an index a symbolic size gave): an int
            return 1
        if isinstance(v, SizeFloat):
            return 1.0
        return v
    a, b = probe(x), probe(y)
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        a = torch.tensor(a)
    return dtype_name(torch.result_type(a, b))


def norm_dim(d: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise Unsupported(f"dim {d} out of range for {ndim} dims")
    return d % n


def norm_dims(dims, ndim: int) -> tuple:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted(norm_dim(d, ndim) for d in dims)) if ndim else ()


def is_float(x: Node) -> bool:
    return x.type.dtype in FLOATS


def compute_dtype(dtype: str) -> str:
    """Math on f16/bf16 happens in f32 (as eager's kernels do), stored back at the end."""
    return "f32" if dtype in ("f16", "bf16") else dtype


__all__ = ["LOWERINGS", "Builder", "Unsupported", "lowering", "aten", "result_dtype", "norm_dim", "size",
           "norm_dims", "is_float", "compute_dtype", "TensorType"]
