"""Pass tests are 'this IR text in, that IR text out', plus both graphs run through `interpret` on
random inputs and agree (the pass changed the graph, not the numbers)."""
from __future__ import annotations

import textwrap

import torch

from minicomp.ir import DTYPES, interpret, parse, sym, verify


def ir(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def random_inputs(graph, seed=0, sizes=None):
    """Inputs for `graph`; a symbolic graph's at `sizes` (symbol -> int; default 5 each)."""
    gen = torch.Generator().manual_seed(seed)
    sizes = sizes or {s: 5 for s in graph.sizes}
    out = []
    for n in graph.inputs:
        shape, dtype = tuple(sym.evaluate(d, sizes) for d in n.type.shape), DTYPES[n.type.dtype]
        if dtype == torch.bool:
            out.append(torch.rand(shape, generator=gen) > 0.5)
        elif dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dtype))
        else:
            out.append(torch.randint(-5, 6, shape, generator=gen).to(dtype))
    return out


def check_pass(run, before: str, after: str, seeds=(0, 1, 2)):
    """Run pass `run` on `before`; its printed result must equal `after` and compute the same values
    (a symbolic graph's at several sizes of each symbol, one seed each)."""
    before, after = ir(before), ir(after)
    reference = verify(parse(before))
    with sym.scope(reference.sizes):
        result = verify(run(verify(parse(before)), None))
    assert str(result) == after, f"pass output:\n{result}\nexpected:\n{after}"
    at = [None] * len(seeds) if not reference.sizes else [{s: n for s in reference.sizes} for n in (2, 3, 17)]
    for seed, sizes in zip(seeds, at):
        inputs = random_inputs(reference, seed, sizes)
        for got, want in zip(interpret(result, *inputs), interpret(reference, *inputs), strict=True):
            if want is None:
                assert got is None
            else:
                assert got.dtype == want.dtype and got.shape == want.shape
                torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    return result
