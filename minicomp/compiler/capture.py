"""Capture: Dynamo + AOTAutograd hand us functional ATen fx graphs (core ATen, less the ops
decompositions.py keeps whole for the lowerings); we compile each.

With requires_grad inputs or parameters AOTAutograd splits forward and backward (at minicomp's
min cut: training.py) and both go through our pipeline, so `loss.backward()` runs compiled code too.
`minicomp_backend` is also what `torch.compile(model, backend="minicomp")` reaches (registered
on import and through the `torch_dynamo_backends` entry point). An inference graph Dynamo captured
before skips AOTAutograd and lowering through the graph cache (graph_cache.py); one this process
has built before also skips the passes and code generation (`Built`, an in-memory memo).
"""
from __future__ import annotations

import collections
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import torch
from torch._dynamo.source import GetItemSource, LocalSource
from torch._functorch.aot_autograd import make_boxed_func

from ..errors import SizesOutsideProgram
from ..ir import sym, sym_values, verify
from ..options import Options
from ..report import GraphReport, Report
from . import decompositions, graph_cache
from .debug import Dumper, Progress
from .frontend import lower, size_positions, tensor_positions
from .input_views import input_views, share_bases, with_input_views
from .output_layout import laid_out, nhwc_positions
from .sizes import size_env as _size_env, symbolic as _symbolic
from .pipeline import gc_paused, run_passes
from .training import make_partition

_names = itertools.count()
log = logging.getLogger("minicomp")


@dataclass
class Context:
    """What a graph's compilation carries from pass to pass (no globals)."""
    options: Options
    dump: Dumper
    report: Report
    name: str
    kernel_ops: Optional[set] = None    # ops the backend's code generator has; None: no kernels
    flops_per_byte: float = 4.0         # the backend's compute/bandwidth balance (rematerialization)
    fusion: Any = None                  # what the fusion stage decided (fuse.Fusion), for reports and tests
    remat_bytes_saved: int = 0
    arena_bytes: int = 0
    artifacts: dict = field(default_factory=dict)  # the backend's generated code, kept with a Built graph
    phases_ms: dict = field(default_factory=dict)  # where this graph's compile went (GraphReport.phases_ms)
    guarded_contiguous: frozenset = frozenset()  # inputs whose strides Dynamo's guards fix, contiguous: no check
    channels_last: bool = False         # 2-d convolutions run on [N,H,W,C] data (passes/channels_last.py)


class Built(NamedTuple):
    """A graph-cache graph after the passes, kept in memory: a later compile of the same Dynamo graph
    in this process (`torch._dynamo.reset()`, a second instance of a model) builds its program from
    it without lowering, passes or code generation. The graph is shared, never mutated; each compile
    still gets its own Program (arena, recycled outputs) and its own loaded machine code."""
    graph: Any
    fx_nodes: int
    externs: list
    arena_bytes: int
    remat_bytes_saved: int
    artifacts: dict


_built: "collections.OrderedDict[tuple, Built]" = collections.OrderedDict()
BUILT_MEMO = 64  # graphs kept, least recently used dropped


def forget_built() -> None:
    """Drop every Built graph: the next compile of any graph starts where a new process would."""
    _built.clear()


def _memo_key(cache_key, options: Options):
    """None when this compile dumps its stages (a dump shows every pass, so nothing is skipped)."""
    if cache_key is None or options.debug_level or options.dump_dir:
        return None
    return cache_key, options


def built(cache_key, options: Options) -> Optional[Built]:
    key = _memo_key(cache_key, options)
    entry = _built.get(key) if key is not None else None
    if entry is not None:
        _built.move_to_end(key)
    return entry


def make_context(options: Options, name: str, backend: str, report: Optional[Report] = None) -> Context:
    """The context one graph compiles in: its dumps, its report, the backend's kernel ops."""
    from ..backends import kernel_ops
    ctx = Context(options, Dumper(options, name), report if report is not None else Report(), name)
    ctx.kernel_ops, ctx.flops_per_byte = kernel_ops(backend)
    return ctx


