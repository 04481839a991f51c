"""torch.fx (functional core ATen, from AOTAutograd) -> ir.Graph.

Walks the fx graph once. Each call_function node goes to its lowering in the table (`lowering.py`;
the lowerings live in lower_*.py by kind). The lowering's result is checked against the node's
FakeTensor; an op with no lowering, or a case a lowering declines, becomes an `extern` node that
runs the ATen op through torch: correct, and listed in the report. With strict=True it is an error
naming the op and the user's source line instead.
"""
from __future__ import annotations

import functools
import logging
import operator
import os
import re

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..errors import MinicompError, UnsupportedOpError
from ..ir import Graph, Node, OpArg, Ref, TensorType, dtype_name, sym, sym_read, sym_values
from ..ir.types import dim
# the lower_* modules fill the lowering table when imported
from . import lower_index, lower_nn, lower_pointwise, lower_pool, lower_reduce, lower_view  # noqa: F401
from .lowering import LOWERINGS, Builder, Unsupported
from .input_views import view_bases
from .output_layout import NHWC, in_eager_layout, in_nhwc, nhwc_input, nhwc_saved, permuted

log = logging.getLogger("minicomp")
# an IR value is a logical tensor (a clone before it may be gone): an extern view runs as reshape
_AS_EXTERN = {torch.ops.aten.view.default: torch.ops.aten.reshape.default,
              torch.ops.aten._unsafe_view.default: torch.ops.aten.reshape.default}


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=4096)
def _user_frame(trace: str):
    """source_line's answer from a stack trace, or None (the ops of one user line share its trace:
    asked once per line, not once per op)."""
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            parts = lines[i].split(",")
            path = parts[0][len("File "):].strip('"')
            if os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep):
                continue
            file = path.rsplit("/", 1)[-1]
            where = ",".join(parts[1:]).replace(" line ", "").strip()
            code = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{file}:{where}: {code}".strip()
    return None


def source_line(fx_node: fx.Node) -> str:
    """The user's line that produced this op, from Dynamo's stack trace: 'file.py:12 in forward: y = f(x)'.
    minicomp's own frames (the entry that calls the model) are not the user's; where nothing else
    is left (an op inside a torch.nn module compiled directly: Dynamo keeps no frames of torch's
    own code), the module it came from, from Dynamo's module stack."""
    found = _user_frame(fx_node.meta.get("stack_trace") or "")
    if found is not None:
        return found
    stack = fx_node.meta.get("nn_module_stack") or {}
    if stack:
        path, cls = list(stack.values())[-1]
        name = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else str(cls)
        where = _module_path(path)
        return f"{name} ({f'submodule {where}' if where else 'the compiled module itself'})"
    return "(source line unknown)"


def _module_path(path: str) -> str:
    """Dynamo's module path (`L['target']._modules['1']._modules['0']`) as the user writes it (`1.0`)."""
    path = re.sub(r"^L\['[^']*'\]\.?", "", path)
    return re.sub(r"_modules\['([^']*)'\]", r"\1", path)


# data checks that return nothing (one_hot's "class values must be non-negative"); like any op whose
# result no output uses they would not survive dead-code elimination, so they are dropped here
_RUNTIME_CHECKS = {torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default,
                   torch.ops.aten._assert_scalar.default, torch.ops.aten._assert_tensor_metadata.default}


_COMPARE_OPS = {operator.gt: ">", operator.ge: ">=", operator.lt: "<", operator.le: "<=", operator.eq: "==",
                operator.ne: "!="}  # SymBool comparisons of sizes
_FLOAT_OPS = {operator.truediv: "/", operator.mul: "*", operator.add: "+", operator.sub: "-"}  # SymFloat arithmetic


def _is_multi(typ) -> bool:
    """A multi-result type (a tuple of types); a TensorType is a NamedTuple, so isinstance(tuple) won't do."""
    return isinstance(typ, tuple) and not isinstance(typ, TensorType)


def _leaves(x) -> list:
    """What nested lists, tuples and dicts (an op's arguments and results) hold: pytree's general
    walk, asked twice for every op, was a third of lowering a model."""
    out, stack = [], [x]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
        else:
            out.append(x)
    return out


