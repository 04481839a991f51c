"""Tensor types of the IR: a shape and a short dtype name (`f32[64,1024]`, `b8[]`).

The IR never carries strides: a value is a logical tensor. Layout is a backend decision.
A dimension is an int or a symbolic size (ir/sym.py): `f32[s0,768]` is one type for every s0.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import sym, sym_read

# short name -> torch dtype; the order is the printer's and parser's vocabulary
DTYPES: dict[str, torch.dtype] = {
    "f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
    "b8": torch.bool, "c64": torch.complex64, "c128": torch.complex128,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
FLOATS = ("f64", "f32", "f16", "bf16")
INTS = ("i64", "i32", "i16", "i8", "u8")
UNSIGNED = ("u8", "b8")  # compared, divided and widened as unsigned numbers
LOW_FLOATS = ("f16", "bf16")  # computed in f32 registers, rounded back whenever an op produces them


def dtype_name(dt: torch.dtype) -> str:
    if dt not in DTYPE_NAMES:
        raise TypeError(f"minicomp: dtype {dt} is not supported by the IR")
    return DTYPE_NAMES[dt]


def itemsize(dtype: str) -> int:
    return DTYPES[dtype].itemsize


class TensorType(NamedTuple):
    shape: tuple[int, ...]
    dtype: str

    @staticmethod
    def of(t: torch.Tensor) -> "TensorType":
        return TensorType(tuple(dim(s) for s in t.shape), dtype_name(t.dtype))

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n = s * n
        return n

    @property
    def symbolic(self) -> bool:
        return any(isinstance(s, sym.Sym) for s in self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def dim(s):
    """One dimension of a (fake) tensor's shape: an int, or a symbolic size for Dynamo's SymInt (read
    from its expression, never by asking the SymInt for an int, which would specialize it)."""
    if isinstance(s, torch.SymInt):
        expr = s.node.expr
        return int(expr) if expr.is_number else sym_read.from_sympy(expr)
    return int(s)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting; raises ValueError naming the shapes when they don't broadcast."""
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        dims = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)