def guarded_contiguous(gm: torch.fx.GraphModule, example_inputs) -> frozenset:
    """The inputs of a Dynamo graph whose every stride Dynamo's guards check before each call and
    that were contiguous here: tensors the frame got directly (a local, or an item of one, such as
    `args[0]`), each under a TENSOR_MATCH guard. Their program skips its contiguity check (26 inputs:
    about 1.8 us a call). Parameters and buffers keep theirs: Dynamo may skip the guards of tensors
    in a module dict that did not change, and `p.data = q.t()` changes a tensor, not the dict. A
    symbolic graph keeps every check."""
    if _symbolic(example_inputs):
        return frozenset()
    out = set()
    for i, (n, x) in enumerate(zip(gm.graph.find_nodes(op="placeholder"), example_inputs)):
        src = getattr(n.meta.get("grapharg"), "source", None)
        if type(src) is GetItemSource and isinstance(src.index, int) and not src.index_is_slice:
            src = src.base
        if (type(src) is LocalSource and not src.is_derefed_cell_contents and type(x) is torch.Tensor
                and x.is_contiguous()):
            out.add(i)
    return frozenset(out)


def compile_fx_graph(gm: torch.fx.GraphModule, example_inputs, options: Options, report: Report, kind: str,
                     cache_key: Optional[str] = None, cached=None, guarded: frozenset = frozenset()):
    """fx graph -> IR -> passes -> a backend's callable taking the flat list of inputs.
    `cached`: (IR graph, fx node count) from the graph cache, in place of lowering `gm`, or a Built
    graph, in place of lowering and the passes;
    `cache_key`: where to store the lowered IR (and the Built graph) when AOTAutograd's wrapper
    turns out to be plain. The cycle collector is paused meanwhile (pipeline.gc_paused)."""
    with gc_paused():
        if cached is None and _symbolic(example_inputs):  # sizes that vary: one program for all of them
            guards: list = []
            env, sizes = _size_env(example_inputs, guards)
            with sym.using(env):
                return _compile(gm, example_inputs, options, report, kind, None, None, sizes, guards)
        return _compile(gm, example_inputs, options, report, kind, cache_key, cached, guarded=guarded)


def _compile(gm, example_inputs, options: Options, report: Report, kind: str, cache_key, cached,
             sizes=None, guards=None, guarded: frozenset = frozenset()):
    from ..backends import build, resolve_backend  # backends import codegen/runtime lazily
    devices = {str(x.device.type) for x in example_inputs if isinstance(x, torch.Tensor)}
    if devices - {"cpu", "cuda"}:  # meta, mps, xpu...: torch runs them as eager would
        msg = (f"{kind} graph on {', '.join(sorted(devices - {'cpu', 'cuda'}))} tensors: minicomp compiles CPU "
               "and CUDA tensors; it runs in torch")
        log.warning("%s", msg)
        report.eager.append(msg)
        return make_boxed_func(gm)
    t0 = time.perf_counter()
    name = f"{kind}_{next(_names)}"
    backend = resolve_backend(options.backend, "cuda" if "cuda" in devices else "cpu")
    ctx = make_context(options, name, backend, report)
    ctx.channels_last = "cuda" not in devices  # oneDNN's layout; cuDNN's is untried here
    progress = Progress(name)
    hidden = 0  # outputs share_bases added
    if isinstance(cached, Built):
        graph, fx_nodes, externs, ctx.arena_bytes, ctx.remat_bytes_saved, ctx.artifacts = cached
        plain, hit = True, "memo"
        ctx.guarded_contiguous = guarded  # called with the flat inputs Dynamo checked (_direct)
        run, detail = build(graph, ctx, backend)
        size_outputs = {}
    else:
        if cached is None:
            hidden = share_bases(gm) if kind == "inference" else 0
            ctx.dump.stage("fx", lambda: gm.print_readable(print_output=False), level=3)
            t_lower = time.perf_counter()
            graph, _ = lower(gm, name, options.strict, sizes, laid_out(kind, gm), size_bools=kind == "inference")
            ctx.phases_ms["lower"] = _ms(time.perf_counter() - t_lower)
            fx_nodes = len(gm.graph.nodes)
            # an output viewing another output is one AOTAutograd calls no alias, but its view is made
            # from this graph's nodes (input_views.py): a cache hit brings Dynamo's graph, not this one
            plain = (kind == "inference" and graph_cache.plain_wrapper(len(example_inputs)) and not hidden
                     and not input_views(gm))
            hit = None
            if cache_key is not None and plain:
                graph_cache.store(cache_key, graph, fx_nodes)
        else:
            graph, fx_nodes = cached
            graph.name, plain, hit = name, True, "hit"
            ctx.dump.stage("fx", lambda: "# graph cache hit: AOTAutograd and lowering skipped; Dynamo's graph:\n"
                           + gm.print_readable(print_output=False), level=3)
        ctx.dump.stage("ir", graph.__str__)
        if options.verify:
            verify(graph)
        externs = [n.attrs["target"] for n in graph.nodes if n.op == "extern"]
        size_outputs = graph.size_outputs
        progress(f"lowered to {len(graph.nodes)} IR nodes")
        graph = run_passes(graph, ctx)
        progress(f"passes done: {sum(n.op == 'kernel' for n in graph.nodes)} kernels")
        if plain and kind == "inference":  # AOTAutograd passes the inputs Dynamo checked straight in
            ctx.guarded_contiguous = guarded
        run, detail = build(graph, ctx, backend)
    progress(f"{backend} code generated and loaded")
    if options.profile:  # the least any program of this graph moves: its inputs read, its outputs written once
        detail["min_bytes"] = sum(x.type.nbytes for x in graph.inputs) + sum(
            o.type.nbytes for o in dict.fromkeys(o for o in graph.outputs if o is not None))
    memo = _memo_key(cache_key, options) if plain and hit != "memo" and not graph.constants else None
    if memo is not None:
        _built[memo] = Built(graph, fx_nodes, externs, ctx.arena_bytes, ctx.remat_bytes_saved, ctx.artifacts)
        while len(_built) > BUILT_MEMO:
            _built.popitem(last=False)
    if hit is not None:
        detail = {"graph_cache": hit, **detail}
    if sizes:  # which dimensions are symbolic, and what minicomp's own decisions guarded
        detail = {**detail, "symbolic": _symbolic_inputs(graph), "guards": list(guards)}
    g = GraphReport(name, kind, backend, fx_nodes, len(graph.nodes), externs, time.perf_counter() - t0, detail,
                    ctx.phases_ms)
    report.graphs.append(g)
    ctx.dump.summary(f"{g}; phases: {g.phases()}")
    log.info("%s", g)

    program = run
    run = _with_sizes(run, tensor_positions(gm), len(example_inputs), graph, size_outputs, size_positions(gm))
    if sizes:
        run = _outside_sizes_in_torch(run, gm, report, name)
    run = with_input_views(run, gm, laid_out(kind, gm), hidden)
    permuted = nhwc_positions(gm)  # a backward's saved [N,H,W,C] inputs (output_layout.py)

    def boxed(args):
        for i, dims in permuted.items():
            args[i] = args[i].permute(dims)
        out = run(*args)
        args.clear()  # boxed convention: drop our references to the inputs early
        return out
    boxed._boxed_call = True
    boxed.run, boxed.plain = run, plain
    if kind == "backward" and hasattr(program, "release"):  # api._release: autograd graphs may call it later
        program.called_by_autograd = True
    report.runs.append(program)
    return boxed