def _unbacked(val) -> list:
    """The data-dependent sizes in a result (an unbacked SymInt from nonzero() or .item(): no hint,
    no range to decide on); backed symbolic sizes are fine."""
    tensors = [v for v in _leaves(val) if isinstance(v, torch.Tensor)]
    return sorted({str(s) for t in tensors for s in t.shape if isinstance(s, torch.SymInt)
                   and any(f.name.startswith("u") for f in s.node.expr.free_symbols)})


def _complex(val, args, kwargs) -> bool:
    """The lowerings treat every dtype as real; complex operands or results keep the op in torch."""
    leaves = _leaves((val, args, kwargs))
    return any((isinstance(v, torch.Tensor) and v.is_complex()) or isinstance(v, complex)
               or (isinstance(v, Node) and isinstance(v.type, TensorType) and v.type.dtype in ("c64", "c128"))
               for v in leaves)


def _same_at_hints(got, want) -> bool:
    """Types (or tuples of them) that differ only in symbolic sizes which agree at the hints: two
    forms of one size that the trace's guards make equal (our ranges do not carry those guards)."""
    if isinstance(got, TensorType) and isinstance(want, TensorType):
        return (got.dtype == want.dtype and got.ndim == want.ndim
                and all(sym.hint(a) == sym.hint(b) for a, b in zip(got.shape, want.shape)))
    if isinstance(got, tuple) and isinstance(want, tuple):  # a multi-output op's (TensorType is a tuple too)
        return len(got) == len(want) and all(w is None or _same_at_hints(g, w) for g, w in zip(got, want))
    return False


def _type_of(val):
    if isinstance(val, torch.Tensor):
        return TensorType.of(val)
    if isinstance(val, (tuple, list)):
        return tuple(_type_of(v) if isinstance(v, (torch.Tensor, tuple, list)) else None for v in val)
    return None


def _target_name(op) -> str:
    """How ir.ops.resolve_target finds `op` under torch.ops: "aten.cumsum.default", and a
    higher-order op under its namespace ("higher_order.with_effects")."""
    if isinstance(op, torch._ops.HigherOrderOperator):
        return f"{op.namespace}.{op.name()}"
    return str(op)


