"""The CPU runtime: the disk cache of object code, the threaded launches, and vector code from LLVM.

Cache tests point MINICOMP_CACHE_DIR at a fresh folder. A corrupt entry can crash the process that
loads it, so that test runs its compiles in a child process and looks at how it ended.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import minicomp
from minicomp.codegen.llvm_module import generate_module
from minicomp.compiler.pipeline import run_passes
from minicomp.ir import parse
from minicomp.runtime import cpu, llvm_jit
from tests.codegen.test_cpu_ops import cpu_context


def fn(x):
    return torch.softmax(torch.cos(x) * 2, -1) + x


def _compile_and_check(x):
    """Compile `fn` afresh, check it against eager; returns whether its object code came from the cache."""
    compiled = minicomp.compile(fn, backend="cpu")
    torch.testing.assert_close(compiled(x), fn(x))
    (graph,) = compiled.report().graphs
    assert graph.detail["kernels"] >= 1
    return graph.detail["llvm_cached"]


def test_second_compile_hits_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    x = torch.randn(8, 33)
    assert _compile_and_check(x) is False
    assert os.listdir(tmp_path / "cpu"), "nothing was written to the cache"
    assert _compile_and_check(x) is True


def test_unwritable_cache_dir_costs_a_recompile_not_a_crash(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("the cache folder cannot be made under a file")
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(blocker / "cache"))
    x = torch.randn(8, 33)
    assert _compile_and_check(x) is False
    assert _compile_and_check(x) is False


_CHILD = textwrap.dedent("""
    import glob, os, sys
    import torch, minicomp
    def fn(x):
        return torch.softmax(torch.cos(x) * 2, -1) + x
    torch.manual_seed(0)
    x = torch.randn(8, 33)
    minicomp.compile(fn, backend="cpu")(x)
    for mode in sys.argv[1:]:
        for path in glob.glob(os.path.join(os.environ["MINICOMP_CACHE_DIR"], "cpu", "*")):
            data = open(path, "rb").read()
            data = {"truncated": data[:len(data) // 2], "empty": b"",
                    "garbage": bytes(range(256)) * (len(data) // 256 + 1),
                    "flipped": data[:len(data) // 2] + bytes(b ^ 0xFF for b in data[len(data) // 2:])}[mode]
            open(path, "wb").write(data)
        compiled = minicomp.compile(fn, backend="cpu")
        out = compiled(x)
        # float32 kernels sum in another order than eager: allclose's default atol (1e-8) failed on an
        # output element near zero in 0.2% of random inputs
        print(mode, compiled.report().graphs[0].detail["llvm_cached"], torch.allclose(out, fn(x), atol=1e-6),
              flush=True)
""")


def test_corrupt_cache_entry_is_detected_and_recompiled(tmp_path):
    modes = ["truncated", "empty", "garbage", "flipped"]
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", _CHILD, *modes], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"child died with {run.returncode}: {run.stdout}{run.stderr[-2000:]}"
    assert run.stdout.split() == [w for m in modes for w in (m, "False", "True")]


def test_jit_engines_do_not_own_the_shared_target_machine():
    """An MCJIT engine owns (frees) the target machine it is made with; were that the shared one, every
    compile after the first program died would use freed memory (it crashed in create_pass_builder)."""
    minicomp.compile(lambda x: torch.exp(x) * 3, backend="cpu")(torch.randn(5))
    assert not llvm_jit._target_machine()._owned  # llvmlite marks a machine an engine took over as owned


@pytest.fixture
def launches(monkeypatch):
    """Every KernelLaunch made while the test runs, to see how it split its range."""
    made = []
    init = cpu.KernelLaunch.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(cpu.KernelLaunch, "__init__", record)
    return made


@pytest.fixture
def threads(monkeypatch):
    """Set the threads split kernels run on: torch's setting, restored afterwards."""
    before = torch.get_num_threads()

    def set_threads(n):
        torch.set_num_threads(n)
    yield set_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("runtime", ["openmp", "pool"])
@pytest.mark.parametrize("case", ["pointwise", "row softmax", "column sum", "checked gather"])
def test_one_chunk_and_many_chunks_give_identical_results(case, runtime, launches, threads, monkeypatch):
    """Kernels split on torch's OpenMP team, or on our own pool where there is none, compute what one
    thread does; a run-time check that fails in any chunk still raises."""
    f = {"pointwise": lambda x: torch.cos(x) * x + 1,
         "row softmax": lambda x: torch.softmax(x, -1),
         "column sum": lambda x: (x * 3).sum(0) * 2,  # x.sum(0) alone runs in torch
         "checked gather": lambda x, i: torch.index_select(x, 0, i) * 2}[case]
    x = torch.randn(1031, 263)  # outer extents that split unevenly
    args = (x, torch.arange(1031).flip(0)) if case == "checked gather" else (x,)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 1 << 12)  # threads even for this small a kernel
    if runtime == "pool":
        monkeypatch.setitem(cpu._state, "openmp", False)
    else:
        assert cpu.openmp(), "torch's OpenMP runtime was not found"
    results = {}
    for n in (1, 7):
        threads(n)
        del launches[:]
        c = minicomp.compile(f, backend="cpu")
        results[n] = c(*args)
        modes = {launch.mode for launch in launches}
        assert modes == ({"whole"} if n == 1 else {"openmp" if runtime == "openmp" else "chunks"}), modes
        assert n == 1 or all(launch.threads == 7 for launch in launches)
        if case == "checked gather":
            bad = torch.arange(1031)
            bad[1000] = 1031  # out of range in the last chunk only
            with pytest.raises(IndexError, match="index_select"):
                c(x, bad)
    assert torch.equal(results[1], results[7])
    torch.testing.assert_close(results[7], f(*args), rtol=1e-4, atol=1e-4)  # sums of 1031 terms, reassociated


def test_split_kernels_run_on_torchs_openmp_threads(launches, threads, monkeypatch):
    """A split kernel's entry calls GOMP_parallel, resolved to the OpenMP runtime torch loaded (the
    library in this process that has it), and never touches a thread pool of ours."""
    import ctypes

    import llvmlite.binding as llvm
    threads(2)
    monkeypatch.setattr(cpu, "_pool", lambda: pytest.fail("an OpenMP launch used our thread pool"))
    x = torch.randn(512, 1024)
    f = lambda x: torch.tanh(x) * x  # noqa: E731
    c = minicomp.compile(f, backend="cpu")
    torch.testing.assert_close(c(x), f(x))
    assert [launch.mode for launch in launches] == ["openmp"]
    libs = [ctypes.CDLL(p, mode=os.RTLD_NOLOAD) for p in cpu._loaded_libraries()]
    torch_gomp = {ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value for lib in libs if hasattr(lib, "GOMP_parallel")}
    assert llvm.address_of_symbol("GOMP_parallel") in torch_gomp
    assert launches[0].par is cpu.runtime().par  # the runtime's minicomp_par, shared by every kernel
    assert re.search(r"call void @GOMP_parallel\(ptr @minicomp_omp", cpu._OMP_IR)
    text, _ = generate_module([_kernels("""
        graph t(%x: f32[512,1024]) -> (f32[512,1024]) {
          %0: f32[512,1024] = tanh %x
          return %0
        }""")[0]])
    assert "GOMP" not in text and "omp_get" not in text  # the kernel's module has its body and entry only


def _kernels(text: str):
    graph = parse(textwrap.dedent(text).lstrip("\n"))
    return [n.meta["kernel"] for n in run_passes(graph, cpu_context(graph)).nodes if n.op == "kernel"]


SOFTMAX = """
        graph softmax(%x: f32[64,1024]) -> (f32[64,1024]) {
          %0: f32[64,1] = amax %x [dims=(1,), keepdim=true]
          %1: f32[64,1024] = sub %x %0
          %2: f32[64,1024] = exp %1
          %3: f32[64,1] = sum %2 [dims=(1,), keepdim=true]
          %4: f32[64,1024] = div %2 %3
          return %4
        }"""


@pytest.mark.parametrize("name,text", [
    ("softmax", SOFTMAX),
    ("cos", """
        graph cos(%x: f32[64,1024]) -> (f32[64,1024]) {
          %0: f32[64,1024] = cos %x
          %1: f32[64,1024] = cos %0
          return %1
        }"""),
])
def test_optimized_kernels_are_vector_code(name, text):
    kernels = _kernels(text)
    assert len(kernels) == 1, f"{name} should fuse into one kernel"
    ir_text, _ = generate_module(kernels)
    optimized = llvm_jit.optimize(ir_text)
    assert re.search(r"<\d+ x float>", optimized), f"{name}: no vector types in the optimized IR"
    assert not re.search(r"call [^\n]*@(expf|cosf|llvm\.(exp|cos)\.f32)\(", optimized), f"{name}: scalar math calls"


def test_loop_hints_interleave_math_and_keep_long_rows_rolled():
    """softmax's rows (1024, constant) carry both hints on the loops that call exp; the amax loop
    only the no-unroll one. A 16-element kernel run whole gets neither: it is too short for either."""
    softmax = _kernels(SOFTMAX)
    text, _ = generate_module(softmax)
    loops = re.findall(r"!llvm\.loop (!\d+)", text)
    hints = {ref: re.search(rf"^{ref} = !{{ {ref}, (.*) }}$", text, re.M).group(1) for ref in loops}
    named = {ref: sorted(re.findall(r'"(llvm\.loop\.[\w.]+)"', " ".join(
        re.search(rf"^{m} = (.*)$", text, re.M).group(1) for m in re.findall(r"!\d+", h)))) for ref, h in hints.items()}
    assert len(set(loops)) == len(loops) >= 3  # one loop ID per loop
    kinds = sorted(tuple(v) for v in named.values())
    assert ("llvm.loop.unroll.disable",) in kinds
    assert ("llvm.loop.interleave.count", "llvm.loop.unroll.disable") in kinds
    tiny = _kernels("""
        graph tiny(%x: f32[16]) -> (f32[16]) {
          %0: f32[16] = exp %x
          return %0
        }""")
    text, _ = generate_module(tiny, whole=lambda k: True)
    assert "llvm.loop" not in text


def test_loops_around_loops_stay_rolled():
    """A small transpose run whole (constant trips, rows of 16 floats): LLVM turns each row into a
    64-byte memcpy and, left alone, unrolls the loops around it into 256 inline copies (186 ms of
    LLVM for a 0.6 us kernel). Its outer loops carry no-unroll; the copy still vectorizes, and the
    result matches torch."""
    k = _kernels("""
        graph heads(%x: f32[2,32,4,16]) -> (f32[8,32,16]) {
          %0: f32[2,4,32,16] = permute %x [dims=(0, 2, 1, 3)]
          %1: f32[8,32,16] = reshape %0 [shape=(8, 32, 16)]
          return %1
        }""")
    text, _ = generate_module(k, whole=lambda k: True)
    assert text.count('!"llvm.loop.unroll.disable"') >= 1 and len(re.findall(r"!llvm\.loop !", text)) >= 2
    optimized = llvm_jit.optimize(text)
    assert len(re.findall(r"call void @llvm\.memcpy", optimized)) <= 8, "outer loops unrolled"
    x = torch.randn(2, 32, 4, 16)
    fn = minicomp.compile(lambda t: t.permute(0, 2, 1, 3).reshape(8, 32, 16), backend="cpu")
    torch.testing.assert_close(fn(x), x.permute(0, 2, 1, 3).reshape(8, 32, 16))


def test_minicomp_openmp_0_chooses_our_own_pool(monkeypatch, launches, threads):
    threads(2)
    monkeypatch.setenv("MINICOMP_OPENMP", "0")
    monkeypatch.delitem(cpu._state, "openmp", raising=False)
    assert not cpu.openmp()
    x = torch.randn(512, 1024)
    torch.testing.assert_close(minicomp.compile(torch.sin, backend="cpu")(x), torch.sin(x))
    assert [launch.mode for launch in launches] == ["chunks"]
    monkeypatch.delenv("MINICOMP_OPENMP")
    monkeypatch.delitem(cpu._state, "openmp")
    assert cpu.openmp()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_worker_on_one_thread_runs_split_kernels_inline():
    """The OpenMP team's size is torch's setting at each call: a forked worker that sets one thread,
    as a DataLoader's does, never waits on the parent's OpenMP threads (which it does not have)."""
    script = textwrap.dedent("""
        import os, torch, minicomp
        torch.set_num_threads(2)
        x = torch.randn(512, 1024)
        c = minicomp.compile(lambda x: torch.tanh(x) * 2, backend="cpu")
        c(x)
        pid = os.fork()
        if pid == 0:
            torch.set_num_threads(1)
            os._exit(0 if torch.allclose(c(x), torch.tanh(x) * 2) else 1)
        assert os.waitpid(pid, 0)[1] == 0
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
