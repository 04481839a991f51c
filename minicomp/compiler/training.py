"""AOTAutograd's partition step, done by minicomp: the joint fx graph -> our IR -> the min cut
(passes/partition.py) -> fx forward and backward modules, which then compile like any graph.

The cut is decided on our IR, where fusion rules and the op table live; the fx modules are cut
from the joint fx graph at the same values (each IR value a saved set names is the lowering of one
fx node), by AOTAutograd's own extraction, so its runtime wrapper (saved tensors, version checks)
stays as it is. The backward module is reordered (passes/fusion_order.py) so each recomputed value
sits where our scheduler fuses it into a backward kernel that reads what it is recomputed from. Joint graphs
this cannot vouch for (opaque objects, collectives, higher-order ops, a lowering error) take
AOTAutograd's default partition, and the report says so. A joint graph over symbolic sizes is cut
with the sizes at their hints (capacities are bytes at the sizes being compiled); the sizes the
backward needs travel as AOTAutograd's saved SymInts.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import time

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves as pytree_leaves
from torch._functorch import partitioners

from ..errors import MinicompError
from ..ir import OPS, Node, sym
from ..options import Options
from ..report import PartitionReport, Report
from .debug import Dumper
from .frontend import Lowerer
from .output_layout import NHWC_SAVED, USER_OUTPUTS
from .passes import partition
from .passes.channels_last import saved_nhwc as channels_last_saved
from .passes.fusion_order import fusion_order
from .pipeline import gc_paused
from .buffers import runs_in_torch
from .sizes import size_env, symbolic

log = logging.getLogger("minicomp")
_names = itertools.count()


def _unsupported(joint: fx.GraphModule) -> str | None:
    """Why minicomp's partition cannot take this joint graph (None: it can)."""
    for n in joint.graph.nodes:
        val = n.meta.get("val")
        if n.op == "placeholder" and not isinstance(val, (torch.Tensor, torch.SymInt)):
            return f"input {n.name} is {type(val).__name__}, not a tensor or a size"
        if n.op != "call_function":
            continue
        if isinstance(n.target, torch._ops.HigherOrderOperator) and n.target is not torch.ops.higher_order.with_effects:
            return f"higher-order op {n.target}"  # with_effects runs in torch, in the forward (an extern)
        if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace in ("_c10d_functional", "c10d"):
            return f"collective {n.target}"
        leaves = val if isinstance(val, (tuple, list)) else (val,)
        if not all(v is None or isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat)) for v in leaves):
            return f"{n.target} returns {type(val).__name__}"
    return None


def _must_save(fx_node) -> bool:
    from torch.utils.checkpoint import CheckpointPolicy
    return fx_node is not None and (fx_node.meta.get("recompute") in (CheckpointPolicy.MUST_SAVE,
                                                                      CheckpointPolicy.PREFER_SAVE)
                                    or torch.Tag.nondeterministic_seeded in getattr(fx_node.target, "tags", ()))


def _mutated_inputs() -> list:
    """The positions of the joint graph's primal inputs the forward updates in place (x.mul_(2) on
    an input): AOTAutograd's ViewAndMutationMeta, a local of the function that calls partition_fn
    (it passes only the output count); [] where no caller holds one."""
    frame = inspect.currentframe()
    try:
        for _ in range(4):
            frame = frame.f_back if frame is not None else None
            meta = frame.f_locals.get("fw_metadata") if frame is not None else None
            if meta is not None and hasattr(meta, "input_info"):
                return [i for i, info in enumerate(meta.input_info) if getattr(info, "mutates_data", False)]
        return []
    finally:
        del frame


def _mark_readers_of_mutated_inputs(joint: fx.GraphModule, mutated: list) -> None:
    """AOTAutograd writes a mutated input's new value into it after the forward, so the backward
    must not read the input: a value computed from it is saved, never recomputed (recomputed, it
    read the updated input -- autograd refused, and its value would have been wrong)."""
    from torch.utils.checkpoint import CheckpointPolicy
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and n.name.startswith("primals")]
    for i in mutated:
        if i < len(primals):
            for user in primals[i].users:
                user.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def _must_recompute(fx_node) -> bool:
    from torch.utils.checkpoint import CheckpointPolicy
    return fx_node is not None and fx_node.meta.get("recompute") == CheckpointPolicy.MUST_RECOMPUTE


def lower_joint(joint: fx.GraphModule, name: str, sizes=None):
    """(IR joint graph, {IR node: the first fx node it is the value of}, {fx name: IR node})."""
    lw = Lowerer(joint, name, strict=False, layout_outputs=0)
    graph = lw.run()
    graph.sizes = dict(sizes or {})
    rep, value = {}, {}
    for fx_node, v in lw.env.items():
        if isinstance(v, Node):  # a tuple (a multi-result op) is reached through its getitem nodes
            rep.setdefault(v, fx_node)
            value[fx_node.name] = v
    return graph, rep, value