def _extern_value(v, refs: list):
    """Turn one fx argument into an extern attribute value; tensor operands become Ref slots."""
    if isinstance(v, Node):
        refs.append(v)
        return Ref(len(refs) - 1)
    if isinstance(v, (list, tuple)):
        return type(v)(_extern_value(x, refs) for x in v)
    if isinstance(v, torch.device):
        return str(v)
    if v is None or isinstance(v, (bool, int, float, complex, str, torch.dtype, torch.layout, torch.memory_format, sym.Sym,
                                   sym_values.SizeFloat)):
        return v  # a symbolic size is made concrete at each call
    if isinstance(v, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return OpArg(_target_name(v))  # an operator a higher-order op calls (with_effects' op)
    raise MinicompError(f"cannot pass {v!r} ({type(v).__name__}) to an extern op")


class Lowerer:
    def __init__(self, gm: fx.GraphModule, name: str, strict: bool, layout_outputs=None, size_bools: bool = False):
        self.gm, self.strict = gm, strict
        self.layout_outputs = layout_outputs  # outputs laid out as eager's (output_layout.py); None: all
        self.size_bools = size_bools  # an inference graph may return comparisons of sizes (SizeBool)
        self.b = Builder(name)
        self.env: dict[fx.Node, object] = {}
        self.externs: list[str] = []

    def run(self) -> Graph:
        inputs, constants, outputs, sizes_out = [], {}, [], {}
        saved_nhwc = nhwc_saved(self.gm)
        for node in self.gm.graph.nodes:
            val = node.meta.get("val")
            if node.op != "placeholder":
                continue
            if isinstance(val, torch.SymInt):  # a size Dynamo passes along: the tensors' shapes carry it too
                self.env[node] = dim(val)
            elif isinstance(val, torch.SymFloat):  # a float of sizes a forward handed its backward
                self.env[node] = sym_read.float_from_sympy(val.node.expr)
            elif not isinstance(val, torch.Tensor):
                raise MinicompError(f"graph input {node.name} is {type(val).__name__}, not a tensor or a size")
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                if node in self.env:
                    continue
                t = TensorType.of(node.meta["val"])
                nhwc = node.name in saved_nhwc and t.ndim == 4  # the caller passes it permuted (output_layout.py)
                n = Node("input", (), type=permuted(t, NHWC) if nhwc else t, name=node.name)
                inputs.append(n)
                self.env[node] = nhwc_input(self.b, n) if nhwc else n
            elif node.op == "get_attr":
                t = getattr(self.gm, node.target)
                with unset_fake_temporarily():  # AOTAutograd calls us inside its fake mode
                    constants[node.target] = t.detach()
                n = Node("constant", (), {"name": node.target}, TensorType.of(t))
                self.b.nodes.append(n)
                self.env[node] = n
            elif node.op == "call_function":
                self.env[node] = self.call(node)
            elif node.op == "output":
                values = fx.node.map_arg(node.args[0], lambda a: self.env[a])
                sized = (int, float, sym.Sym, sym_values.SizeFloat, sym_values.SizeBool)
                outputs = [None if isinstance(o, sized) else self._fresh(fx_out, self._output(o))
                           for fx_out, o in zip(node.args[0], values)]
                self._distinct(node.args[0], outputs)
                laid = range(len(outputs)) if self.layout_outputs is None else \
                    sorted(set(range(self.layout_outputs)) | view_bases(self.gm, self.layout_outputs))
                for i in laid:
                    if outputs[i] is not None and isinstance(node.args[0][i], fx.Node):
                        self.b.meta = {"source": source_line(node.args[0][i]), "fx": node.args[0][i].name}
                        outputs[i] = in_eager_layout(self.b, node.args[0][i], outputs[i])
                for i, fx_out in enumerate(node.args[0]):
                    if isinstance(fx_out, fx.Node) and fx_out.name in saved_nhwc and outputs[i] is not None \
                            and outputs[i].type.ndim == 4 and i not in laid:
                        self.b.meta = {"source": source_line(fx_out), "fx": fx_out.name}
                        outputs[i] = in_nhwc(self.b, outputs[i])
                sizes_out = {i: o for i, o in enumerate(values) if isinstance(o, sized) and not isinstance(o, bool)}
            else:
                raise MinicompError(f"unexpected fx node {node.op} {node.target}")
        graph = Graph(self.b.graph_name, inputs, self.b.nodes, outputs, constants)
        graph.size_outputs = sizes_out  # sizes the graph returns (a training forward saves them)
        return graph

    def _fresh(self, fx_out, value):
        """An output the fx graph computes (a clone, a contiguous copy) whose IR value is a graph
        input or constant gets a `copy`: returning the input itself would alias the caller's tensor.
        An output fx makes as a view of an input is an alias AOTAutograd knows and rebuilds."""
        if not isinstance(value, Node) or value.op not in ("input", "constant") or not isinstance(fx_out, fx.Node):
            return value
        n = fx_out
        while n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target.is_view:
            n = n.args[0]
        if n.op in ("placeholder", "get_attr"):
            return value
        self.b.meta = {"source": source_line(fx_out), "fx": fx_out.name}
        return self.b.emit("copy", value)

    def _distinct(self, fx_outs, outputs) -> None:
        """Two outputs that are different fx values but one IR value (y and y.clone(): the IR has
        no clones) are two tensors in eager: the later gets a copy. Among the outputs eager's
        layout applies to (a training forward's own, not what it saves for the backward)."""
        first: dict = {}
        for i in range(len(outputs) if self.layout_outputs is None else self.layout_outputs):
            o, fx_out = outputs[i], fx_outs[i]
            if isinstance(o, Node) and isinstance(fx_out, fx.Node) and first.setdefault(o, fx_out) is not fx_out:
                self.b.meta = {"source": source_line(fx_out), "fx": fx_out.name}
                outputs[i] = self.b.emit("copy", o)

    @staticmethod
    def _output(o):
        if o is None or isinstance(o, Node):
            return o
        raise MinicompError(f"graph output {o!r} is not a tensor")

    def _arg(self, a: fx.Node):
        """An argument's value. A comparison of sizes is a graph output only (its value at each
        call): an op given one would need it decided, and that guard may name a size no input
        carries (torch.full((2,), x.shape[0] == 4)): such graphs get a static program per size."""
        v = self.env[a]
        if isinstance(v, sym_values.SizeBool):
            raise MinicompError(f"{a.target} makes a bool from symbolic sizes ({v}) that an op takes, which minicomp "
                                f"cannot hold\n  at {source_line(a)}")
        return v

    def call(self, node: fx.Node):
        args = fx.node.map_arg(node.args, self._arg)
        kwargs = fx.node.map_arg(node.kwargs, self._arg)
        if node.target is operator.getitem:
            src, idx = args
            if isinstance(src, Node):  # a multi-result extern
                return self._emit_getitem(src, idx)
            return src[idx]
        if node.target in _RUNTIME_CHECKS:
            return None
        b, val = self.b, node.meta.get("val")
        b.val, b.target_name, b.fx_node = val, str(node.target), node
        b.meta = {"source": source_line(node), "fx": node.name}
        if isinstance(val, torch.SymInt):  # size arithmetic (sym_size, mul of sizes): its value is known
            return dim(val)
        if isinstance(val, torch.SymBool):  # a comparison of sizes (`is_causal = T > 1`)
            op = _COMPARE_OPS.get(node.target)
            if (self.size_bools and op is not None and len(args) == 2 and all(isinstance(a, (int, sym.Sym)) for a in args)
                    and not any(f.name.startswith("u") for f in val.node.expr.free_symbols)):  # data-dependent: no hint
                return sym_values.SizeBool(op, *args)
            raise MinicompError(f"{node.target} makes a bool from symbolic sizes ({val.node.expr}), which "
                                f"minicomp cannot hold\n  at {b.meta['source']}")
        if isinstance(val, torch.SymFloat):  # a float of sizes: the ops given it run in torch
            op = _FLOAT_OPS.get(node.target)
            if op is not None and len(args) == 2 and all(isinstance(a, (int, float, sym.Sym, sym_values.SizeFloat))
                                                         for a in args):
                return sym_values.SizeFloat(op, *args)
            if node.target is torch.sym_float and isinstance(args[0], (int, sym.Sym)):
                return sym_values.SizeFloat("*", args[0], 1.0)
            raise MinicompError(f"{node.target} makes a float from symbolic sizes ({val.node.expr}), which "
                                f"minicomp cannot hold\n  at {b.meta['source']}")
        unbacked = _unbacked(val)
        if unbacked:
            raise MinicompError(f"{node.target} has a data-dependent shape ({', '.join(unbacked)}); minicomp "
                                f"compiles sizes it can read from the inputs\n  at {b.meta['source']}")
        mark = len(b.nodes)
        try:
            if isinstance(val, torch.Tensor) and val.numel() == 0:
                result = b.full(0, dtype_name(val.dtype), tuple(dim(s) for s in val.shape))  # a symbolic dim beside a 0
            else:
                fn = LOWERINGS.get(node.target)
                if fn is None:
                    raise Unsupported("no lowering")
                if _complex(val, args, kwargs):
                    raise Unsupported("complex numbers run in torch")
                result = fn(b, *args, **kwargs)
            self._check(node, result, val)
            return result
        except Unsupported as e:
            del b.nodes[mark:]
            if self.strict:
                raise UnsupportedOpError(f"{node.target} is not supported by minicomp ({e})\n"
                                         f"  at {b.meta['source']}") from None
            return self._extern(node, args, kwargs, val, str(e))
        except Exception as e:  # a bug in a lowering: say so, and stay correct by running the op in torch
            del b.nodes[mark:]
            if self.strict:
                raise
            log.warning("internal: lowering of %s failed (%s: %s); running it as extern",
                        node.target, type(e).__name__, e)
            return self._extern(node, args, kwargs, val, f"internal: {type(e).__name__}: {e}")

    def _check(self, node, result, val):
        """The lowering's types must be the FakeTensor's; a mismatch is our bug, so say so loudly."""
        want = _type_of(val)
        if _is_multi(want):
            parts = result if isinstance(result, tuple) else ()
            got = tuple(r.type if isinstance(r, Node) else None for r in parts)
            ok = len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))
        else:
            got = result.type if isinstance(result, Node) else None
            ok = got == want
        if ok:
            return
        if _same_at_hints(got, want):  # e.g. (s//2) against s - s//2, equal under a guard of torch's trace
            log.info("%s gives %s where torch's trace says %s: equal at this call's sizes, not provably "
                     "equal for every size; it runs in torch", node.target, got, want)
            raise Unsupported(f"size {got} not provably torch's {want}")
        log.warning("internal: lowering of %s produced %s, expected %s; running it as extern",
                    node.target, got, want)
        raise Unsupported(f"lowering produced {got}, expected {want}")

    def _extern(self, node, args, kwargs, val, reason):
        refs: list[Node] = []
        ext_args = _extern_value(tuple(args), refs)
        ext_kwargs = {k: _extern_value(v, refs) for k, v in kwargs.items()}
        typ = _type_of(val)
        if typ is None:
            raise MinicompError(f"{node.target} returns {type(val).__name__}, which minicomp cannot hold\n"
                                f"  at {self.b.meta['source']}")
        attrs = {"target": _target_name(_AS_EXTERN.get(node.target, node.target)), "args": ext_args}
        if ext_kwargs:
            attrs["kwargs"] = ext_kwargs
        ext = Node("extern", refs, attrs, typ, meta=dict(self.b.meta, reason=reason))
        self.b.nodes.append(ext)
        self.externs.append(str(node.target))
        if _is_multi(typ):
            return tuple(self._emit_getitem(ext, i) if t is not None else None for i, t in enumerate(typ))
        return ext

    def _emit_getitem(self, src: Node, idx: int) -> Node:
        n = Node("getitem", (src,), {"index": idx}, src.type[idx], meta=src.meta)
        self.b.nodes.append(n)
        return n


