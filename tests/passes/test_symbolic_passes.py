"""The passes on graphs over symbolic sizes: IR text in, text out, both run through `interpret` at
several sizes; and the kernel passes (fusion, rematerialization, memory planning) on a symbolic
graph: its fused text round-trips, it plans no arena offsets (each size is planned on its own
copy), and it adds no guards."""
from __future__ import annotations

import torch

from minicomp.compiler.capture import make_context
from minicomp.compiler.passes import cse, dce, fold_constants, simplify_views
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import interpret, parse, print_graph, sym
from minicomp.options import Options

from .check import check_pass, ir


def test_simplify_views_folds_reshapes_over_a_symbolic_size():
    check_pass(simplify_views.run, """
        graph g(%x: f32[s0,8]) -> (f32[s0,8]) {
          sizes s0 in 2.. hint 5
          %0: f32[8*s0] = reshape %x [shape=(size("8*s0"),)]
          %1: f32[s0,8] = reshape %0 [shape=(size("s0"), 8)]
          %2: f32[s0,8] = exp %1
          return %2
        }
    """, """
        graph g(%x: f32[s0,8]) -> (f32[s0,8]) {
          sizes s0 in 2.. hint 5
          %0: f32[8*s0] = reshape %x [shape=(size("8*s0"),)]
          %1: f32[s0,8] = reshape %x [shape=(size("s0"), 8)]
          %2: f32[s0,8] = exp %x
          return %2
        }
    """)


def test_cse_and_dce_over_symbolic_sizes():
    before = """
        graph g(%x: f32[s0,s1]) -> (f32[s0,s1]) {
          sizes s0 in 2.. hint 5, s1 in 2.. hint 3
          %0: f32[s0,s1] = exp %x
          %1: f32[s0,s1] = exp %x
          %2: f32[s0,s1] = sin %x
          %3: f32[s0,s1] = add %0 %1
          return %3
        }
    """
    after_cse = """
        graph g(%x: f32[s0,s1]) -> (f32[s0,s1]) {
          sizes s0 in 2.. hint 5, s1 in 2.. hint 3
          %0: f32[s0,s1] = exp %x
          %1: f32[s0,s1] = sin %x
          %2: f32[s0,s1] = add %0 %0
          return %2
        }
    """
    check_pass(cse.run, before, after_cse)
    check_pass(dce.run, after_cse, """
        graph g(%x: f32[s0,s1]) -> (f32[s0,s1]) {
          sizes s0 in 2.. hint 5, s1 in 2.. hint 3
          %0: f32[s0,s1] = exp %x
          %1: f32[s0,s1] = add %0 %0
          return %1
        }
    """)


def test_a_symbolic_size_as_a_value_is_not_folded():
    """full [value=size("s0")] is the call's size: folding it at the hint would be wrong elsewhere."""
    text = """
        graph g(%x: f32[s0]) -> (f32[s0]) {
          sizes s0 in 2.. hint 5
          %0: f32[] = full [dtype=f32, shape=(), value=size("s0")]
          %1: f32[] = full [dtype=f32, shape=(), value=2.0]
          %2: f32[] = mul %0 %1
          %3: f32[s0] = div %x %2
          return %3
        }
    """
    check_pass(fold_constants.run, text, text)


def test_kernel_passes_on_a_symbolic_graph_round_trip_plan_nothing_and_guard_nothing():
    g = parse(ir("""
        graph g(%x: f32[s0,64], %w: f32[64]) -> (f32[s0,64]) {
          sizes s0 in 2.. hint 100
          %0: f32[s0,64] = mul %x %w
          %1: f32[s0,1] = sum %0 [dims=(1,), keepdim=true]
          %2: f32[] = full [dtype=f32, shape=(), value=64.0]
          %3: f32[s0,1] = div %1 %2
          %4: f32[s0,64] = sub %0 %3
          %5: f32[s0,64] = tanh %4
          return %5
        }
    """))
    env = sym.env_for(g.sizes)
    with sym.using(env):
        ctx = make_context(Options.make("cpu"), g.name, "cpu")
        fused = run_passes(g, ctx)
    assert env.guards == [] and ctx.arena_bytes == 0
    assert not any("arena_offset" in n.meta for n in fused.nodes)
    text = print_graph(fused)
    assert print_graph(parse(text)) == text
    for n in (2, 3, 101):
        x, w = torch.randn(n, 64), torch.randn(64)
        y = x * w
        torch.testing.assert_close(interpret(fused, x, w)[0], torch.tanh(y - y.sum(1, keepdim=True) / 64))