def _with_sizes(run, positions: list, n_inputs: int, graph, sizes_out: dict, given_at: dict):
    """The program's call with Dynamo's calling convention: sizes among the inputs are dropped (the
    program reads them from the tensors' shapes), sizes among the outputs (`sizes_out`: position ->
    size) computed from the inputs."""
    if len(positions) == n_inputs and not sizes_out:
        return run
    types = [x.type.shape for x in graph.inputs]
    given = [given_at[s] for s in graph.size_inputs]  # where the sizes passed as ints are among the args

    def call(*args):
        tensors = [args[i] for i in positions]
        out = run(*tensors, sizes=tuple(int(args[i]) for i in given)) if given else run(*tensors)
        if sizes_out:
            values: dict = {}
            values.update((s, int(args[i])) for s, i in zip(graph.size_inputs, given))
            sym_values.bind_inputs(types, tensors, values)
            out = list(out)
            for i, s in sizes_out.items():
                out[i] = sym_values.concrete(s, values)
        return out
    return call


def _outside_sizes_in_torch(run, gm, report: Report, name: str):
    """A call whose sizes break a guard of the symbolic program's that Dynamo does not check (it
    reasons about sizes as if they were at least 2: a size 0 or 1 can reach the program) runs the
    traced graph in torch: right results, and torch's own error where the op has none for those
    sizes (max over an empty dimension)."""
    said = []

    def call(*args):
        try:
            return run(*args)
        except SizesOutsideProgram as e:
            if not said:
                said.append(f"{name}: calls with sizes outside its program's guards ({'; '.join(e.failed)}: "
                            f"{e.values}) run the graph in torch")
                log.warning("%s", said[0])
                report.eager.append(said[0])
            return gm(*args)
    return call


def _symbolic_inputs(graph) -> list:
    """`x: f32[s0,768]` for each input with a symbolic dimension."""
    return [f"{x.name}: {x.type}" for x in graph.inputs if x.type.symbolic]


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


