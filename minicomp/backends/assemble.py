"""A fused graph's Program, the same for every backend that generates kernels.

Each backend module (cpu.py, cuda.py, cuda_emu.py) generates and loads its kernels and hands
`assemble` a `make_launch(kernel, slots)`; what is left is common: an env slot for every value, one
step per kernel and per torch op, views of known layout folded into one as_strided (layout.py), the
buffers kernels write, and with options.profile a timer per step (the seconds of every call, in the
program's report) -- the Program runs the same steps either way.
"""
from __future__ import annotations

import functools

import torch

from ..errors import MinicompError
from ..ir import DTYPES, OPS, TensorType, sym_values
from ..ir.ops import OpArg, Ref, resolve_target
from ..ir.kernel import describe
from ..ir.types import itemsize
from ..report import KernelReport, StepReport
from ..runtime.program import AsStrided, Program, TorchCall
from .layout import CONTIGUOUS_TORCH_OPS, free_layout_inputs, static_views


def check_devices(graph_name: str, items, device, why: str = "the program reads it there") -> None:
    """Refuse a tensor (name, tensor) that is not on the program's `device`, naming it: a kernel
    given another device's pointer reads garbage or faults."""
    want = torch.device(device)
    for name, t in items:
        d = t.device if isinstance(t, torch.Tensor) else None
        if d is not None and (d.type != want.type or None not in (d.index, want.index) and d.index != want.index):
            raise MinicompError(f"minicomp: {graph_name}: {name} ({tuple(t.shape)}, {t.dtype}) is on {d}, but the "
                                f"program runs on {want} and {why}")


def assemble(graph, ctx, kernels, make_launch, keepalive, device="cpu", sizes=None):
    """A fused graph's Program, for any backend: env slots for every value, one step per torch op,
    and `make_launch(kernel, slots)` for each kernel node (slots: its buffers' env slots in
    Kernel.buffers order). `sizes`: the symbol values a symbolic graph's instance runs at (its
    kernels' byte counts are reported at those). Returns (program, report detail)."""
    knodes = [n for n in graph.nodes if n.op == "kernel"]
    slot = {n: i for i, n in enumerate(graph.inputs)}
    constants = [n for n in graph.nodes if n.op == "constant"]
    for n in constants + graph.nodes:
        slot.setdefault(n, len(slot))
    kernel_inputs = {a for kn in knodes for a in kn.args}  # torch results kernels read: made contiguous
    results: dict = {}
    for n in graph.nodes:
        if n.op == "getitem" and n.args[0].op == "kernel":
            results.setdefault(n.args[0], {})[n.attrs["index"]] = n
    outputs = set(o for o in graph.outputs if o is not None)
    launches, buffers, reports = {}, [], {}
    for n, k in zip(knodes, kernels):
        outs = results.get(n, {})
        launches[n] = make_launch(k, [slot[n.args[j]] if kind == "arg" else slot[outs[j]] for kind, j in n.meta["io"]])
        at = (lambda x: sym_values.concrete(x, sizes)) if sizes else (lambda x: x)
        reports[n] = KernelReport(k.name, ctx.name, list(k.ops), at(k.bytes_read), at(k.bytes_written), k.flops,
                                  label=describe(k))
        for j, g in outs.items():
            buffers.append((slot[g], g.type.shape, DTYPES[g.type.dtype],
                            g.meta.get("arena_offset")))  # None: fresh each call (plan_memory)
    free = free_layout_inputs(graph)
    views = static_views(graph, kernel_inputs, free)
    needed = outputs | {a for n in graph.nodes if n not in views for a in n.args}  # views only views read: skipped
    steps, names, timers = [], [], []
    profile = ctx.options.profile
    for n in graph.nodes:
        if n.op in ("constant", "input") or (n.op == "getitem" and n.args[0].op == "kernel"):
            continue
        if n in views:
            if n in needed:
                root, size, stride, offset, guarded = views[n]
                steps.append(AsStrided(slot[root], slot[n], size, stride, offset,
                                       _view_chain(n, root, device, n in kernel_inputs) if guarded else None,
                                       n in outputs))
                names.append(f"minicomp {ctx.name} view")
                timers.append(None)  # a view of a known layout: no time worth a clock read
            continue
        if n.op == "kernel":
            steps.append(launches[n])
            r = reports[n]
            step = StepReport(r.name, ctx.name, "kernel", r.label, r.ops, r.bytes_read, r.bytes_written, r.flops)
        else:
            steps.append(TorchCall(_torch_fn(n, device), [slot[a] for a in n.args], slot[n],
                                   n in kernel_inputs and n.op not in CONTIGUOUS_TORCH_OPS))  # mm's: contiguous
            if n.op == "getitem":  # an element of a torch op's results: one Python index, no torch call
                names.append(f"minicomp {ctx.name} getitem")
                timers.append(None)  # nothing worth a clock read, and no roof of explain()'s to judge it by
                continue
            step = _torch_step_report(n, ctx.name)
        names.append(f"minicomp {ctx.name} {step.name} ({step.label})")
        timers.append(_timer(step, reports.get(n)) if profile else None)
        if profile:
            ctx.report.steps.append(step)
    # only a torch op's result can view the arena; kernel results and inputs never do
    may_alias = [i for i, o in enumerate(graph.outputs) if o is not None and o.op not in ("input", "constant")
                 and not (o.op == "getitem" and o.args[0].op == "kernel")]
    values = [graph.constants[c.attrs["name"]] for c in constants]
    check_devices(ctx.name, [(f"constant {c.attrs['name']}", t) for c, t in zip(constants, values)], device)
    program = Program(len(graph.inputs), values, steps, buffers,
                      [None if o is None else slot[o] for o in graph.outputs], ctx.arena_bytes, len(slot), device,
                      may_alias, recycle=ctx.options.recycle_outputs,
                      contiguous_inputs=[i for i, x in enumerate(graph.inputs)
                                         if x not in free and i not in ctx.guarded_contiguous], names=names,
                      timers=timers)
    program.keepalive = keepalive  # the kernels' machine code lives as long as the program
    ctx.report.kernels.extend(reports.values())
    detail = {"kernels": len(knodes), "torch_ops": len(steps) - len(knodes), "arena_bytes": ctx.arena_bytes,
              "remat_bytes_saved": ctx.remat_bytes_saved}
    return program, detail


