"""Scheduling: given which values live in memory (buffers.py), group the rest of the graph into
kernels.

The model is inline-by-default: a value without a buffer is recomputed inside every kernel that
uses it (kernelize.py), so fusing a producer into a consumer costs nothing to decide. What this
module decides is *grouping*: each value that must be stored (a graph output, an extern's operand,
a reduction) joins the most recent compatible kernel, else starts one:
  - a reduction joins a row kernel over the same (shape, reduced dims) -- softmax's max and sum,
    layer_norm's mean and variance -- or turns a same-shape pointwise kernel into one;
  - a stored value joins the row kernel whose reductions it uses (epilogue, inner or outer level),
    else a kernel of its shape that reads what it reads (horizontal fusion);
  - a kernel can only be joined if everything the newcomer loads is produced by earlier steps.
Each refusal is recorded with its reason for the fusion report.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import OPS, Graph, Node
from .buffers import runs_in_torch, stored_anyway
from .kernelize import KernelBuilder, NotFusable, prefix_reshape


@dataclass
class KernelStep:
    builder: KernelBuilder
    roots: list = field(default_factory=list)      # stored nodes (and reductions) in order added


@dataclass
class Schedule:
    steps: list                  # Node (runs in torch: extern, matmul, view of a buffer) or KernelStep
    materialized: set            # values with a buffer
    refusals: dict               # (node, kernel name) -> reason
    why_materialized: dict       # node -> reason


def _reduction_reads(graph: Graph, kernel_ops) -> dict:
    """{(value, reduced dims): the reductions (sum, prod, amax, amin) over those dims of a pointwise
    expression of that value, of the reduced input's shape}: the kernels a column sum of the value
    could join."""
    out: dict = {}
    for r in graph.nodes:
        if r.op not in ("sum", "prod", "amax", "amin") or runs_in_torch(r, kernel_ops):
            continue
        key, shape = tuple(sorted(r.attrs["dims"])), r.args[0].type.shape
        seen, stack = set(), [r.args[0]]
        while stack:
            x = stack.pop()
            if x in seen or x.type.shape != shape:
                continue
            seen.add(x)
            out.setdefault((x, key), set()).add(r)
            if x.op in OPS and OPS[x.op].category == "pointwise" and not runs_in_torch(x, kernel_ops):
                stack.extend(a for a in x.args if isinstance(a, Node))
    return out


class Scheduler:
    def __init__(self, graph: Graph, materialized: set, why: dict, kernel_ops):
        self.graph, self.M, self.why, self.kernel_ops = graph, materialized, why, kernel_ops
        self.steps: list = []
        self.kernels = 0              # kernel steps so far (the next one's number)
        self.producer: dict = {}      # node -> step index that computes it
        self.red_step: dict = {}      # reduction node -> step index
        self.refusals: dict = {}
        self.torch_views: set = set()
        self.last_error: NotFusable | None = None
        self.order = {n: i for i, n in enumerate(graph.nodes)}
        self.stored_anyway = stored_anyway(graph, kernel_ops)
        self.reduction_reads = None  # made at the first column sum of a stored value (_reduction_reads)

    def has_buffer(self, node: Node) -> bool:
        """In memory, contiguous: inputs, constants, stored values, results of torch ops (not torch
        views of them, which kernels read through as index math)."""
        if node.op in ("input", "constant") or node in self.M:
            return True
        return node in self.producer and node not in self.torch_views and not isinstance(
            self.steps[self.producer[node]], KernelStep)

    # -- dependencies --------------------------------------------------------------------------------
    def frontier(self, node: Node, stop) -> set:
        """The nodes `node` reaches through the values it would inline, stopping where stop(n)."""
        out, seen, stack = set(), set(), list(node.args)
        while stack:
            a = stack.pop()
            if a in seen:
                continue
            seen.add(a)
            if stop(a):
                out.add(a)
            elif a.op not in ("input", "constant"):
                stack.extend(a.args)
        return out

    def deps(self, node: Node) -> set:
        """Step indices whose results `node` needs."""
        reached = self.frontier(node, lambda a: self.has_buffer(a) or a in self.red_step)
        return {self.producer[a] for a in reached if a in self.producer}

    # -- placing -----------------------------------------------------------------------------------
    def _try(self, step_i: int, node: Node, add) -> bool:
        step = self.steps[step_i]
        mark = step.builder.mark()
        try:
            add(step.builder, node)
        except NotFusable as e:
            step.builder.reset(mark)
            self.refusals[(node, step.builder.name)] = e.reason
            # without its traceback: the frames it holds hold this scheduler, a cycle that made every
            # schedule (its kernels, expressions and nodes) garbage only the cycle collector frees
            self.last_error = e.with_traceback(None)
            return False
        step.roots.append(node)
        self.producer[node] = step_i
        if OPS[node.op].category == "reduction":
            self.red_step[node] = step_i
        return True

    def _new_kernel(self, node: Node, shape, dims, add):
        self.steps.append(KernelStep(KernelBuilder(f"k{self.kernels}", shape, dims, self.has_buffer, self.order)))
        if not self._try(len(self.steps) - 1, node, add):
            self.steps.pop()
            e = self.last_error  # raised as a copy: the one kept would get this frame's traceback
            raise NotFusable(e.node, e.reason, e.materialize)  # names the value to materialize
        self.kernels += 1

    def _candidates(self, node: Node, deps=None):
        """Kernel steps after every step `node` depends on (`deps`, found if not given), most recent first."""
        first = max(self.deps(node) if deps is None else deps, default=0)  # a kernel that produced one may take it in
        for i in range(len(self.steps) - 1, first - 1, -1):
            if isinstance(self.steps[i], KernelStep):
                yield i

    def place_reduction(self, node: Node) -> None:
        shape = node.args[0].type.shape
        dims = tuple(node.attrs["dims"] if "dims" in node.attrs else (node.attrs["dim"],))
        add = KernelBuilder.add_reduction
        for i in self._candidates(node):
            b = self.steps[i].builder
            if (b.shape, b.reduce_dims) == (shape, dims) and self._try(i, node, add):
                return
            if (not b.reduce_dims and (b.shape == shape or prefix_reshape(b.shape, shape))
                    and self._convert(i, shape, dims) and self._try(i, node, add)):
                return
            self.refusals.setdefault((node, b.name), f"kernel {b.name} iterates {b.shape} over dims "
                                                     f"{b.reduce_dims}, not {shape} over {dims}")
        self._new_kernel(node, shape, dims, add)

    def _convert(self, i: int, shape, dims) -> bool:
        """Re-open a pointwise kernel as a row kernel over `shape` (as many elements as its own, a
        reshape of it) reducing `dims`: its stores become inner stores."""
        old = self.steps[i]
        nb = KernelBuilder(old.builder.name, shape, dims, self.has_buffer, self.order)
        try:
            for r in old.roots:
                nb.add_store(r)
        except NotFusable:
            return False
        old.builder = nb
        return True

    def place_store(self, node: Node) -> None:
        mine = self.deps(node)
        loads = None  # what it would load: the same for every candidate (a refused try changes nothing)
        for i in self._candidates(node, mine):
            b = self.steps[i].builder
            if b.level_of(node) is None:
                self.refusals.setdefault((node, b.name), f"shape {node.type.shape} does not fit kernel "
                                                         f"{b.name}'s domain {b.shape}")
                continue
            if i not in mine and loads is None:
                loads = self.frontier(node, self.has_buffer)
            related = i in mine or any(n in b.buf_pos for n in loads)
            if not related:
                self.refusals.setdefault((node, b.name), f"shares no input with kernel {b.name}")
                continue
            if self._try(i, node, KernelBuilder.add_store):
                return
        self._new_kernel(node, node.type.shape, (), KernelBuilder.add_store)

    def place(self, node: Node) -> None:
        """Place `node`; a value it needs from memory that has no buffer yet gets one first (a
        reduction already placed is then stored by its kernel; anything else is placed now, before
        `node` -- its own dependencies are all placed already)."""
        while True:
            try:
                if OPS[node.op].category == "reduction":
                    self.place_reduction(node)
                else:
                    self.place_store(node)
                return
            except NotFusable as e:
                if not e.materialize or e.node in self.M:
                    raise
                self.M.add(e.node)
                self.why[e.node] = e.reason
                if e.node not in self.producer:
                    self.place(e.node)

    def column_sum_in_torch(self, node: Node) -> bool:
        """A sum down the columns (the last dim kept: a bias gradient) of a value stored anyway (a
        matmul's operand or result, an input) runs in torch: with nothing to fuse into it, torch's
        reduction (each thread summing whole rows of its own, then combined) streams a little faster
        than our column kernels (codegen/columns.py: each thread a tile of columns down all the rows).
        Unless a kernel sums it down those columns already: then it is one more accumulator there
        (a layer_norm's bias gradient beside its weight gradient: 3 torch calls fewer per NormStack
        backward)."""
        if node.op != "sum" or node.args[0].type.ndim < 2 or node.args[0].type.ndim - 1 in node.attrs["dims"]:
            return False
        x = node.args[0]
        if not (x.op in ("input", "constant") or x in self.stored_anyway and self._in_memory(x)):
            return False
        # another reduction over the same dims reads x (a layer_norm's weight gradient, sum(dy * x_hat),
        # beside its bias gradient, sum(dy)): the sum joins that kernel, one more accumulator per column
        if self.reduction_reads is None:
            self.reduction_reads = _reduction_reads(self.graph, self.kernel_ops)
        return not self.reduction_reads.get((x, tuple(sorted(node.attrs["dims"]))), set()) - {node}

    def _in_memory(self, x: Node) -> bool:
        """Whether a step gives x memory a torch op can read: a torch op's result, a torch view, or a
        stored value. A value torch reads only through a view that would copy is not: the view's
        copy is what is stored (required_buffers), so stored_anyway's walk up the views overstates."""
        return x in self.M or x in self.torch_views or runs_in_torch(x, self.kernel_ops)

    def run(self) -> Schedule:
        for node in self.graph.nodes:
            if node.op == "constant":
                continue
            if runs_in_torch(node, self.kernel_ops) or node in self.torch_views or self.column_sum_in_torch(node):
                self.steps.append(node)
                self.producer[node] = len(self.steps) - 1
            elif OPS[node.op].category == "reduction" or node in self.M:
                self.place(node)
        for step in self.steps:  # done adding: a builder keeping this scheduler would make a cycle of both
            if isinstance(step, KernelStep):
                step.builder.has_buffer = None
        return Schedule(self.steps, self.M, self.refusals, self.why)


def schedule(graph: Graph, M: set, why: dict, views: set, kernel_ops) -> Schedule:
    """Group the graph into kernels; values the kernels cannot share without memory join M."""
    sch = Scheduler(graph, M, why, kernel_ops)
    sch.torch_views = views
    return sch.run()