def _direct(run):
    """AOTAutograd's inference wrapper when it has nothing to do (see graph_cache.plain_wrapper): the
    flat inputs in, the outputs out, grad mode off during the call. Without its generic wrapper a
    call saves about 1.2 us; grad mode set and restored directly, not by `torch.no_grad()`, 1.7 more."""
    grad_enabled, set_grad = torch.is_grad_enabled, torch._C._set_grad_enabled

    def call(*args):
        if grad_enabled():
            set_grad(False)
            try:
                return run(*args)
            finally:
                set_grad(True)
        return run(*args)
    return call


def _partition_kernel_ops(options: Options):
    """The kernel ops the partitioner's fusion rules use: those of the backend the joint graph's
    inputs will run on (the `interpret` oracle partitions as `cpu` would, so it checks that cut)."""
    def kernel_ops_for(joint_inputs):
        from ..backends import kernel_ops, resolve_backend
        leaves = [x for x in joint_inputs if isinstance(x, torch.Tensor)] if isinstance(joint_inputs, (list, tuple)) else []
        flat = [y for x in joint_inputs for y in (x if isinstance(x, (list, tuple)) else [x])
                if isinstance(y, torch.Tensor)] if not leaves else leaves
        device = "cuda" if any(x.device.type == "cuda" for x in flat) else "cpu"
        ops, _ = kernel_ops(resolve_backend(options.backend, device))
        return ops if ops is not None else kernel_ops("cpu")[0]
    return kernel_ops_for


def prepare(options: Options, inputs) -> None:
    """Before a compile traces: start what the backend can already (backends.prepare)."""
    from ..backends import prepare as prepare_backend
    prepare_backend(options.backend, inputs)


def make_backend(options: Options, report: Report):
    """A Dynamo backend that compiles every captured graph with `options` into `report`. A graph
    found in the graph cache (graph_cache.py) skips AOTAutograd and lowering."""
    state = {"key": None, "compiled": None, "guarded": frozenset()}  # the Dynamo graph being compiled

    def fw(gm, example_inputs):
        return compile_fx_graph(gm, example_inputs, options, report, "forward")

    def bw(gm, example_inputs):
        return compile_fx_graph(gm, example_inputs, options, report, "backward")

    def inference(gm, example_inputs):
        state["compiled"] = compile_fx_graph(gm, example_inputs, options, report, "inference",
                                             cache_key=state["key"], guarded=state["guarded"])
        return state["compiled"]
    aot = decompositions.aot_backend(fw_compiler=fw, bw_compiler=bw, inference_compiler=inference,
                                     partition_fn=make_partition(options, report, _partition_kernel_ops(options)))

    def backend(gm, example_inputs):
        key = graph_cache.graph_key(gm, example_inputs, options.strict)
        guarded = guarded_contiguous(gm, example_inputs)
        if key is not None:
            cached = built(key, options) or graph_cache.load(key, "inference")
            if cached is not None:
                return _direct(compile_fx_graph(gm, example_inputs, options, report, "inference",
                                                cache_key=key, cached=cached, guarded=guarded).run)
        state.update(key=key, compiled=None, guarded=guarded)
        first, t_aot = len(report.graphs), time.perf_counter()
        try:
            wrapped = aot(gm, example_inputs)
            ours = state["compiled"]
        finally:
            state.update(key=None, compiled=None, guarded=frozenset())
        ours_s = sum(g.compile_s for g in report.graphs[first:])
        if len(report.graphs) > first:  # AOTAutograd's own tracing (and the partition) around our compiles
            report.graphs[first].phases_ms["aot_autograd"] = _ms(time.perf_counter() - t_aot - ours_s)
        if (getattr(ours, "plain", False) and not torch._C._is_any_autocast_enabled()
                and not list(gm.parameters()) and not list(gm.buffers())):
            return _direct(ours.run)  # the same flat inputs AOTAutograd would pass
        return wrapped
    return backend


# torch.compile's modes: what each asks of Inductor, as far as minicomp has it (CUDA Graph replay
# is on unless asked off; there is nothing to autotune)
MODES = {"default": {}, "reduce-overhead": {}, "max-autotune": {}, "max-autotune-no-cudagraphs": {"cuda_graphs": False}}


def minicomp_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """The `torch.compile(..., backend="minicomp", options={...})` entry point (or `mode=...`: torch
    takes one or the other)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"minicomp: unknown mode {mode!r}; torch.compile's modes are {', '.join(MODES)}")
    opts = Options.make(**{**MODES.get(mode, {}), **Options.checked(options or {})})
    return make_backend(opts, Report())(gm, example_inputs)
