"""The backward's order (compiler/passes/fusion_order.py) on small dependency graphs: a torch op
reading a recomputed value waits for the backward nodes reading what it is recomputed from, every
recomputed value runs just before its first user, and every dependency is kept."""
from __future__ import annotations

from minicomp.compiler.passes.fusion_order import fusion_order

# AOTAutograd's order for y = down(silu(g) * u): the weight gradient mm(dy, p) first, then dp, then
# silu's backward, which reads g and u, from which p is recomputed
ARGS = {
    "g": [], "u": [], "W": [], "dy": [],            # saved g and u, a parameter, the tangent
    "silu": ["g"], "p": ["silu", "u"],               # recomputed
    "dW": ["dy", "p"],                               # torch: the weight gradient
    "dp": ["dy", "W"],                               # torch: the input gradient
    "du": ["dp", "silu"], "dg": ["dp", "u", "g"],    # silu's backward (one kernel)
    "dx": ["du", "dg"],
}
NODES = list(ARGS)
TORCH = {"dW", "dp", "dx"}


def _order(args=ARGS, nodes=NODES, recomputed=frozenset({"silu", "p"}), params=("W",)):
    order = fusion_order(nodes, lambda n: args[n], set(recomputed), lambda n: n in TORCH,
                         lambda n: n not in params and n != "dy")
    assert sorted(order) == sorted(nodes)
    at = {n: i for i, n in enumerate(order)}
    assert all(at[a] < at[n] for n in nodes for a in args[n])  # every dependency kept
    return order, at


def test_weight_gradient_waits_for_the_kernel_reading_what_its_operand_is_recomputed_from():
    order, at = _order()
    assert at["dW"] > at["dg"] and at["dW"] > at["du"]
    assert at["p"] == at["dW"] - 1  # recomputed just before its first user
    assert at["silu"] < at["du"]    # silu's backward reads it too: before its first user there
    assert at["dp"] < at["du"]


def test_without_siblings_the_order_is_kept():
    args = {"x": [], "dy": [], "r": ["x"], "dW": ["dy", "r"], "dx": ["dy"]}
    order, _ = _order(args, list(args), {"r"})
    assert order == ["x", "dy", "r", "dW", "dx"]


def test_a_parameter_makes_no_siblings():
    """A tied weight is read by backward nodes layers apart: reading it does not make a sibling."""
    args = {"E": [], "dy": [], "rows": ["E"], "dW": ["dy", "rows"], "a": ["dy"], "late": ["a", "E"]}
    order, at = _order(args, list(args), {"rows"}, params=("E",))
    assert at["dW"] < at["late"]


def test_a_node_that_depends_on_the_torch_op_is_no_sibling():
    args = {"s": [], "dy": [], "r": ["s"], "dW": ["dy", "r"], "after": ["dW", "s"], "other": ["dy", "s"]}
    order, at = _order(args, list(args), {"r"})
    assert at["dW"] > at["other"] and at["after"] > at["dW"]
