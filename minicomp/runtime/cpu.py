"""CPU runtime: run programs of kernels compiled from LLVM IR (llvm_jit.py loads their machine code).

Kernel launches are prepared at compile time (a function pointer, the env slots of its buffers, the
outer extent to split across threads) and run as steps of a runtime/program.py Program.

A kernel big enough to split (PARALLEL_MIN_WORK) runs its outer range in chunks on the threads of
torch's own OpenMP runtime: the runtime's minicomp_par calls GOMP_parallel, as Inductor's C++
kernels and ATen's ops do. A second pool of threads would fight OpenMP's for the cores -- after a matmul its
threads spin for a while before they sleep -- and find them asleep when it hands over work; on the
team torch's matmuls just used, a split costs a few microseconds. Where torch runs no OpenMP runtime
we can find (or MINICOMP_OPENMP=0), the chunks go to a thread pool of our own (ctypes releases the
GIL, so they really run in parallel). Both use torch.get_num_threads() threads: whether to split is
decided when compiling, the OpenMP team's size at each call.
"""
from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
import torch

from .. import options
from ..errors import KernelIndexError, KernelZeroDivisionError
from .llvm_jit import JitModule

_KERNEL_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_RUN_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PAR_T = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_void_p)
_OPENMP_SYMBOLS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")
_lock = threading.Lock()
_state: dict = {}
PARALLEL_MIN_WORK = 1 << 15  # elements below which a split costs more than it gains: ATen's grain size (a GPT block: 0.91 -> 0.74x eager)


def threads() -> int:
    """Threads a split kernel runs on: torch's setting (torch.set_num_threads), as its own ops do."""
    return max(1, torch.get_num_threads())


def _loaded_libraries() -> list:
    try:
        with open("/proc/self/maps") as f:  # address perms offset dev inode [path]
            paths = {fields[5].strip() for fields in (ln.split(None, 5) for ln in f) if len(fields) == 6}
    except OSError:  # not Linux: the libraries torch ships
        import glob
        paths = set(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*")))
    return sorted(p for p in paths if "omp" in os.path.basename(p))


def openmp() -> bool:
    """Whether split kernels run on torch's OpenMP threads: the OpenMP runtime torch loaded is found
    (only one already loaded: a second runtime would bring a second set of threads) and its entry
    points are registered with LLVM's symbol resolution."""
    with _lock:
        if "openmp" not in _state:
            _state["openmp"] = options.openmp() and _find_openmp()
        return _state["openmp"]


def _find_openmp() -> bool:
    for path in _loaded_libraries():
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
            addresses = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _OPENMP_SYMBOLS]
        except (OSError, AttributeError):
            continue
        for name, address in zip(_OPENMP_SYMBOLS, addresses):
            llvm.add_symbol(name, address)
        return True
    return False


def _pool() -> ThreadPoolExecutor:
    with _lock:
        if "pool" not in _state:
            _state["pool"] = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1),
                                                thread_name_prefix="minicomp")
        return _state["pool"]


def launch_mode(work: int, extent: int) -> str:
    """How a kernel runs: "whole" (one call over its whole outer range; codegen then gives LLVM the
    constant trip count), "openmp" (chunks on torch's OpenMP team) or "chunks" (our thread pool)."""
    if threads() < 2 or work < PARALLEL_MIN_WORK or extent < 2:
        return "whole"
    return "openmp" if openmp() else "chunks"


