"""Index-set splitting (codegen/pieces.py): a cat kernel runs one loop nest per part, each reading
only its part, contiguously; every result is compared with eager, on one thread and on several."""
from __future__ import annotations

import re
import textwrap

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.codegen.collapse import collapse
from minicomp.codegen.llvm_module import generate_module
from minicomp.codegen.pieces import split
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import parse
from minicomp.ir.index import Var
from minicomp.ir.kernel import walk
from minicomp.runtime import cpu, llvm_jit

from tests.codegen.test_cpu_ops import cpu_context

# the backward of `q, k, v = qkv(x).split(C, dim=2)` with heads: three (B, H, T, hs) gradients back
# to (B, T, 3C) -- the transposing cat the GPT block's backward runs
HEADS_CAT = """
    graph heads(%q: f32[4,4,64,32], %k: f32[4,4,64,32], %v: f32[4,4,64,32]) -> (f32[4,64,384]) {
      %0: f32[4,64,4,32] = permute %q [dims=(0, 2, 1, 3)]
      %1: f32[4,64,128] = reshape %0 [shape=(4, 64, 128)]
      %2: f32[4,64,4,32] = permute %k [dims=(0, 2, 1, 3)]
      %3: f32[4,64,128] = reshape %2 [shape=(4, 64, 128)]
      %4: f32[4,64,4,32] = permute %v [dims=(0, 2, 1, 3)]
      %5: f32[4,64,128] = reshape %4 [shape=(4, 64, 128)]
      %6: f32[4,64,384] = cat %1 %3 %5 [dim=2]
      return %6
    }"""


def kernels(text: str):
    graph = parse(textwrap.dedent(text).lstrip("\n"))
    return [n.meta["kernel"] for n in run_passes(graph, cpu_context(graph)).nodes if n.op == "kernel"]


def test_each_part_of_a_heads_cat_is_one_contiguous_loop_nest():
    k, = kernels(HEADS_CAT)
    pieces = split(collapse(k))
    assert [(p.pos, p.lo, p.hi) for p in pieces] == [(2, 0, 128), (2, 128, 256), (2, 256, 384)]
    for part, p in enumerate(pieces):
        ops = {e.op for s in p.kernel.outer_stores for e in walk([s.value])}
        loads = [e for s in p.kernel.outer_stores for e in walk([s.value]) if e.op == "load"]
        assert ops == {"load"}, f"piece {part}: the where chain folds away, only its part is read: {ops}"
        assert [x.attrs["buf"] for x in loads] == [part]
        index = loads[0].attrs["index"]
        inner = p.kernel.outer[-1]
        assert index.is_affine() and index.coeff(inner) == 1 and inner.size == 32, \
            f"piece {part}: heads tiled, the innermost loop reads contiguously: {index}"
        assert all(isinstance(v, Var) for v in p.kernel.outer)
    optimized = llvm_jit.optimize(generate_module([k])[0])
    assert re.search(r"load <\d+ x float>|@llvm\.memcpy", optimized), "each piece's rows copy as blocks"
    assert " select " not in optimized, "no per-element choice between parts is left"


def test_kernels_without_comparisons_against_constants_do_not_split():
    k, = kernels("""
        graph f(%x: f32[64,128]) -> (f32[64,128]) {
          %0: f32[64,128] = cos %x
          return %0
        }""")
    assert split(collapse(k)) is None


def heads_cat(q, k, v):
    B, H, T, hs = q.shape
    return torch.cat([t.transpose(1, 2).reshape(B, T, H * hs) for t in (q, k, v)], dim=2) * 2


CASES = {
    "heads": (heads_cat, lambda: [torch.randn(2, 3, 5, 4) for _ in range(3)]),
    "dim0": (lambda a, b, c: torch.cat([a.sin(), b * 2, c.t()], 0), lambda: [torch.randn(3, 7), torch.randn(1, 7),
                                                                           torch.randn(7, 5)]),
    "dim1 uneven": (lambda a, b: torch.cat([a, b.exp(), a[:, :2]], 1) + 1, lambda: [torch.randn(9, 5), torch.randn(9, 3)]),
    "last dim, 1-d": (lambda a, b: torch.cat([a, b, a]).cos(), lambda: [torch.randn(1000), torch.randn(31)]),
    "pad": (lambda x: F.pad(x.tanh(), (2, 3, 1, 0), value=-1.5), lambda: [torch.randn(6, 11)]),
    "broadcast part": (lambda a, b: torch.cat([a.expand(4, 6), b], 0) * 3, lambda: [torch.randn(1, 6), torch.randn(2, 6)]),
}


@pytest.mark.parametrize("cores", [1, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_split_kernels_match_eager_on_one_thread_and_several(case, cores, monkeypatch):
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 1)  # threads even for these small kernels
    monkeypatch.setattr(cpu, "threads", lambda: cores)
    fn, make = CASES[case]
    args = make()
    torch.testing.assert_close(minicomp.compile(fn, backend="cpu")(*args), fn(*args))
