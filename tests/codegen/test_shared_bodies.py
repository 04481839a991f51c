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
    whole); the module defines the shared body and its entry once, and every other kernel's entry
    is an alias of that one: a symbol, no function for LLVM to compile."""
    from minicomp.runtime.llvm_jit import JitModule
    graph = parse("graph g(%x: f32[64,32], %y: f32[64,32]) -> (f32[64,32], f32[64,32]) {\n"
                  "  %0: f32[64,32] = sin %x\n  %1: f32[64,32] = sin %y\n  return %0, %1\n}")
    ks = [n.meta["kernel"] for n in run_passes(graph, cpu_context(graph)).nodes if n.op == "kernel"]
    assert len(ks) == 2 and ks[0].name != ks[1].name
    assert body_key(collapse(ks[0]), True) == body_key(collapse(ks[1]), True)
    assert body_key(collapse(ks[0]), True) != body_key(collapse(ks[0]), False)  # whole: constant bounds
    text, _ = generate_module(ks, whole=lambda k: True)
    assert _bodies(text) == 1
    assert len(re.findall(r'call void @"k\d+_body"', text)) == 1
    assert re.search(rf'^@"{ks[1].name}" = alias .*@"{ks[0].name}"$', text, re.M)
    assert "noinline" in text
    jit = JitModule(text)
    assert jit.address(ks[0].name) == jit.address(ks[1].name) != 0


def test_entries_out_of_line_body_optimized_once():
    """A kernel's one entry point, <name>(table, start, end), is optnone and calls the body, so O3
    works on one copy of each loop nest; running it whole or on the OpenMP team is the runtime's
    (runtime/cpu.py), so the module has no other function of the kernel's."""
    from minicomp.runtime.llvm_jit import optimize
    graph = parse("graph g(%x: f32[256,256]) -> (f32[256,256]) {\n  %0: f32[256,256] = exp %x\n  return %0\n}")
    ks = [n.meta["kernel"] for n in run_passes(graph, cpu_context(graph)).nodes if n.op == "kernel"]
    for whole in (True, False):
        text, _ = generate_module(ks, whole=lambda k: whole)
        opt = optimize(text)
        entries = re.findall(r'^define [^@]*@"?k\d+"?\(.*#(\d+)', opt, re.M)
        assert len(entries) == 1, entries
        assert re.search(rf"^attributes #{entries[0]} = {{.*optnone", opt, re.M)  # kept through O3
        assert len(re.findall(r'^define internal [^@]*@"?k\d+_body"?\(', opt, re.M)) == 1
        bodies = opt.split("k0_body")[1]
        assert re.search(r"<\d+ x float>", bodies)  # the body is still vectorized
        assert "GOMP" not in text
