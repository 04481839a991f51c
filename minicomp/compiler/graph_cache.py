"""The graph cache: a Dynamo graph seen before skips AOTAutograd and our lowering.

Dynamo traces every compile (its guards need that), but what comes after it, AOTAutograd's two
traces and our lowering to IR, depends only on the Dynamo graph and its inputs' metadata. For an
inference graph whose AOTAutograd wrapper does nothing (no input mutated, no output aliasing an
input, no effect tokens or tensor subclasses), the lowered IR (text, plus each node's source line)
goes to the on-disk cache (runtime/cache.py) under a key of:

  the Dynamo graph's code, each node's stack trace, its inputs' types, shapes, strides, offsets,
  dtypes, devices, requires_grad and aliasing, grad mode, the default dtype, torch's version and a
  hash of minicomp's compiler sources.

A later compile of the same graph (a new process, a second instance of a model, a recompile after
`torch._dynamo.reset()`) parses that IR and runs the passes and the backend on it: for the GPT
block, 0.11 s of AOTAutograd tracing saved out of 0.27 s. A graph we cannot vouch for (training
graphs, get_attr constants, call_module nodes, functions outside torch, tensor subclasses, autocast)
has no key and compiles the usual way; so does an entry that fails to parse.
A graph this process built before is taken one step further along: capture.py keeps it after the
passes, with its generated code (`Built`), so a recompile only loads machine code and lays out a
new Program. `MINICOMP_GRAPH_CACHE=0` turns both off.
"""
from __future__ import annotations

import functools
import hashlib
import json
import pathlib

import torch

from .. import options
from ..runtime import cache

_PLAIN_MODULES = ("operator", "_operator", "math", "builtins")
_META_KEYS = ("source", "fx", "reason")

enabled = options.graph_cache  # MINICOMP_GRAPH_CACHE, read at each compile


@functools.lru_cache(maxsize=1)
def _sources_hash() -> str:
    """The compiler's own code is part of every key: an edit to a lowering never meets stale IR."""
    h = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parent.parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _safe_target(target) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace in ("aten", "prims")
    if isinstance(target, torch._ops.OpOverloadPacket):  # torch.ops.aten.foo called without an overload
        return target._qualified_op_name.split("::")[0] in ("aten", "prims")
    if isinstance(target, torch._ops.OperatorBase):  # higher-order ops carry subgraphs
        return False
    module = getattr(target, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.") or module in _PLAIN_MODULES


def _input_key(x, storages: dict):
    if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.layout != torch.strided:
        return None
    try:
        base = storages.setdefault(x.untyped_storage().data_ptr(), len(storages))
    except RuntimeError:  # a fake or meta tensor: no storage to compare
        return None
    return (tuple(x.shape), x.stride(), x.storage_offset(), str(x.dtype), str(x.device), x.requires_grad,
            type(x).__name__, x.is_inference(), x.is_conj(), x.is_neg(), base)


def graph_key(gm: torch.fx.GraphModule, example_inputs, strict: bool) -> str | None:
    """The cache key of a Dynamo graph with these inputs, or None when it must not be cached."""
    if not enabled() or torch._C._is_any_autocast_enabled() or list(gm.parameters()) or list(gm.buffers()):
        return None
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return None  # a training graph: forward, backward and AOTAutograd's autograd wrapper
    traces = []
    for n in gm.graph.nodes:
        ex = n.meta.get("example_value")
        if n.op == "placeholder" and (isinstance(ex, torch.SymInt) or isinstance(ex, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in ex.shape)):
            return None  # a symbolic graph: its program depends on the ShapeEnv's ranges and guards
        if n.op not in ("placeholder", "call_function", "call_method", "output"):
            return None
        if n.op == "call_function" and not _safe_target(n.target):
            return None
        traces.append(n.meta.get("stack_trace") or "")
    storages: dict = {}
    inputs = [_input_key(x, storages) for x in example_inputs]
    if any(i is None for i in inputs):
        return None
    return cache.key("graph", torch.__version__, _sources_hash(), gm.code, json.dumps(traces),
                     repr(inputs), repr((torch.is_grad_enabled(), torch.get_default_dtype(), strict)))


def plain_wrapper(n_inputs: int) -> bool:
    """Whether AOTAutograd's wrapper around the inference graph being compiled passes the flat
    inputs straight in and the outputs straight out (then the lowered graph alone is the program)."""
    from torch._functorch._aot_autograd.schemas import OutputType
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None or len(meta.input_info) != n_inputs:
        return False
    return (not meta.tokens and meta.num_intermediate_bases == 0 and not meta.traced_tangents
            and not any(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata for i in meta.input_info)
            and all(o.output_type == OutputType.non_alias and issubclass(o.raw_type, torch.Tensor)
                    for o in meta.output_info)
            and all(type(m).__name__ == "PlainTensorMeta" for m in meta.subclass_inp_meta if not isinstance(m, int))
            and all(type(m).__name__ == "PlainTensorMeta" for m in meta.subclass_fw_graph_out_meta
                    if not isinstance(m, int)))


def store(key: str, graph, fx_nodes: int) -> None:
    """Write the lowered graph (whether it reads back exactly is load's to check: a cold compile
    does not pay for a parse)."""
    text = str(graph)
    meta = [{k: n.meta[k] for k in _META_KEYS if k in n.meta} for n in graph.inputs + graph.nodes]
    if any(not isinstance(v, str) for m in meta for v in m.values()) or graph.constants:
        return
    cache.put("graphs", key, json.dumps({"ir": text, "meta": meta, "fx_nodes": fx_nodes}).encode())


def load(key: str, name: str):
    """(graph renamed to `name`, fx node count) from the cache, or None."""
    from ..ir import parse
    blob = cache.get("graphs", key)
    if blob is None:
        return None
    try:
        entry = json.loads(blob)
        graph = parse(entry["ir"])
        if str(graph) != entry["ir"]:  # only what reads back exactly
            raise ValueError("the text does not read back")
        nodes = graph.inputs + graph.nodes
        if len(nodes) != len(entry["meta"]):
            raise ValueError("node count")
        for n, m in zip(nodes, entry["meta"]):
            n.meta = dict(m)
    except Exception:  # an entry from an incompatible writer: compile the usual way, and replace it
        cache.drop("graphs", key)
        return None
    graph.name = name
    return graph, entry["fx_nodes"]
