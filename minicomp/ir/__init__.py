"""minicomp's tensor IR: types, graph, op table, printer/parser, verifier and reference interpreter."""
from .graph import Graph, Node
from .interpret import interpret, prepare
from .ops import OPS, OpArg, OpDef, Ref
from .parser import ParseError, parse
from .printer import print_graph
from .types import DTYPES, TensorType, dtype_name
from .verify import VerifyError, round_trip, verify

__all__ = ["Graph", "Node", "OPS", "OpArg", "OpDef", "Ref", "TensorType", "DTYPES", "dtype_name", "interpret",
           "prepare", "parse", "print_graph", "round_trip", "verify", "ParseError", "VerifyError"]
