"""The tensor-level passes, in pipeline order, on the real graphs in tests/ir/golden: the result
verifies after each pass and interprets to the same values as the untouched graph."""
import pathlib

import pytest
import torch

from minicomp.compiler.pipeline import TENSOR_PASSES
from minicomp.ir import interpret, parse, verify

from .check import random_inputs

GOLDEN = pathlib.Path(__file__).parent.parent / "ir" / "golden"


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.ir")), ids=lambda p: p.stem)
def test_passes_keep_the_values_of_real_graphs(path):
    assert [name for name, _ in TENSOR_PASSES] == ["simplify_views", "fold_constants", "cse", "dce"]
    reference = parse(path.read_text())
    graph = parse(path.read_text())
    for name, fn in TENSOR_PASSES:
        graph = verify(fn(graph, None))
    assert len(graph.nodes) <= len(reference.nodes)
    inputs = random_inputs(reference)
    if path.stem == "views_inference":  # its index input must be in range
        inputs[1] = torch.tensor([5, 0, 2])
    for got, want in zip(interpret(graph, *inputs), interpret(reference, *inputs), strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, equal_nan=True)


def test_cse_merges_the_repeated_centering_in_layer_norm():
    graph = parse((GOLDEN / "reductions_inference.ir").read_text())
    for name, fn in TENSOR_PASSES:
        graph = fn(graph, None)
    ops = [n.op for n in graph.nodes]
    assert ops.count("sub") == 1 and ops.count("full") == 3, str(graph)  # 8.0 once, 1e-05, 3.0
