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
from minicomp.runtime import jit_pool, llvm_jit
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
    name, features = llvm_jit._host()
    here = [llvm_jit.compile_object(t) for t in texts]
    objs, remote = jit_pool.compile_objects(texts, name, features, llvm_jit.compile_object)
    assert remote == 1 and objs == here


def test_a_module_llvm_refuses_raises_in_the_worker_and_it_keeps_serving(monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    jit_pool.prestart()
    w = jit_pool._take(1)[0]
    try:
        with pytest.raises(RuntimeError, match="expected"):
            w.compile(*llvm_jit._host(), "define void @f( {")
        texts, _ = generate_modules(_graph_kernels(KERNELS), 1)
        assert w.compile(*llvm_jit._host(), texts[0])[:4] == b"\x7fELF"
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
        # each module starts as its text is done: on the worker if it is idle (the second too, when the
        # first was done by then), else on a thread here
        assert d["llvm_bodies"] >= 6 and d["llvm_modules"] == 2 and d["llvm_in_workers"] in (1, 2), (g.kind, d)
        assert not d["llvm_cached"]
    again = assert_matches_eager(_block(), x, backend="cpu")  # every module from the disk cache
    for g in again.report().graphs:
        assert g.detail["llvm_cached"] and g.detail["llvm_in_workers"] == 0 and g.detail["llvm_modules"] == 2


def test_no_workers_one_module(fresh, monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "0")
    compiled = assert_matches_eager(_block(), torch.randn(2, 16, 64), backend="cpu")
    for g in compiled.report().graphs:
        assert g.detail["llvm_modules"] == 1 and g.detail["llvm_in_workers"] == 0


def _kill_when_taken(monkeypatch, times=None):
    """Every worker handed out (the first `times` ones) dies before it answers; returns the real _take."""
    take = jit_pool._take
    left = [float("inf") if times is None else times]

    def take_and_kill(n):
        got = take(n)
        for w in got:
            if left[0] > 0:
                left[0] -= 1
                w.proc.kill()
        return got
    monkeypatch.setattr(jit_pool, "_take", take_and_kill)
    return take


def test_a_worker_dying_mid_compile_costs_an_in_process_compile_and_is_replaced(fresh, monkeypatch, caplog):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    monkeypatch.setitem(jit_pool._state, "failures", 0)
    jit_pool.prestart()
    with jit_pool._lock:
        victim = jit_pool._state["idle"][0]
    take = _kill_when_taken(monkeypatch, times=1)
    with caplog.at_level(logging.INFO, logger="minicomp"):
        compiled = assert_matches_eager(_block(), torch.randn(2, 16, 64), backend="cpu")
    detail = compiled.report().graphs[0].detail
    assert detail["llvm_modules"] == 2 and detail["llvm_in_workers"] <= 1  # the first module it took died
    assert any("compile worker failed" in r.getMessage() for r in caplog.records)
    with jit_pool._lock:
        assert victim not in jit_pool._state["all"] and jit_pool._state["failures"] >= 1
    monkeypatch.setattr(jit_pool, "_take", take)
    jit_pool.prestart()  # a fresh one takes its place
    with jit_pool._lock:
        assert len([w for w in jit_pool._state["all"] if w is not None]) == 1
        assert jit_pool._state["all"][0].proc.poll() is None


def test_a_forked_child_starts_workers_of_its_own(monkeypatch):
    """A child forked after the workers started (a DataLoader's) neither uses nor closes the
    parent's: it starts its own and compiles through them; the parent's keep serving it."""
    import os
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    jit_pool.prestart()
    with jit_pool._lock:
        parents = [w for w in jit_pool._state["all"] if w is not None]
    texts, _ = generate_modules(_graph_kernels(KERNELS), 2)
    here = llvm_jit.compile_object
    pid = os.fork()
    if pid == 0:  # the child: only what it needs, then out without running the parent's atexit
        ok = False
        try:
            ok = not jit_pool._state["all"] and jit_pool._take(1) == []
            objs, remote = jit_pool.compile_objects(texts, *llvm_jit._host(), here)
            ok = ok and remote == 1 and all(o[:4] == b"\x7fELF" for o in objs)
            ok = ok and all(w not in parents for w in jit_pool._state["all"])
            jit_pool._close_all()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    objs, remote = jit_pool.compile_objects(texts, *llvm_jit._host(), here)
    assert remote == 1 and all(w.alive() for w in parents)


def test_a_worker_killed_while_idle_is_replaced_without_counting_a_failure(monkeypatch):
    """Ctrl-C in a terminal reaches the whole process group; the workers ignore it, but one killed
    anyway (kill -9) is found dead before it is handed out and replaced."""
    import signal
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    jit_pool.prestart()
    with jit_pool._lock:
        w = jit_pool._state["idle"][0]
        failures = jit_pool._state["failures"]
    w.proc.send_signal(signal.SIGINT)  # ignored
    texts, _ = generate_modules(_graph_kernels(KERNELS), 2)
    here = llvm_jit.compile_object
    assert jit_pool.compile_objects(texts, *llvm_jit._host(), here)[1] == 1 and w.alive()
    w.proc.kill()
    w.proc.wait()
    assert jit_pool.compile_objects(texts, *llvm_jit._host(), here)[1] == 1  # a fresh worker did it
    with jit_pool._lock:
        assert jit_pool._state["failures"] == failures and w not in jit_pool._state["all"]


def test_a_module_llvm_refuses_through_the_pool_keeps_the_worker(monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    jit_pool.prestart()
    with jit_pool._lock:
        before = list(jit_pool._state["all"])
    bad = ["define void @f() {\n ret void\n}", "define void @g( {"]
    with pytest.raises(RuntimeError):  # LLVM's own error, from compiling it here
        jit_pool.compile_objects(bad, *llvm_jit._host(), llvm_jit.compile_object)
    with jit_pool._lock:
        assert jit_pool._state["all"] == before


def test_a_worker_of_another_llvmlite_is_not_used(monkeypatch, caplog):
    """The disk cache's key names this process's llvmlite: a worker that imports another (its
    hello says which) compiles nothing; the module compiles here."""
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    monkeypatch.setitem(jit_pool._state, "failures", 0)
    jit_pool._close_all()
    jit_pool.prestart()  # a worker that has not said hello yet
    monkeypatch.setattr(jit_pool, "identity", lambda: ("0.0.0", (1, 0, 0)))
    texts, _ = generate_modules(_graph_kernels(KERNELS), 2)
    with caplog.at_level(logging.INFO, logger="minicomp"):
        objs, remote = jit_pool.compile_objects(
            texts, *llvm_jit._host(), llvm_jit.compile_object)
    assert remote == 0 and all(o[:4] == b"\x7fELF" for o in objs)
    assert any("compile worker runs" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    jit_pool.prestart()


def test_after_max_failures_no_new_workers_start(monkeypatch, caplog):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    monkeypatch.setitem(jit_pool._state, "failures", 0)
    texts, _ = generate_modules(_graph_kernels(KERNELS), 2)
    here = llvm_jit.compile_object
    take = _kill_when_taken(monkeypatch)
    with caplog.at_level(logging.INFO, logger="minicomp"):
        for _ in range(jit_pool.MAX_FAILURES):
            objs, remote = jit_pool.compile_objects(texts, *llvm_jit._host(), here)
            assert remote == 0 and all(o[:4] == b"\x7fELF" for o in objs)
    assert any("compile workers failed" in r.getMessage() for r in caplog.records)
    assert jit_pool._state["failures"] == jit_pool.MAX_FAILURES
    assert jit_pool.submit(texts[1], *llvm_jit._host()) is None  # none starts: the caller compiles in process
    monkeypatch.setattr(jit_pool, "_take", take)
    monkeypatch.setitem(jit_pool._state, "failures", 0)
    jit_pool.prestart()  # the next test finds a worker again


def test_the_llvm_dump_holds_every_module(fresh, monkeypatch, tmp_path):
    import minicomp
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    model = _block().eval()
    with torch.no_grad():
        minicomp.compile(model, backend="cpu", debug=str(tmp_path / "dump"))(torch.randn(2, 16, 64))
    (graph,) = [d for d in (tmp_path / "dump").iterdir() if d.is_dir()]
    (llvm,) = [f for f in graph.iterdir() if f.name.endswith("_llvm.txt")]
    text = llvm.read_text()
    assert "module 1 of 2" in text and "module 2 of 2" in text
    assert len(BODY_DEFINITION.findall(text)) >= 6  # every kernel's body is in one of them