class KernelLaunch:
    """One kernel: fills its pointer table from env slots and runs it (whole, or split across threads).

    The table holds the buffers, then the address of this launch's flag word: a kernel with run-time
    checks (a gather's index, an integer divisor) keeps going safely (index clamped, divisor 1),
    sets bit j of the word for sites[j] = (exception name, message), and the launch raises after
    the call. `private()` gives a copy with a table and a flag word of its own, for a call running
    at the same time as this one (runtime/program.py)."""

    def __init__(self, fn_addr: int, slots: list, extent: int, name: str, mode: str = "whole",
                 sites: tuple = (), sizes=None):
        """`fn_addr`: the kernel's entry, <name>(table, start, end). Mode "whole" runs the whole
        range in one call, "openmp" splits it on torch's OpenMP team, "chunks" on our thread pool;
        the first two go through the runtime's entries (_Runtime), which read the kernel's entry,
        table and extent from this launch's `desc`. `sizes`: the int64 array of the symbol values
        a kernel over symbolic sizes reads (its table's last entry points to it)."""
        self.fn_addr, self.fn = fn_addr, _KERNEL_T(fn_addr)
        self.failed = ctypes.c_int32(0) if sites else None
        self.sites = sites
        self.slots = slots
        self.mode = mode
        n = len(slots) + 1 + (sizes is not None)
        self.ptrs = (ctypes.c_void_p * n)()
        self.ptrs_addr = ctypes.addressof(self.ptrs)
        if self.failed is not None:
            self.ptrs[len(slots)] = ctypes.addressof(self.failed)
        self.sizes = sizes
        if sizes is not None:
            self.ptrs[len(slots) + 1] = ctypes.addressof(sizes)
        self.extent = extent
        self.desc = (ctypes.c_int64 * 3)(fn_addr, self.ptrs_addr, extent)
        self.desc_addr = ctypes.addressof(self.desc)
        self.name = name
        self.threads = min(threads(), extent)  # "chunks": fixed now; "openmp": read again at each call
        self.chunks = None
        self.prefilled = frozenset()  # table entries written once (fixed pointers), not at each call
        self.run = self.par = None
        if mode == "whole":
            self.run = runtime().run
        elif mode == "openmp":
            self.par = runtime().par
        else:
            bounds = [extent * i // self.threads for i in range(self.threads + 1)]
            self.chunks = [(bounds[i], bounds[i + 1]) for i in range(self.threads)]
            self.pool = _pool()

    def private(self) -> "KernelLaunch":
        """This launch with its own pointer table and flag word: the whole range in one call on the
        calling thread (several calls already run side by side), or our pool's chunks as before."""
        mode = "chunks" if self.mode == "chunks" else "whole"
        return KernelLaunch(self.fn_addr, self.slots, self.extent, self.name, mode, self.sites, self.sizes)

    def emit(self, k: int, v, ns: dict) -> list:
        """The generated call's lines for this launch (runtime/program.py): fill the pointers, call the kernel."""
        ns[f"P{k}"], ns[f"L{k}"], ns[f"R{k}"], ns[f"K{k}"] = self.ptrs, self, self.run or self.par, self.desc_addr
        ns["threads"] = threads
        lines = [f"P{k}[{i}] = {v(s)}.data_ptr()" for i, s in enumerate(self.slots) if i not in self.prefilled]
        if self.failed is not None or self.chunks is not None:
            return lines + [f"L{k}.launch()"]
        return lines + [f"R{k}(K{k})" if self.run is not None else f"R{k}(threads(), K{k})"]

    def prefill(self, fixed) -> None:
        """Write the pointers of the slots that never change (`fixed(slot)`: an arena view or a
        constant, else None) into the table now; the generated call then fills only the others.
        Only for a table no other launch shares."""
        done = set()
        for i, s in enumerate(self.slots):
            t = fixed(s)
            if t is not None:
                self.ptrs[i] = t.data_ptr()
                done.add(i)
        self.prefilled = frozenset(done)

    def launch(self) -> None:
        if self.run is not None:
            self.run(self.desc_addr)
        elif self.par is not None:
            # torch's setting at each call, as its own ops read it: torch.set_num_threads(1) in a
            # forked worker (a DataLoader's) keeps this call off the parent's OpenMP threads
            self.par(threads(), self.desc_addr)
        else:
            futures = [self.pool.submit(self.fn, self.ptrs_addr, lo, hi) for lo, hi in self.chunks[1:]]
            lo, hi = self.chunks[0]
            self.fn(self.ptrs_addr, lo, hi)
            for f in futures:
                f.result()
        if self.failed is not None and self.failed.value:
            bits, self.failed.value = self.failed.value, 0
            failed = [site for j, site in enumerate(self.sites) if bits >> j & 1]
            error = {"IndexError": KernelIndexError, "ZeroDivisionError": KernelZeroDivisionError}[failed[0][0]]
            raise error("minicomp: " + "; ".join(message for _, message in failed))


# The runtime's own machine code, the same for every program (cached on disk like any module):
# nothing is compiled per kernel but its body and one entry, <name>(table, start, end).
# - minicomp_run(desc) runs a kernel's whole range: desc is its launch's three words (the kernel's
#   entry, its table, its outer extent);
# - minicomp_par(threads, desc) runs it on an OpenMP team: GOMP_parallel (torch's own runtime) calls
#   minicomp_omp(desc) on each thread, which runs its share [ext*t/n, ext*(t+1)/n) of the range;
# - minicomp_run_plan(plan, pointers, threads): every kernel of a program in one native call (the
#   CPU counterpart of a CUDA Graph replay). The plan lists, per kernel, the runtime entry it goes
#   through, whether that takes the thread count, its desc, and where in its table each pointer that
#   changes between calls goes (an index into the call's pointer array). Fixed pointers (arena,
#   constants) are written into the tables once, when the call is generated; a call fills one
#   pointer array in one statement and makes one ctypes call, however many kernels and inputs.
# Per kernel, these were three more functions of its own module (<name>_run, or <name>_omp and
# <name>_par), each costing LLVM about 0.3 ms (HF BERT's training step: 64 ms of 344).
_RUN_IR = """
define void @minicomp_run(ptr %l) {
entry:
  %fn = load ptr, ptr %l
  %tp = getelementptr i64, ptr %l, i64 1
  %table = load ptr, ptr %tp
  %ep = getelementptr i64, ptr %l, i64 2
  %ext = load i64, ptr %ep
  call void %fn(ptr %table, i64 0, i64 %ext)
  ret void
}

define void @minicomp_run_plan(ptr %plan, ptr %d, i32 %threads) {
entry:
  %n = load i64, ptr %plan
  br label %kloop
kloop:
  %k = phi i64 [0, %entry], [%k1, %cont]
  %pos = phi i64 [1, %entry], [%next, %cont]
  %more = icmp slt i64 %k, %n
  br i1 %more, label %kbody, label %exit
kbody:
  %fp = getelementptr i64, ptr %plan, i64 %pos
  %fn = load i64, ptr %fp
  %pp = getelementptr i64, ptr %fp, i64 1
  %par = load i64, ptr %pp
  %dp = getelementptr i64, ptr %fp, i64 2
  %desc = load ptr, ptr %dp
  %np = getelementptr i64, ptr %fp, i64 3
  %npairs = load i64, ptr %np
  %start = add i64 %pos, 4
  br label %ploop
ploop:
  %j = phi i64 [0, %kbody], [%j1, %pbody]
  %bind = icmp slt i64 %j, %npairs
  br i1 %bind, label %pbody, label %call
pbody:
  %j2 = shl i64 %j, 1
  %at = add i64 %start, %j2
  %dstp = getelementptr i64, ptr %plan, i64 %at
  %dst = load i64, ptr %dstp
  %dip = getelementptr i64, ptr %dstp, i64 1
  %di = load i64, ptr %dip
  %srcp = getelementptr i64, ptr %d, i64 %di
  %val = load i64, ptr %srcp
  %dstptr = inttoptr i64 %dst to ptr
  store i64 %val, ptr %dstptr
  %j1 = add i64 %j, 1
  br label %ploop
call:
  %np2 = shl i64 %npairs, 1
  %next = add i64 %start, %np2
  %k1 = add i64 %k, 1
  %f = inttoptr i64 %fn to ptr
  %isp = icmp ne i64 %par, 0
  br i1 %isp, label %callpar, label %callrun
callpar:
  call void %f(i32 %threads, ptr %desc)
  br label %cont
callrun:
  call void %f(ptr %desc)
  br label %cont
cont:
  br label %kloop
exit:
  ret void
}
"""
_OMP_IR = """
declare i32 @omp_get_thread_num()
declare i32 @omp_get_num_threads()
declare void @GOMP_parallel(ptr, ptr, i32, i32)

define internal void @minicomp_omp(ptr %l) {
entry:
  %t32 = call i32 @omp_get_thread_num()
  %n32 = call i32 @omp_get_num_threads()
  %t = sext i32 %t32 to i64
  %n = sext i32 %n32 to i64
  %fn = load ptr, ptr %l
  %tp = getelementptr i64, ptr %l, i64 1
  %table = load ptr, ptr %tp
  %ep = getelementptr i64, ptr %l, i64 2
  %ext = load i64, ptr %ep
  %a = mul i64 %ext, %t
  %lo = sdiv i64 %a, %n
  %t1 = add i64 %t, 1
  %b = mul i64 %ext, %t1
  %hi = sdiv i64 %b, %n
  call void %fn(ptr %table, i64 %lo, i64 %hi)
  ret void
}

define void @minicomp_par(i32 %threads, ptr %l) {
entry:
  call void @GOMP_parallel(ptr @minicomp_omp, ptr %l, i32 %threads, i32 0)
  ret void
}
"""
_PLAN_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)


