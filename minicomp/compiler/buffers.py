"""Which values need memory whatever the fusion, and how torch reads them: graph outputs and the
operands of ops that run in torch (matmuls, externs) get a buffer; an operand that is a view of a
value is read as a torch view of that value's buffer unless torch would copy to make it (then a
kernel writes the operand itself). The answers about views (does torch copy, is the view
contiguous, which way do its last two dims run) come from running the views on meta tensors,
memoized. schedule.py groups the rest into kernels around these buffers.
"""
from __future__ import annotations

from ..backends.layout import CONTIGUOUS_TORCH_OPS, ORDERED_OPERANDS, meta_of, real_meta
from ..ir import OPS, Graph, Node, sym_values
from ..ir.ops import view_target
from .output_layout import is_layout_view

TORCH_CATEGORIES = ("matmul", "extern", "tuple")
VIEW_OPS = ("reshape", "permute", "expand", "slice")


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