def saved_bytes_meter(joint: fx.GraphModule):
    """A function of a saved set another partitioner chooses on `joint` (fx node names) giving its
    partition.saved_bytes: the same meter as minicomp's own report (the benchmark compares torch's
    min cut with ours). Made before that partitioner runs: it may rewrite the joint graph."""
    _, _, value = lower_joint(joint, "measure")
    return lambda saved_names: partition.saved_bytes([value[n] for n in saved_names if n in value])


def _extract(joint: fx.GraphModule, saved: list, num_fwd_outputs: int, static_nodes, deferrable):
    """AOTAutograd's extraction of the forward and backward modules for a saved set (its keyword
    arguments differ between torch releases); the backward reordered by sink_recomputed."""
    fn = partitioners._extract_fwd_bwd_modules
    kw = {"num_fwd_outputs": num_fwd_outputs}
    if "static_lifetime_input_nodes" in inspect.signature(fn).parameters:
        kw["static_lifetime_input_nodes"] = static_nodes
    fw, bw = fn(joint, saved, saved_sym_nodes=_sym_nodes(joint), **kw)
    fw.graph.eliminate_dead_code()
    bw.graph.eliminate_dead_code()
    return fw, sink_recomputed(bw, deferrable)


def _is_sym(n: fx.Node) -> bool:
    return isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def _sym_nodes(joint: fx.GraphModule) -> list:
    """The forward's sizes (SymInt inputs and size arithmetic, no tangent behind them): AOTAutograd
    stashes them for the backward, which keeps those it reads (as its default partition does)."""
    tangent, out = set(), []
    for n in joint.graph.nodes:
        if (n.op == "placeholder" and "tangents" in n.name) or any(a in tangent for a in n.all_input_nodes):
            tangent.add(n)
        elif _is_sym(n) and n.op in ("placeholder", "call_function"):
            out.append(n)
    return out


def _closed(joint: fx.GraphModule, saved: list, num_fwd_outputs: int) -> list:
    """`saved` plus the primal inputs the backward reaches without passing a saved value: our IR
    can know a value is a constant where the fx graph still reads an input for it (the softmax of
    a 0-d tensor is 1), and AOTAutograd's extraction needs every input the backward reads saved."""
    keep = set(saved)
    grads = joint.graph.find_nodes(op="output")[0].args[0]
    stack = [g for g in pytree_leaves(grads[num_fwd_outputs:]) if isinstance(g, fx.Node)]
    seen, extra = set(), []
    while stack:
        n = stack.pop()
        if n in seen or n in keep:
            continue
        seen.add(n)
        if n.op == "placeholder":
            if "tangents" not in n.name and not _is_sym(n):  # sizes travel as saved SymInts
                extra.append(n)
            continue
        if _is_sym(n):
            continue
        stack.extend(n.all_input_nodes)
    return list(saved) + sorted(extra, key=lambda n: n.name)


def sink_recomputed(bw: fx.GraphModule, deferrable=lambda n: False) -> fx.GraphModule:
    """Reorder the backward module as passes/fusion_order.py says: every node that does not depend
    on a tangent (the recomputed forward values) just before its first user, and each torch op
    reading one (`deferrable(fx node)`) after the backward nodes that read what it is recomputed
    from; the rest keeps its order."""
    nodes = list(bw.graph.nodes)
    tangent = set()
    for n in nodes:
        if (n.op == "placeholder" and "tangents" in n.name) or any(a in tangent for a in n.all_input_nodes):
            tangent.add(n)
    movable = {n for n in nodes if n.op == "call_function" and n not in tangent}
    order = fusion_order(nodes, lambda n: n.all_input_nodes, movable, lambda n: n in tangent and deferrable(n),
                         lambda n: n.op == "placeholder" and not n.name.startswith(("primals", "tangents")))
    prev = None
    for n in order:
        if prev is not None and prev.next is not n:
            prev.append(n)
        prev = n
    bw.graph.lint()
    bw.recompile()
    return bw


def _static_nodes(joint: fx.GraphModule, indices):
    placeholders = joint.graph.find_nodes(op="placeholder")
    return {placeholders[i] for i in (indices or []) if i < len(placeholders)}


def _default(joint, joint_inputs, num_fwd_outputs, static_indices, report: Report, why: str):
    msg = f"training graph partitioned by AOTAutograd's default (every forward value the backward uses is saved): {why}"
    log.warning("%s", msg)
    if msg not in report.eager:
        report.eager.append(msg)
    return partitioners.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                          static_lifetime_input_indices=static_indices)


