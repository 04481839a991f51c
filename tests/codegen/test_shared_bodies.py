"""Kernels with one body share one LLVM function (codegen/llvm_module.py body_key): a model of N identical
layers compiles the repeated kernels' loop nests once, its results match eager (outputs and
gradients), and kernels that differ only in shape or dtype keep bodies of their own."""
from __future__ import annotations

import re

import torch

from minicomp.codegen.collapse import collapse
from minicomp.codegen.llvm_module import BODY_DEFINITION, body_key, generate_module
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import parse
from minicomp.models import Block
from tests.codegen.test_cpu_ops import cpu_context
from tests.helpers import assert_matches_eager


def _stack(n: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block(64, 4, 32) for _ in range(n)])


def _graphs(compiled) -> dict:
    return {g.kind: g.detail for g in compiled.report().graphs}


def test_identical_layers_share_bodies_inference():
    x = torch.randn(2, 32, 64)
    with torch.no_grad():
        two = _graphs(assert_matches_eager(_stack(2), x, backend="cpu", grad=False))["inference"]
        three = _graphs(assert_matches_eager(_stack(3), x, backend="cpu", grad=False))["inference"]
    assert three["kernels"] > two["kernels"]  # a third block: more kernels ...
    assert three["llvm_bodies"] == two["llvm_bodies"]  # ... and not one more body to compile
    assert three["llvm_bodies"] < three["kernels"] / 2


def test_identical_layers_share_bodies_training():
    x = torch.randn(2, 32, 64, requires_grad=True)
    two = _graphs(assert_matches_eager(_stack(2), x, backend="cpu"))
    three = _graphs(assert_matches_eager(_stack(3), x, backend="cpu"))
    for kind in ("forward", "backward"):
        assert three[kind]["kernels"] > two[kind]["kernels"], kind
        assert three[kind]["llvm_bodies"] == two[kind]["llvm_bodies"], kind
        assert three[kind]["llvm_bodies"] < three[kind]["kernels"], kind


def _bodies(text: str) -> int:
    return len(BODY_DEFINITION.findall(text))


def _sin_twice(x, y):
    return torch.sin(x) * 2, torch.sin(y) * 2


def test_same_body_shared_and_correct():
    compiled = assert_matches_eager(_sin_twice, torch.randn(64, 32), torch.randn(64, 32), backend="cpu")
    g = compiled.report().graphs[0].detail
    assert (g["kernels"], g["llvm_bodies"]) == (2, 1)


def test_shape_or_dtype_apart_not_shared():
    for y in (torch.randn(64, 16), torch.randn(64, 32, dtype=torch.float64)):
        compiled = assert_matches_eager(_sin_twice, torch.randn(64, 32), y, backend="cpu")
        g = compiled.report().graphs[0].detail
        assert (g["kernels"], g["llvm_bodies"]) == (2, 2), y.shape


def test_body_key_ignores_names_only():
    """The key leaves out the kernel's name and its buffers' graph names (not whether it runs
    whole); the module defines the shared body once and every kernel's entry point calls it."""
    graph = parse("graph g(%x: f32[64,32], %y: f32[64,32]) -> (f32[64,32], f32[64,32]) {\n"
                  "  %0: f32[64,32] = sin %x\n  %1: f32[64,32] = sin %y\n  return %0, %1\n}")
    ks = [n.meta["kernel"] for n in run_passes(graph, cpu_context(graph)).nodes if n.op == "kernel"]
    assert len(ks) == 2 and ks[0].name != ks[1].name
    assert body_key(collapse(ks[0]), True) == body_key(collapse(ks[1]), True)
    assert body_key(collapse(ks[0]), True) != body_key(collapse(ks[0]), False)  # whole: constant bounds
    text, _ = generate_module(ks, whole=lambda k: True)
    assert _bodies(text) == 1
    assert len(re.findall(r'call void @"k\d+_body"', text)) == 2
    assert "noinline" in text


def test_entries_out_of_line_body_optimized_once():
    """Each entry point (<name>, <name>_run, <name>_omp, <name>_par) is optnone and calls the body,
    so O3 works on one copy of each loop nest: inlined, it worked on one per entry."""
    from minicomp.runtime.llvm_jit import optimize
    graph = parse("graph g(%x: f32[256,256]) -> (f32[256,256]) {\n  %0: f32[256,256] = exp %x\n  return %0\n}")
    ks = [n.meta["kernel"] for n in run_passes(graph, cpu_context(graph)).nodes if n.op == "kernel"]
    for whole, openmp in ((True, False), (False, True)):
        text, _ = generate_module(ks, whole=lambda k: whole, openmp=openmp)
        opt = optimize(text)
        entries = re.findall(r'^define [^@]*@"?k\d+(?:_run|_omp|_par)?"?\(.*#(\d+)', opt, re.M)
        assert len(entries) == 2 + openmp, entries  # <name>, and <name>_run or <name>_omp and _par
        for group in set(entries):  # each entry's attribute group: optnone, kept through O3
            assert re.search(rf"^attributes #{group} = {{.*optnone", opt, re.M), group
        assert len(re.findall(r'^define internal [^@]*@"?k\d+_body"?\(', opt, re.M)) == 1
        bodies = opt.split("k0_body")[1]
        assert re.search(r"<\d+ x float>", bodies)  # the body is still vectorized
