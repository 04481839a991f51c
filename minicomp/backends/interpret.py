"""The `interpret` backend: the IR graph itself, op by op through the op table's torch references
(ir/interpret.py). The oracle every other backend is tested against; it generates no kernels, so
the fusion passes leave its graph alone (kernel_ops() is None)."""
from __future__ import annotations

from ..ir import prepare

FLOPS_PER_BYTE = 0.0


def kernel_ops():
    return None


def build(graph, ctx):
    return prepare(graph), {}
