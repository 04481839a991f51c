"""A cold CPU compile hands its program back while LLVM still works (runtime/cpu.py JitModule with
wait=False, backends/cpu.py): the first call binds the kernels, waiting for the machine code. The
program is the same one a waited-for compile makes; LLVM's errors reach the caller at that call;
a process forked meanwhile gets machine code of its own."""
import os
import threading

import pytest
import torch

from minicomp.backends import build
from minicomp.codegen.llvm_module import generate_modules
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import parse
from minicomp.runtime import llvm_jit
from tests.codegen.test_cpu_ops import cpu_context

GRAPH = """graph g(%a: f32[64,128], %b: f32[64,128]) -> (f32[64,128], f32[64,1]) {
  %0: f32[64,128] = mul %a %b
  %1: f32[64,128] = tanh %0
  %2: f32[64,1] = sum %1 [dims=(1,), keepdim=true]
  return %1, %2
}"""


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "0")  # every module on a thread here: the thread is what we hold


def _held(monkeypatch):
    """compile_object waits for the returned event: LLVM 'still works' until the test sets it."""
    go, started = threading.Event(), threading.Event()
    real = llvm_jit.compile_object

    def slow(text):
        started.set()
        assert go.wait(60)
        return real(text)
    monkeypatch.setattr(llvm_jit, "compile_object", slow)
    return go, started


def test_the_program_comes_back_before_llvm_is_done_and_the_first_call_binds_it(fresh, monkeypatch):
    go, started = _held(monkeypatch)
    graph = parse(GRAPH)
    ctx = cpu_context(graph)
    program, detail = build(run_passes(graph, ctx), ctx, "cpu")
    assert started.wait(60) and program.bind is not None  # built while LLVM has not finished
    assert not detail["llvm_cached"] and "llvm_jit" not in ctx.phases_ms
    a, b = torch.randn(64, 128), torch.randn(64, 128)
    threading.Timer(0.2, go.set).start()
    out, total = program(a, b)  # waits for the machine code, then runs
    torch.testing.assert_close(out, torch.tanh(a * b))
    torch.testing.assert_close(total, torch.tanh(a * b).sum(1, keepdim=True), rtol=1e-5, atol=1e-4)
    assert program.bind is None and ctx.phases_ms["llvm_wait"] >= 100 and ctx.phases_ms["llvm_jit"] >= 100
    out2, _ = program(b, a)  # bound once
    torch.testing.assert_close(out2, torch.tanh(a * b))


def test_llvms_error_reaches_the_call_that_needs_the_code_and_every_later_one(fresh):
    jit = llvm_jit.JitModule("define void @f( {", wait=False)  # returns: the error is the compile thread's
    for _ in range(2):
        with pytest.raises(RuntimeError, match="expected"):
            jit.address("f")


def test_a_child_forked_while_llvm_works_compiles_its_own(fresh, monkeypatch):
    go, started = _held(monkeypatch)
    graph = parse(GRAPH)
    kernels = [n.meta["kernel"] for n in run_passes(graph, cpu_context(graph)).nodes if n.op == "kernel"]
    texts, collapsed = generate_modules(kernels, 1)
    jit = llvm_jit.JitModule(texts, {0: llvm_jit.start_compile(texts[0])}, wait=False)
    assert started.wait(60)
    pid = os.fork()  # the compile thread waits on `go`, outside LLVM: the fork goes ahead
    if pid == 0:
        ok = False
        try:
            go.set()  # the child's own compile (its copy of the thread never runs) must not wait
            ok = all(jit.address(k.name) for k in collapsed)
        finally:
            os._exit(0 if ok else 1)
    go.set()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(jit.address(k.name) for k in collapsed)


def test_a_fork_waits_for_a_thread_of_ours_inside_llvm():
    inside, done = threading.Event(), []

    def compile_a_while():  # as a compile thread holds it for each call into LLVM
        with llvm_jit._in_llvm:
            inside.set()
            threading.Event().wait(0.3)
            done.append(True)
    t = threading.Thread(target=compile_a_while)
    t.start()
    assert inside.wait(60)
    pid = os.fork()
    if pid == 0:  # made only once the thread had left LLVM, and the child can enter it
        os._exit(0 if done and llvm_jit._in_llvm.acquire(timeout=5) else 1)
    _, status = os.waitpid(pid, 0)
    t.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_warm_up_builds_the_runtime_once_while_the_caller_goes_on(fresh, monkeypatch):
    from minicomp.runtime import cpu
    for key in ("runtime", "warming"):
        monkeypatch.delitem(cpu._state, key, raising=False)
    built = []
    real = cpu.JitModule

    def counting(*a, **k):
        built.append(a)
        return real(*a, **k)
    monkeypatch.setattr(cpu, "JitModule", counting)
    cpu.warm_up()
    cpu.warm_up()  # a second compile's prepare: nothing more starts
    runtime = cpu.runtime()  # waits for the thread's build, or builds it first and the thread finds it
    assert runtime is cpu.runtime() and len(built) == 1
    assert runtime.par is not None and cpu.openmp()
    # a kernel run whole takes the same module's entry: a program's first call builds nothing more
    whole, team = cpu.KernelLaunch(0, [], 1, "k0", "whole"), cpu.KernelLaunch(0, [], 8, "k1", "openmp")
    assert whole.run is runtime.run and team.par is runtime.par and len(built) == 1


def test_first_calls_from_several_threads_bind_once_and_all_get_the_right_result(fresh, monkeypatch):
    go, started = _held(monkeypatch)
    graph = parse(GRAPH)
    ctx = cpu_context(graph)
    program, _ = build(run_passes(graph, ctx), ctx, "cpu")
    binds = []
    bind = program.bind
    program.bind = lambda steps: binds.append(1) or bind(steps)
    inputs = [(torch.randn(64, 128), torch.randn(64, 128)) for _ in range(4)]
    results = [None] * 4

    def call(i):
        results[i] = program(*inputs[i])
    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    assert started.wait(60)
    go.set()
    for t in threads:
        t.join(60)
    assert binds == [1]
    for (a, b), (out, total) in zip(inputs, results):
        torch.testing.assert_close(out, torch.tanh(a * b))
        torch.testing.assert_close(total, torch.tanh(a * b).sum(1, keepdim=True), rtol=1e-5, atol=1e-4)
