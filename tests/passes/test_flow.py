"""The min cut under the training partitioner (compiler/passes/flow.py): its sink side is networkx's
minimum_cut's on the same network, built the usual way; a network whose source and sink are joined
by infinite edges raises, and the partitioner then names the values on that path."""
from __future__ import annotations

import random

import networkx as nx
import pytest

from minicomp.compiler.passes import flow, partition
from minicomp.errors import MinicompError
from tests.passes.test_partition import MLP, _graph


def _networks(seed: int):
    """Random layered networks like the partitioner's: finite and infinite edges, repeated edges."""
    rng = random.Random(seed)
    nodes = ["source"] + [f"n{i}" for i in range(rng.randint(2, 30))] + ["sink"]
    edges = []
    for i, u in enumerate(nodes[:-1]):
        for v in rng.sample(nodes[i + 1:], min(len(nodes) - i - 1, rng.randint(1, 3))):
            edges.append((u, v, None if rng.random() < 0.3 else rng.randint(1, 50)))
    edges += rng.sample(edges, min(3, len(edges)))
    return edges


@pytest.mark.parametrize("seed", range(40))
def test_the_sink_side_is_networkx_minimum_cuts(seed):
    edges = _networks(seed)
    g = nx.DiGraph()
    g.add_nodes_from(("source", "sink"))
    for u, v, c in edges:
        g.add_edge(u, v, **({} if c is None else {"capacity": c}))
    try:
        _, (_, want) = nx.minimum_cut(g, "source", "sink")
    except nx.NetworkXUnbounded:
        with pytest.raises(nx.NetworkXUnbounded):
            flow.sink_side(edges, "source", "sink")
        path = flow.infinite_path(edges, "source", "sink")
        assert path[0] == "source" and path[-1] == "sink"
        assert all(g[u][v].get("capacity") is None for u, v in zip(path, path[1:]))
        return
    assert flow.sink_side(edges, "source", "sink") == set(want)
    assert flow.infinite_path(edges, "source", "sink") == []


def test_a_value_that_can_be_neither_saved_nor_recomputed_is_named():
    g = _graph(MLP)
    gelu = next(n for n in g.nodes if n.op == "gelu")  # w2's gradient reads it through a permute
    with pytest.raises(MinicompError, match=r"neither be saved nor recomputed: gelu:f32\[4,16\] -> permute"):
        partition.min_cut(g, 1, {gelu: "banned"}, lambda n: n.op not in ("gelu", "permute"), lambda n: False)
