"""Outputs share memory exactly where eager's do: the IR has no clones and CSE merges equal values,
so two outputs could come out of one buffer; views of one value (returned or not) must share it."""
from __future__ import annotations

import pytest
import torch

import minicomp


SHARING = {  # outputs that eager returns as separate tensors, or as one tensor twice
    "value_and_clone_view": lambda x: (lambda z: (z, z.clone().view(-1)))(x.sin()),
    "view_and_clone": lambda x: (lambda z: (z.view(-1), z.clone()))(x * 2),
    "view_and_recomputed": lambda x: ((x * 2).view(-1), x * 2),
    "two_views_of_two_products": lambda x: ((x * 2).view(-1), (x * 2).reshape(2, -1)),
    "matmul_view_and_matmul": lambda x: ((x @ x.t()).view(-1), x @ x.t()),
    "same_sum_twice": lambda x: (x + 1, x + 1),
    "same_transpose_twice": lambda x: ((x * 2).t(), (x * 2).t()),
    "one_tensor_twice": lambda x: (lambda y: (y, y))(x + 1),
    "two_views_of_a_value_not_returned": lambda x: (lambda y: (y[1:], y.t()))(x * 2),
    "split_of_a_value_not_returned": lambda x: (x * 2).split(2),
    "a_value_and_its_view": lambda x: (lambda y: (y, y[1:]))(x * 2),
    "a_value_and_its_clone": lambda x: (lambda y: (y, y.clone()))(x + 1),
    "views_and_a_clone_of_their_value": lambda x: (lambda y: (y.t(), y.clone(), y[1:]))(x + 1),
    "pieces_and_a_cat_of_their_value": lambda x: (lambda y: (y.unbind(0)[0], torch.cat([y]), y.unbind(0)[1]))(x + 1),
}


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_outputs_viewing_one_value_share_memory_in_every_compile(backend):
    """y, y[1:], y.t() (and y[1:], y.t() without y) are views of one storage in eager: a write into
    one shows in the others. A second compile of the same function takes the graph cache's path
    (Dynamo's graph, not AOTAutograd's), where the views were lost."""
    def f(x):
        y = x * 2
        return y, y[1:], y.t()

    def g(x):
        y = x * 2
        return y[1:], y.t()
    for fn in (f, g, f, g):
        out = minicomp.compile(fn, backend=backend)(torch.ones(3, 2))
        want = fn(torch.ones(3, 2))
        out[-2][0, 0] = 77.0  # y[1, 0]
        want[-2][0, 0] = 77.0
        for a, b in zip(out, want):
            assert torch.equal(a, b) and a.stride() == b.stride()


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
@pytest.mark.parametrize("case", sorted(SHARING))
def test_outputs_share_memory_exactly_where_eagers_do(case, backend):
    """The IR has no clones and CSE merges equal values, so two outputs could come out of one
    buffer: an in-place op on one would then change the other, where eager's are separate."""
    fn = SHARING[case]
    x = torch.randn(4, 4)
    got, want = minicomp.compile(fn, backend=backend)(x), fn(x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    def shared(pair):
        return pair[0].untyped_storage().data_ptr() == pair[1].untyped_storage().data_ptr()
    assert shared(got) == shared(want)
