"""The tensor-level IR: a Graph is an ordered list of Nodes in SSA form.

One node type for every op (tinygrad's UOp, jaxpr's equation): `op` names a row of the op table
in `ops.py`, `args` are the tensor operands (other Nodes), `attrs` the static parameters, `type` the
result TensorType (a tuple of them for multi-result externs, picked apart by `getitem`).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional



class Node:
    __slots__ = ("op", "args", "attrs", "type", "name", "meta")

    def __init__(self, op: str, args: Iterable["Node"], attrs: Optional[dict] = None,
                 type: Any = None, name: Optional[str] = None, meta: Optional[dict] = None):
        self.op = op
        self.args = tuple(args)
        self.attrs = dict(attrs or {})
        self.type = type  # TensorType, or tuple[TensorType | None, ...] for multi-result nodes
        self.name = name  # set for graph inputs; others are numbered by the printer
        self.meta = meta or {}  # not printed: source line, fx node name

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.name or hex(id(self))}: {self.type})"


class Graph:
    """inputs: Nodes with op 'input'; nodes: the body in a valid (topological) order;
    outputs: Nodes or None (AOTAutograd's backward returns None for inputs without gradient).
    constants: name -> tensor for `constant` nodes (captured tensor attributes).
    sizes: symbol name -> (lo, hi, hint) for the symbolic sizes in its types (ir/sym.py; hi None:
    unbounded), printed in the header and read back; empty for a static graph.
    size_inputs: the symbols a call passes as ints (sorted; sizes no input tensor has as a dimension,
    such as a resumed frame's `n` after `x[:n.item()]`): its program takes them as `sizes=(...)`."""

    def __init__(self, name: str, inputs: list[Node], nodes: list[Node], outputs: list[Optional[Node]],
                 constants: Optional[dict] = None, sizes: Optional[dict] = None, size_inputs=()):
        self.name = name
        self.sizes = dict(sizes or {})
        self.size_inputs = list(size_inputs)
        # output position -> a size (int or Sym) the graph returns there, its output being None: a
        # training forward hands sizes to its backward; the program computes them from its inputs
        self.size_outputs: dict = {}
        self.inputs = list(inputs)
        self.nodes = list(nodes)
        self.outputs = list(outputs)
        self.constants = dict(constants or {})

    def users(self) -> dict[Node, list[Node]]:
        out: dict[Node, list[Node]] = {n: [] for n in self.inputs + self.nodes}
        for n in self.nodes:
            for a in n.args:
                out[a].append(n)
        return out

    def replace_uses(self, mapping: dict[Node, Node]) -> None:
        """Rewrite operands and outputs through `mapping` (old node -> new node), in place."""
        if not mapping:
            return

        def get(n):
            while n in mapping:
                n = mapping[n]
            return n
        for n in self.nodes:
            n.args = tuple(get(a) for a in n.args)
        self.outputs = [None if o is None else get(o) for o in self.outputs]

    def __str__(self) -> str:
        from .printer import print_graph
        return print_graph(self)

    def __len__(self) -> int:
        return len(self.nodes)