def lower(gm: fx.GraphModule, name: str = "forward", strict: bool = False, sizes=None,
          layout_outputs=None, size_bools: bool = False) -> tuple[Graph, list[str]]:
    """Returns the IR graph and the ATen ops that became externs. `sizes`: the graph's symbols,
    {name: (lo, hi, hint)} (a static graph has none). `layout_outputs`: how many of the first
    outputs take eager's layout (output_layout.py; None: all). `size_bools`: it may return
    comparisons of sizes (an inference graph: a training forward's would be saved for a backward
    that cannot take one)."""
    lw = Lowerer(gm, name, strict, layout_outputs, size_bools)
    graph = lw.run()
    graph.sizes = dict(sizes or {})
    graph.size_inputs = size_inputs(gm, graph)
    return graph, lw.externs


def size_inputs(gm: fx.GraphModule, graph: Graph) -> list:
    """The symbols the graph's SymInt placeholders carry that no input tensor has as a dimension."""
    dims = {sym_values.as_symbol(s) for x in graph.inputs for s in x.type.shape}
    names = {n.meta["val"].node.expr.name for n in gm.graph.nodes if n.op == "placeholder"
             and isinstance(n.meta.get("val"), torch.SymInt) and n.meta["val"].node.expr.is_Symbol}
    return sorted(names - dims)


def size_positions(gm: fx.GraphModule) -> dict:
    """symbol name -> the position of the SymInt placeholder that carries it bare."""
    out = {}
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
            out.setdefault(v.node.expr.name, i)
    return out


def tensor_positions(gm: fx.GraphModule) -> list[int]:
    """Where the graph's tensor inputs are among its placeholders: a symbolic graph also takes sizes
    (SymInts), which the IR does not (its program reads them from the tensors' shapes)."""
    return [i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")
            if not isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat))]