def make_partition(options: Options, report: Report, kernel_ops_for):
    """AOTAutograd's `partition_fn`: minicomp's min cut for the joint graphs it compiles.
    `kernel_ops_for(joint_inputs)`: the ops the backend that will run them has kernels for."""
    def partition_fn(joint, joint_inputs, *, num_fwd_outputs, static_lifetime_input_indices=None, **_):
        _mark_readers_of_mutated_inputs(joint, _mutated_inputs())
        why = _unsupported(joint)
        if why is None:
            try:
                guards: list = []
                env, sizes = size_env(_flat(joint_inputs), guards) if symbolic(_flat(joint_inputs)) else (None, {})
                tensors = [x for x in _flat(joint_inputs) if isinstance(x, torch.Tensor)]
                with sym.using(env) if env is not None else contextlib.nullcontext(), gc_paused():
                    return run(joint, num_fwd_outputs, options, report, kernel_ops_for(joint_inputs),
                               _static_nodes(joint, static_lifetime_input_indices), sizes,
                               channels_last=all(x.device.type == "cpu" for x in tensors))
            except MinicompError as e:
                if "remat_budget" in str(e):
                    raise
                why = str(e).splitlines()[0]
        return _default(joint, joint_inputs, num_fwd_outputs, static_lifetime_input_indices, report, why)
    return partition_fn


def _flat(joint_inputs) -> list:
    """AOTAutograd's joint inputs ([primals, tangents]) as one list."""
    return [y for x in joint_inputs for y in (x if isinstance(x, (list, tuple)) else [x])]


def run(joint: fx.GraphModule, num_fwd_outputs: int, options: Options, report: Report, kernel_ops,
        static_nodes=frozenset(), sizes=None, channels_last: bool = False):
    """Cut `joint` with the min cut; returns AOTAutograd's (forward module, backward module).
    `channels_last`: the graphs run on CPU, where saved convolution inputs and results cross in
    [N,H,W,C] order (output_layout.py)."""
    t0 = time.perf_counter()
    name = f"joint_{next(_names)}"
    dump = Dumper(options, name)
    dump.stage("fx", lambda: joint.print_readable(print_output=False), level=3)
    graph, rep, value = lower_joint(joint, name, sizes)
    dump.stage("ir", graph.__str__)

    def fx_of(n):
        return rep.get(n)

    def names(n):
        f = fx_of(n)
        src = n.meta.get("source")
        return (f.name if f is not None else n.op) + (f" at {src}" if src and n.op != "input" else "")
    kw = dict(saveable=lambda n: fx_of(n) is not None, names=names,
              must_save=lambda n: _must_save(fx_of(n)), must_recompute=lambda n: _must_recompute(fx_of(n)),
              group=lambda n: n.meta.get("fx") if n.op != "input" else None)
    ours = partition.cut(graph, num_fwd_outputs, kernel_ops, remat=options.remat, budget=options.remat_budget, **kw)
    baseline = ours if not options.remat else partition.cut(graph, num_fwd_outputs, kernel_ops, remat=False, **kw)
    dump.stage("cut", lambda: ours.describe(names))
    if dump.dir:
        fw_ir, bw_ir = partition.split(graph, num_fwd_outputs, ours.saved, ours.in_backward, kernel_ops)
        dump.stage("ir_forward", fw_ir.__str__)
        dump.stage("ir_backward", bw_ir.__str__)
    def in_torch(fx_node):  # a torch op the scheduler does not fuse (a matmul): it may wait for its siblings
        v = value.get(fx_node.name)
        return v is not None and v.op in OPS and runs_in_torch(v, kernel_ops)
    fw, bw = _extract(joint, _closed(joint, [fx_of(n) for n in ours.saved], num_fwd_outputs), num_fwd_outputs,
                      static_nodes, in_torch)
    baseline_set = set(baseline.saved)
    recomputed = [(names(n), n.op, partition.nbytes(n) if n in baseline_set else 0, int(sym.hint(n.type.numel) * _cost(n)))
                  for n in ours.recomputed if n.op in OPS and OPS[n.op].category not in ("view", "creation")]
    report.partitions.append(PartitionReport(
        name, "min-cut" if options.remat else "remat=False", ours.saved_bytes, baseline.saved_bytes,
        [(names(n), partition.nbytes(n)) for n in ours.saved], recomputed, ours.level, options.remat_budget,
        time.perf_counter() - t0))
    dump.summary(str(report.partitions[-1]))
    fw.meta[USER_OUTPUTS] = num_fwd_outputs  # the outputs AOTAutograd hands back (output_layout.py)
    if channels_last:
        fw.meta[NHWC_SAVED] = bw.meta[NHWC_SAVED] = frozenset(
            fx_of(n).name for n in channels_last_saved(graph, ours.saved) if fx_of(n) is not None)
    return fw, bw


def _cost(n) -> float:
    """Flops per element of recomputing n (the op table's cost weights)."""
    return OPS[n.op].cost if n.op in OPS and OPS[n.op].category in ("pointwise", "reduction") else 0.0