class _Runtime:
    """The runtime's entries, loaded: `run`, `plan` and, built with the OpenMP part, `par`."""

    def __init__(self, omp: bool):
        self.jit = JitModule(_RUN_IR + (_OMP_IR if omp else ""))
        self.run = _RUN_T(self.jit.address("minicomp_run"))
        self.plan = _PLAN_T(self.jit.address("minicomp_run_plan"))
        self.par = _PAR_T(self.jit.address("minicomp_par")) if omp else None


def runtime() -> _Runtime:
    """The runtime's machine code, built once, whichever thread asks first (warm_up's, a program's
    first call): one module for every launch, with minicomp_par where openmp() found (and
    registered) torch's GOMP_parallel. (A module per kind of launch made the first program with a
    kernel run whole build a second one on its first call: 12 ms.)"""
    rt = _state.get("runtime")
    if rt is None:
        with _plan_lock:
            rt = _state.get("runtime")
            if rt is None:
                rt = _state["runtime"] = _Runtime(openmp())
    return rt


def warm_up() -> None:
    """Start what every program of this process needs, on a thread, while Dynamo traces the first
    graph (backends.prepare): the runtime's machine code (about 16 ms with a cold disk cache) and
    the target machine it is compiled with. LLVM works without the GIL: the trace loses nothing."""
    with _lock:
        if _state.get("warming"):
            return
        _state["warming"] = True
    threading.Thread(target=runtime, daemon=True, name="minicomp-warm-up").start()