def _view_chain(n, root, device, contiguous: bool = False):
    """The torch ops from `root` to view `n` as one function (a guarded view's path when its root
    is not contiguous: layout.py); `contiguous`: a kernel reads the view, so it is made contiguous
    (the as_strided path gives a contiguous view there: layout.py checks)."""
    chain = []
    while n is not root:
        chain.append(_torch_fn(n, device))
        n = n.args[0]
    chain.reverse()

    def views(x):
        for f in chain:
            x = f(x)
        return x.contiguous() if contiguous else x
    return views


_DIRECT = {"mm": torch.mm, "bmm": torch.bmm}  # ops whose reference is just this torch function of the operands
_REDUCTIONS = {"sum": torch.sum, "amax": torch.amax, "amin": torch.amin}  # over dims: one call with the attributes


def _torch_fn(node, device):
    """The callable a torch step makes: the op table's reference, with what it would work out at
    every call (an extern's target looked up from its name, its argument template filled) done now
    where the op allows: one call into torch per step, no Python layers we can avoid."""
    ref, attrs = OPS[node.op].ref, node.attrs
    if node.op == "getitem":
        i = attrs["index"]
        return lambda t: t[i]
    if node.op in _DIRECT:
        return _DIRECT[node.op]
    if node.op in _REDUCTIONS and attrs["dims"]:
        kw = {"dim": tuple(attrs["dims"]), "keepdim": attrs["keepdim"]}
        if node.op == "sum":  # keeps the operand's dtype (ops.py)
            kw["dtype"] = DTYPES[node.type.dtype]
        return functools.partial(_REDUCTIONS[node.op], **kw)
    if node.op == "extern":
        direct = _direct_extern(attrs, len(node.args))
        if direct is not None:
            return direct
    return lambda *xs: ref(list(xs), attrs, device)


def _direct_extern(attrs, operands: int):
    """An extern whose arguments are its operands, in order, then constants, and whose keyword
    arguments are constants (no device to put in): its ATen overload, called with them."""
    args, kwargs = list(attrs["args"]), dict(attrs.get("kwargs", {}))

    def static(x):
        if isinstance(x, (Ref, OpArg)):  # an operator argument is resolved at each call (ir/ops.py)
            return False
        if isinstance(x, (list, tuple)):
            return all(static(y) for y in x)
        return not isinstance(x, dict)
    n = 0
    while n < len(args) and isinstance(args[n], Ref) and args[n].index == n:
        n += 1
    if n != operands or "device" in kwargs or not all(static(a) for a in args[n:]) or not all(static(v) for v in kwargs.values()):
        return None
    op, rest = resolve_target(attrs["target"]), tuple(args[n:])
    if not rest and not kwargs:
        return op
    return lambda *xs: op(*xs, *rest, **kwargs)


def _torch_step_report(n, graph_name: str) -> StepReport:
    """A torch call's bytes (its operands read once, its results written once) and flops (the op
    table's count: 2*M*N*K for a matmul; unknown, 0, for an extern)."""
    def nbytes(t):
        if isinstance(t, TensorType):
            return t.numel * itemsize(t.dtype)
        return sum(nbytes(x) for x in t) if isinstance(t, tuple) else 0
    name = n.attrs["target"] if n.op == "extern" else n.op
    if OPS[n.op].category in ("view", "tuple"):  # a view moves nothing (a reshape torch must copy shows as time)
        return StepReport(name, graph_name, "torch", "view", [n.op], 0, 0, 0)
    try:
        flops = int(OPS[n.op].flops(n.type, tuple(a.type for a in n.args), n.attrs)) if n.op != "extern" else 0
    except Exception:  # a multi-result type the op's count does not take
        flops = 0
    label = {"matmul": "matmul", "extern": "torch call"}.get(OPS[n.op].category, OPS[n.op].category)
    return StepReport(name, graph_name, "torch", label, [n.op], sum(nbytes(a.type) for a in n.args), nbytes(n.type),
                      flops)


def _timer(report: StepReport, kernel_report=None):
    """options.profile: what the Program calls with the seconds of each call of a step; a kernel's
    report keeps the running mean."""
    samples = report.samples
    if kernel_report is None:
        return samples.append

    def record(seconds: float) -> None:
        samples.append(seconds)
        kernel_report.time_s += (seconds - kernel_report.time_s) / len(samples)
    return record
