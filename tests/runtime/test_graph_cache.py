"""The graph cache (compiler/graph_cache.py): a Dynamo graph compiled before skips AOTAutograd and
lowering, and only when nothing that shapes the program differs; every result is compared with
eager, hit or not."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch._dynamo.backends.common as dynamo_common

import minicomp
from minicomp.compiler import capture
from minicomp.runtime import cache


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MINICOMP_GRAPH_CACHE", raising=False)
    capture.forget_built()
    torch._dynamo.reset()


def entries() -> list:
    d = os.path.join(cache.cache_dir(), "graphs")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def hits(c) -> list:
    """Per graph: found in the disk cache."""
    return [g.detail.get("graph_cache") == "hit" for g in c.report().graphs]


def sources(c) -> list:
    """Per graph: None (compiled), "hit" (IR from the disk cache) or "memo" (a Built graph)."""
    return [g.detail.get("graph_cache") for g in c.report().graphs]


def run(fn, *args, backend="cpu", memo=False, **kw):
    """A fresh compile of fn (Dynamo's caches reset): its result checked against eager, and the
    compiled callable returned. Without `memo` the in-memory Built graphs are dropped first, as in a
    new process, so the disk cache is what a second compile finds."""
    if not memo:
        capture.forget_built()
    torch._dynamo.reset()
    c = minicomp.compile(fn, backend=backend, **kw)
    torch.testing.assert_close(c(*args), fn(*args))
    return c


def f(x, w):
    return torch.softmax(x @ w, dim=-1) * torch.cos(x).sum(-1, keepdim=True)


def test_a_graph_compiled_before_skips_aot_autograd_and_lowering(monkeypatch):
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with torch.no_grad():
        first = run(f, x, w)
        assert hits(first) == [False] and len(entries()) == 1

        def refuse(*a, **k):
            raise AssertionError("a cache hit must not reach AOTAutograd or lowering")
        monkeypatch.setattr(dynamo_common, "aot_module_simplified", refuse)
        monkeypatch.setattr(capture, "lower", refuse)
        again = run(f, x, w)
        assert hits(again) == [True]
        assert "graph_cache=hit" in str(again.report())
        first_k, again_k = first.report().kernels, again.report().kernels
        assert [k.ops for k in again_k] == [k.ops for k in first_k], "the same program, from the same IR"
        other = run(f, torch.randn(8, 16), torch.randn(16, 16))  # new values, same graph: a hit
        assert hits(other) == [True]


def test_a_second_instance_of_a_model_hits_and_uses_its_own_weights():
    torch.manual_seed(1)
    a, b = (torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8)) for _ in range(2))
    x = torch.randn(4, 8)
    with torch.no_grad():
        ca, cb = minicomp.compile(a, backend="cpu"), minicomp.compile(b, backend="cpu")
        torch.testing.assert_close(ca(x), a(x))
        torch.testing.assert_close(cb(x), b(x))
        assert sources(ca) == [None] and sources(cb) == ["memo"]
        assert not torch.allclose(a(x), b(x))


@pytest.mark.parametrize("change", ["shape", "dtype", "stride", "offset", "aliasing", "grad_mode", "code"])
def test_anything_that_shapes_the_program_misses(change):
    def g(x, y):
        return torch.exp(x) + y * 2

    def g2(x, y):
        return torch.exp(x) + y * 3
    base = torch.randn(6, 6)
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    variants = {
        "shape": (g, torch.randn(6, 5), torch.randn(6, 5)),
        "dtype": (g, x.double(), y.double()),
        "stride": (g, x.t(), y),
        "offset": (g, torch.randn(40)[4:].view(6, 6), y),
        "aliasing": (g, base, base.view(6, 6)),
        "grad_mode": (g, x, y),
        "code": (g2, x, y),
    }
    with torch.no_grad():
        run(g, x, y)
    fn, *args = variants[change]
    if change == "grad_mode":
        c = run(fn, *args)
    else:
        with torch.no_grad():
            c = run(fn, *args)
    assert hits(c) == [False], change
    assert len(entries()) == 2


def test_training_graphs_mutations_and_aliased_outputs_are_never_cached():
    def mutate(x):
        x.mul_(2)
        return x + 1

    def alias(x):
        return x.view(-1), torch.sin(x)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    for _ in range(2):
        torch._dynamo.reset()
        c = minicomp.compile(lin, backend="cpu")
        out = c(x)
        out.sum().backward()
        assert [g.kind for g in c.report().graphs] == ["forward", "backward"] and not any(hits(c))
    with torch.no_grad():
        for _ in range(2):
            a, b = torch.randn(3), None
            b = a.clone()
            torch._dynamo.reset()
            got = minicomp.compile(mutate, backend="cpu")(a)
            torch.testing.assert_close(got, mutate(b))
            torch.testing.assert_close(a, b)
            c = run(alias, torch.randn(2, 3))
            assert not any(hits(c))
    assert entries() == []


def test_a_corrupt_entry_is_recompiled_and_replaced():
    x, w = torch.randn(4, 16), torch.randn(16, 16)
    with torch.no_grad():
        run(f, x, w)
        key, = entries()
        cache.put("graphs", key, b'{"ir": "graph nonsense(", "meta": []}')  # checksum fine, content not
        c = run(f, x, w)
        assert hits(c) == [False]
        assert json.loads(cache.get("graphs", key))["ir"].startswith("graph ")
        assert hits(run(f, x, w)) == [True]


def test_an_entry_that_does_not_read_back_exactly_is_not_used():
    """The cold compile writes the text without parsing it; the hit parses it and prints it again,
    and takes it only when that gives the same text."""
    x, w = torch.randn(4, 16), torch.randn(16, 16)
    with torch.no_grad():
        run(f, x, w)
        key, = entries()
        entry = json.loads(cache.get("graphs", key))
        entry["ir"] = entry["ir"].replace(") -> (", ")  -> (", 1)  # parses to the same graph, prints otherwise
        cache.put("graphs", key, json.dumps(entry).encode())
        assert hits(run(f, x, w)) == [False]
        assert hits(run(f, x, w)) == [True]  # the recompile wrote an exact one


def test_the_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("MINICOMP_GRAPH_CACHE", "0")
    with torch.no_grad():
        run(f, torch.randn(4, 16), torch.randn(16, 16))
    assert entries() == []


def test_a_hit_keeps_the_source_lines_errors_name():
    def gather(x, i):
        return torch.index_select(x, 0, i) * 2
    x, good, bad = torch.randn(5, 3), torch.tensor([0, 4]), torch.tensor([1, 5])
    with torch.no_grad():
        run(gather, x, good)
        c = run(gather, x, good)
        assert hits(c) == [True]
        with pytest.raises(IndexError, match=r"index_select at test_graph_cache.py:\d+"):
            c(x, bad)


def test_plain_inference_graphs_skip_aot_autograds_wrapper_and_only_those(monkeypatch):
    """Where AOTAutograd's wrapper would do nothing, the program is called directly (grad mode off
    during the call, as the wrapper does); a graph that mutates an input or returns an alias keeps it."""
    direct = []
    real = capture._direct
    monkeypatch.setattr(capture, "_direct", lambda run: direct.append(run) or real(run))
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    c = run(f, x, w)  # grad mode on, no input requires grad: an inference graph
    out = c(x, w)
    assert not out.requires_grad and out.grad_fn is None and len(direct) == 1

    def mutate(x):
        x.add_(1)
        return x * 2
    a = torch.randn(3)
    b = a.clone()
    torch._dynamo.reset()
    torch.testing.assert_close(minicomp.compile(mutate, backend="cpu")(a), mutate(b))
    torch.testing.assert_close(a, b)
    assert len(direct) == 1


def test_a_hit_still_dumps_every_stage(tmp_path):
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with torch.no_grad():
        run(f, x, w)
        run(f, x, w, debug=str(tmp_path / "dump"))
    graph, = os.listdir(tmp_path / "dump")
    files = sorted(os.listdir(tmp_path / "dump" / graph))
    assert files[0] == "00_fx.txt" and files[1] == "01_ir.txt"
    assert "graph cache hit" in (tmp_path / "dump" / graph / files[0]).read_text()


def test_a_graph_built_before_in_this_process_skips_the_passes_and_code_generation(monkeypatch):
    from minicomp.codegen import llvm_module
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with torch.no_grad():
        first = run(f, x, w)

        def refuse(*a, **k):
            raise AssertionError("a Built graph must not reach lowering, the passes or code generation")
        monkeypatch.setattr(dynamo_common, "aot_module_simplified", refuse)
        for mod, name in [(capture, "lower"), (capture, "run_passes"), (llvm_module, "generate_modules")]:
            monkeypatch.setattr(mod, name, refuse)
        again = run(f, x, w, memo=True)
        assert sources(again) == ["memo"] and "graph_cache=memo" in str(again.report())
        assert [k.ops for k in again.report().kernels] == [k.ops for k in first.report().kernels]
        assert again.report().graphs[0].detail["arena_bytes"] == first.report().graphs[0].detail["arena_bytes"]
        # two programs from one Built graph: each its own memory, neither overwrites the other's results
        x2 = torch.randn(8, 16)
        a, b = first(x, w), again(x2, w)
        a2, b2 = first(x2, w), again(x, w)
        torch.testing.assert_close(a, f(x, w))
        torch.testing.assert_close(b, f(x2, w))
        torch.testing.assert_close(a2, b)
        torch.testing.assert_close(b2, a)


def test_different_options_or_a_dumping_compile_do_not_take_a_built_graph(tmp_path):
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with torch.no_grad():
        run(f, x, w)
        assert sources(run(f, x, w, memo=True, remat=False)) == ["hit"]
        assert sources(run(f, x, w, memo=True, debug=str(tmp_path / "dump"))) == ["hit"]
        assert sources(run(f, x, w, memo=True)) == ["memo"]
    graph, = os.listdir(tmp_path / "dump")
    assert any(name.endswith("ir_after_fuse.txt") for name in os.listdir(tmp_path / "dump" / graph))
