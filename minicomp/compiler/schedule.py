"""Scheduling: given which values live in memory, group the rest of the graph into kernels.

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

from ..backends.layout import CONTIGUOUS_TORCH_OPS, ORDERED_OPERANDS, meta_of, real_meta
from ..ir import OPS, Graph, Node, sym_values
from ..ir.ops import view_target
from .kernelize import KernelBuilder, NotFusable, prefix_reshape
from .output_layout import is_layout_view

TORCH_CATEGORIES = ("matmul", "extern", "tuple")
VIEW_OPS = ("reshape", "permute", "expand", "slice")


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


def runs_in_torch(node: Node, kernel_ops) -> bool:
    cat = OPS[node.op].category
    if cat in TORCH_CATEGORIES:
        return True
    if cat in ("pointwise", "reduction") and (node.op not in kernel_ops or node.type.dtype in ("c64", "c128")
                                              or any(a.type.dtype in ("c64", "c128") for a in node.args)):
        return True
    return False


def stored_anyway(graph: Graph, kernel_ops) -> set:
    """The values in memory whatever fuses: graph outputs and the operands and results of torch ops,
    and the value each of those views (a matmul over `dy.reshape(B*T, C)` reads dy's buffer)."""
    out = set()
    for n in [o for o in graph.outputs if o is not None] + [a for n in graph.nodes if runs_in_torch(n, kernel_ops)
                                                           for a in (n, *n.args)]:
        while n not in out:
            out.add(n)
            if n.op not in OPS or OPS[n.op].category != "view" or not n.args:
                break
            n = n.args[0]
    return out


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


def view_layout(chain: list, base: Node):
    """(meta tensor of contiguous `base`, meta tensor of chain[0]): the views in `chain` (last applied
    first) run on meta tensors, over symbolic sizes at the hints; call under layout.real_meta()."""
    root = t = meta_of(base)
    for v in reversed(chain):
        t = OPS[v.op].ref([t], sym_values.hinted(v.attrs), "meta")
    return root, t


def view_facts(chain: list, base: Node) -> tuple:
    """(torch makes chain[0] from contiguous `base` without a copy, and that view is contiguous, the
    |strides| of its last two dims or None): the views in `chain` (last applied first) run on meta
    tensors. Memoized by the shapes and the views' attributes, which decide all three: fusion asks
    twice or three times per graph (each schedule's required buffers), a training cut once per round,
    and identical layers ask alike; each answer costs a few torch calls on meta tensors."""
    key = (tuple(sym_values.hinted(base.type.shape)),
           tuple((v.op, repr(sym_values.hinted(v.attrs))) for v in chain))
    hit = _view_memo.get(key)
    if hit is None:
        with real_meta():
            root, t = view_layout(chain, base)
            no_copy = t._is_view() and t._base is root
            last_two = (abs(t.stride(-1)), abs(t.stride(-2))) if t.dim() >= 2 else None
            hit = (no_copy, no_copy and t.is_contiguous(), last_two)
        if len(_view_memo) >= VIEW_MEMO_ENTRIES:
            _view_memo.clear()
        _view_memo[key] = hit
    return hit


_view_memo: dict = {}
VIEW_MEMO_ENTRIES = 4096


def view_copies(chain: list, base: Node, kernel_ops) -> bool:
    """Whether torch would copy to run `chain` (views, last applied first) on `base`: a reshape of a
    permuted or sliced view. Known only where base's layout is (contiguous: an input, a constant, a
    value a kernel stores, an mm or bmm result); elsewhere torch decides."""
    if all(v.op != "reshape" for v in chain):  # permute, expand and slice never copy
        return False
    if base.op not in ("input", "constant", *CONTIGUOUS_TORCH_OPS) and runs_in_torch(base, kernel_ops):
        return False
    return not view_facts(chain, base)[0]


TRANSPOSED_OPERANDS = ("mm", "bmm")  # torch ops that read an operand transposed in its last two dims as it is


def swapped_last_two(ndim: int) -> tuple:
    """The permutation that transposes the last two of `ndim` dims."""
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def last_two_strides(reshape: Node, below: list, base: Node, kernel_ops) -> tuple | None:
    """(|stride|, |stride|) of the last two dims of a reshape's input, which is `below` (views of
    `base`, last applied first) -- when the reshape keeps those two dims and torch makes `below`
    without a copy; else None. A kernel writing the reshape in its own order reads along the
    contiguous dim when the first is the smaller, and gathers across rows when it is the larger."""
    if list(reshape.type.shape[-2:]) != list(reshape.args[0].type.shape[-2:]) or reshape.type.ndim < 2 \
            or view_copies(below, base, kernel_ops):
        return None
    return view_facts(below, base)[2]


def _write_untransposed(chain: list, base: Node, kernel_ops) -> bool:
    """Whether a matmul operand `chain[0]` -- a transpose of its last two dims over a reshape that
    torch would copy (attention's q^T: heads split, permuted, batched) -- is better written in the
    reshape's own order and read by the matmul as a transposed view (BLAS takes it so, no copy):
    when that order reads along the contiguous dim (a plain copy, vectorized) instead of gathering
    across rows for every element (passes/orient_operands.py makes k^T take this form)."""
    if len(chain) < 3 or chain[0].op != "permute" or chain[1].op != "reshape" \
            or tuple(chain[0].attrs["dims"]) != swapped_last_two(chain[0].type.ndim):
        return False
    strides = last_two_strides(chain[1], chain[2:], base, kernel_ops)
    return strides is not None and strides[0] < strides[1]


def _view_root(o: Node) -> Node:
    while o.op in VIEW_OPS:
        o = o.args[0]
    return o


def _contiguous_view(o: Node, kernel_ops) -> bool:
    """Whether graph output `o` is a chain of views of a value a kernel or a torch op makes (never an
    input or a constant: that view would alias the caller's tensor) that torch makes without a copy
    and, over a kernel's buffer, comes out contiguous: handed out as that view (a reshaped bias
    gradient) instead of written again. A permuted or sliced one is written as before, in its own
    buffer, contiguous (or in eager's layout: output_layout.py). Only where no other output is that
    value or a view of it: the IR holds no clone, so eager's z and z.clone().view(-1) are one value
    here, and handing both out of one buffer would make them share memory."""
    chain, base = [], o
    while base.op in VIEW_OPS:
        chain.append(base)
        base = base.args[0]
    if not chain or base.op in ("input", "constant") or view_copies(chain, base, kernel_ops):
        return False
    if runs_in_torch(base, kernel_ops) and base.op not in CONTIGUOUS_TORCH_OPS:
        return True  # torch's own view of torch's result, as eager makes it
    return view_facts(chain, base)[1]


def required_buffers(graph: Graph, kernel_ops) -> tuple[set, dict, set]:
    """Values that must live in memory whatever the fusion: graph outputs and the operands of ops
    that run in torch. A torch op's operand that is a view of a value runs as a torch view of that
    value's buffer (no copy kernel) -- unless torch would copy to make that view (a reshape of a
    transposed tensor, as attention's heads are): then a kernel writes the operand itself, reading
    through the views as index math, and can fuse with what computes the value (Inductor's
    clone kernels); a matmul's transposed operand may be written untransposed instead
    (_write_untransposed). A graph output is written to its own buffer; one in eager's layout
    (compiler/output_layout.py) is a permuted view of the buffer its copy writes, and a contiguous
    view of a value (_contiguous_view) a view of that value's buffer."""
    M, why, views = set(), {}, set()

    def need(node: Node, reason: str, allow_view: bool, transposable: bool = False):
        chain, base = [], node
        while allow_view and base.op in VIEW_OPS and base not in M:  # a stored view is read as stored
            chain.append(base)
            base = base.args[0]
        if chain and view_copies(chain, base, kernel_ops):
            if transposable and _write_untransposed(chain, base, kernel_ops):
                chain, base = chain[:1], chain[1]
                reason += " (a torch view would copy; written untransposed, read transposed)"
            else:
                chain, base = [], node
                reason += " (a torch view would copy)"
        if chain:
            views.update(chain)
        if base.op in ("input", "constant") or runs_in_torch(base, kernel_ops) or base in M:
            return
        M.add(base)
        why[base] = reason
    roots = [_view_root(o) for o in graph.outputs if o is not None]
    for o in graph.outputs:
        if o is not None:  # a view only of a value no other output is or views (eager's outputs may not share)
            alone = roots.count(_view_root(o)) == 1
            need(o, "graph output", allow_view=is_layout_view(o) or alone and _contiguous_view(o, kernel_ops))
    for n in graph.nodes:
        if runs_in_torch(n, kernel_ops):
            # a torch view op (view_as_complex) takes its operands contiguous: ir.ops.view_target
            ordered = len(n.args) if n.op == "extern" and view_target(n.attrs["target"]) else ORDERED_OPERANDS.get(n.op, 0)
            for i, a in enumerate(n.args):
                need(a, f"operand of {n.op} (runs in torch)", allow_view=i >= ordered,
                     transposable=n.op in TRANSPOSED_OPERANDS)
    return M, why, views


def schedule(graph: Graph, M: set, why: dict, views: set, kernel_ops) -> Schedule:
    """Group the graph into kernels; values the kernels cannot share without memory join M."""
    sch = Scheduler(graph, M, why, kernel_ops)
    sch.torch_views = views
    return sch.run()
