"""Compile workers (runtime/jit_pool.py): a graph with enough distinct kernel bodies is split into
several LLVM modules, compiled side by side in this process and in worker processes, and runs the
same as eager; a worker's object code is the bytes this process would make; a worker that fails
costs an in-process compile, never a wrong or missing kernel."""
import logging

import pytest
import torch

from minicomp.codegen.llvm_module import BODY_DEFINITION, generate_modules
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import parse
from minicomp.models import Block
from minicomp.runtime import cpu, jit_pool
from tests.codegen.test_cpu_ops import cpu_context
from tests.helpers import assert_matches_eager


def _block():
    """A GPT block: seven distinct kernel bodies in its forward, more in its backward."""
    torch.manual_seed(0)
    return Block(64, 4, 16)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MINICOMP_GRAPH_CACHE", "0")


def _graph_kernels(text):
    graph = parse(text)
    return [n.meta["kernel"] for n in run_passes(graph, cpu_context(graph)).nodes if n.op == "kernel"]


KERNELS = """graph g(%a: f32[64,128], %b: f32[32,64], %c: f32[16,32], %d: f32[8,16]) -> (f32[64,128], f32[32,64], f32[16,32], f32[8,16]) {
  %0: f32[64,128] = sin %a
  %1: f32[32,64] = exp %b
  %2: f32[16,32] = tanh %c
  %3: f32[8,16] = sqrt %d
  return %0, %1, %2, %3
}"""


def test_modules_balance_the_bodies_and_keep_shared_ones_together():
    ks = _graph_kernels(KERNELS)
    assert len(ks) == 4
    texts, collapsed = generate_modules(ks, 2)
    assert len(texts) == 2 and [k.name for k in collapsed] == [k.name for k in ks]
    assert sorted(len(BODY_DEFINITION.findall(t)) for t in texts) == [2, 2]
    assert generate_modules(ks, 2, min_bodies=3)[0] == generate_modules(ks, 1)[0]  # 4 bodies: one module
    assert len(generate_modules(ks, 8)[0]) == 4  # never more modules than bodies


def test_a_workers_object_code_is_the_bytes_compiled_here(monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    texts, _ = generate_modules(_graph_kernels(KERNELS), 2)
    name, features = cpu._host()
    here = [cpu._target_machine().emit_object(cpu._optimized(t)) for t in texts]
    objs, remote = jit_pool.compile_objects(texts, name, features, lambda t: cpu._target_machine().emit_object(
        cpu._optimized(t)))
    assert remote == 1 and objs == here


def test_a_module_llvm_refuses_raises_in_the_worker_and_it_keeps_serving(monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    jit_pool.prestart()
    w = jit_pool._take(1)[0]
    try:
        with pytest.raises(RuntimeError, match="expected"):
            w.compile(*cpu._host(), "define void @f( {")
        texts, _ = generate_modules(_graph_kernels(KERNELS), 1)
        assert w.compile(*cpu._host(), texts[0])[:4] == b"\x7fELF"
    finally:
        jit_pool._give_back(w, True)


def test_a_graph_compiles_in_two_modules_side_by_side_and_matches_eager(fresh, monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    x = torch.randn(2, 16, 64)
    compiled = assert_matches_eager(_block(), x, backend="cpu")  # forward and backward, gradients too
    graphs = compiled.report().graphs
    assert [g.kind for g in graphs] == ["forward", "backward"]
    for g in graphs:
        d = g.detail
        assert d["llvm_bodies"] >= 6 and d["llvm_modules"] == 2 and d["llvm_in_workers"] == 1, (g.kind, d)
        assert not d["llvm_cached"]
    again = assert_matches_eager(_block(), x, backend="cpu")  # every module from the disk cache
    for g in again.report().graphs:
        assert g.detail["llvm_cached"] and g.detail["llvm_in_workers"] == 0 and g.detail["llvm_modules"] == 2


def test_no_workers_one_module(fresh, monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "0")
    compiled = assert_matches_eager(_block(), torch.randn(2, 16, 64), backend="cpu")
    for g in compiled.report().graphs:
        assert g.detail["llvm_modules"] == 1 and g.detail["llvm_in_workers"] == 0


def test_a_dead_worker_costs_an_in_process_compile_and_is_replaced(fresh, monkeypatch, caplog):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    jit_pool.prestart()
    with jit_pool._lock:
        victim = jit_pool._state["idle"][0]
    victim.proc.kill()
    victim.proc.wait()
    with caplog.at_level(logging.INFO, logger="minicomp"):
        compiled = assert_matches_eager(_block(), torch.randn(2, 16, 64), backend="cpu")
    detail = compiled.report().graphs[0].detail
    assert detail["llvm_modules"] == 2 and detail["llvm_in_workers"] == 0
    assert any("compile worker failed" in r.getMessage() for r in caplog.records)
    with jit_pool._lock:
        assert victim not in jit_pool._state["all"]
    jit_pool.prestart()  # a fresh one takes its place
    with jit_pool._lock:
        assert len([w for w in jit_pool._state["all"] if w is not None]) == 1
        assert jit_pool._state["all"][0].proc.poll() is None


def test_a_forked_process_does_not_use_its_parents_workers(monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    jit_pool.prestart()
    with jit_pool._lock:
        parents = list(jit_pool._state["all"])
    real = jit_pool.os.getpid()
    monkeypatch.setattr(jit_pool.os, "getpid", lambda: real + 1)  # as a forked child sees it
    assert jit_pool._take(1) == []  # the parent's workers are not the child's
    monkeypatch.undo()
    with jit_pool._lock:
        jit_pool._state.update(pid=real, idle=[w for w in parents if w is not None], all=parents)


def test_after_max_failures_no_new_workers_start(monkeypatch, caplog):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    monkeypatch.setitem(jit_pool._state, "failures", 0)
    jit_pool.prestart()
    texts, _ = generate_modules(_graph_kernels(KERNELS), 2)
    here = lambda t: cpu._target_machine().emit_object(cpu._optimized(t))  # noqa: E731
    with caplog.at_level(logging.INFO, logger="minicomp"):
        for _ in range(jit_pool.MAX_FAILURES):
            with jit_pool._lock:
                w = next(w for w in jit_pool._state["idle"])
            w.proc.kill()
            w.proc.wait()
            objs, remote = jit_pool.compile_objects(texts, *cpu._host(), here)
            assert remote == 0 and all(o[:4] == b"\x7fELF" for o in objs)
            jit_pool.prestart()
    assert any("compile workers failed" in r.getMessage() for r in caplog.records)
    with jit_pool._lock:
        assert not [w for w in jit_pool._state["all"] if w is not None]
    assert jit_pool.submit(texts[1], *cpu._host()) is None  # no worker: the caller compiles in process
    monkeypatch.setitem(jit_pool._state, "failures", 0)
    jit_pool.prestart()  # the next test finds a worker again