def _after_fork_in_child() -> None:
    """A fork while warm_up's thread built the runtime leaves its lock held in the child, and no
    thread to release it: the child builds its own."""
    global _plan_lock
    _plan_lock = threading.Lock()
    if "runtime" not in _state:
        _state.pop("warming", None)


_plan_lock = threading.Lock()
os.register_at_fork(after_in_child=_after_fork_in_child)


class PlanRun:
    """All of a program's kernels as one native call (minicomp_run_plan, above). `launches`: the KernelLaunch
    steps in order, each run "whole" or "openmp" and without run-time checks (plannable); `dynamic`:
    the env slots whose pointers change between calls, in the order the call's array holds them;
    `fixed(slot)`: the tensor of a slot that never changes (arena view, constant), or None."""

    def __init__(self, launches: list, dynamic: list, fixed):
        where = {s: i for i, s in enumerate(dynamic)}
        plan = [len(launches)]
        for launch in launches:
            pairs = []
            for i, s in enumerate(launch.slots):
                t = fixed(s)
                if t is not None:
                    launch.ptrs[i] = t.data_ptr()
                else:
                    pairs += [launch.ptrs_addr + 8 * i, where[s]]
            entry = launch.run or launch.par
            plan += [ctypes.cast(entry, ctypes.c_void_p).value, int(launch.par is not None), launch.desc_addr,
                     len(pairs) // 2, *pairs]
        self.plan = (ctypes.c_int64 * len(plan))(*plan)
        self.pointers = (ctypes.c_void_p * max(1, len(dynamic)))()
        self.run = runtime().plan
        self.args = (ctypes.addressof(self.plan), ctypes.addressof(self.pointers))
        self.launches = launches  # their tables and flag words live as long as the plan

    @staticmethod
    def plannable(step) -> bool:
        return isinstance(step, KernelLaunch) and step.failed is None and step.mode in ("whole", "openmp")

    def emit(self, dynamic_names: list, ns: dict) -> list:
        """The generated call's lines: one pointer array filled in one statement, one native call."""
        ns["PLAN"], ns["PLAN_D"], ns["PLAN_RUN"], ns["threads"] = self, self.pointers, self.run, threads
        lines = []
        if dynamic_names:
            lines.append(f"PLAN_D[0:{len(dynamic_names)}] = ({''.join(f'{n}.data_ptr(), ' for n in dynamic_names)})")
        par = any(launch.par is not None for launch in self.launches)
        lines.append(f"PLAN_RUN({self.args[0]}, {self.args[1]}, {'threads()' if par else 1})")
        return lines


KernelLaunch.Plan = PlanRun  # how runtime/program.py finds the one-call path for these steps
