"""CPU runtime: JIT LLVM IR with llvmlite (cached on disk as object code) and run programs.

Kernel launches are prepared at compile time (a function pointer, the env slots of its buffers, the
outer extent to split across threads) and run as steps of a runtime/program.py Program. Kernels split their outer range across a persistent thread pool: ctypes releases the GIL, so the
chunks really run in parallel.
"""
from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import llvmlite
import llvmlite.binding as llvm

from ..errors import KernelIndexError, KernelZeroDivisionError
from . import cache

_KERNEL_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_RUN_T = ctypes.CFUNCTYPE(None)
_lock = threading.Lock()
_state: dict = {}
PARALLEL_MIN_WORK = 1 << 20  # elements below which threading costs more than it gains (measured: a GPT block)
VERSION = "minicomp-cpu-2"


def _new_target_machine():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(), opt=3)


def _target_machine():
    """The shared target machine for optimizing and emitting objects (an engine gets its own:
    an MCJIT engine takes ownership of its target machine and frees it with itself)."""
    with _lock:
        if "tm" not in _state:
            _state["tm"] = _new_target_machine()
        return _state["tm"]


def _pool() -> ThreadPoolExecutor | None:
    n = os.cpu_count() or 1
    if n < 2:
        return None
    with _lock:
        if "pool" not in _state:
            _state["pool"] = ThreadPoolExecutor(max_workers=n - 1, thread_name_prefix="minicomp")
        return _state["pool"]


def optimize(ir_text: str) -> str:
    """The O3-optimized IR (tests look for vector types in it)."""
    tm = _target_machine()
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    pb = llvm.create_pass_builder(tm, llvm.PipelineTuningOptions(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return str(mod)


class JitModule:
    """Machine code for one LLVM module; `address(name)` of its functions. `cached` says whether
    the object code came from the disk cache."""

    def __init__(self, ir_text: str):
        k = cache.key(VERSION, llvmlite.__version__, llvm.get_process_triple(), llvm.get_host_cpu_name(),
                      llvm.get_host_cpu_features().flatten(), ir_text)
        obj = cache.get("cpu", k)
        self.cached = obj is not None
        self.engine = None
        if obj is not None:
            try:
                self.engine = self._load(obj)
            except Exception:  # a corrupt entry: recompile and overwrite it
                cache.drop("cpu", k)
                self.cached = False
        if self.engine is None:
            mod = llvm.parse_assembly(optimize(ir_text))
            obj = _target_machine().emit_object(mod)
            self.engine = self._load(obj)
            cache.put("cpu", k, obj)

    @staticmethod
    def _load(obj: bytes):
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _new_target_machine())
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        return engine

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise RuntimeError(f"minicomp: compiled module has no function {name}")
        return addr

    def global_address(self, name: str) -> int:
        addr = self.engine.get_global_value_address(name)
        if not addr:
            raise RuntimeError(f"minicomp: compiled module has no global {name}")
        return addr


def runs_whole(work: int, extent: int) -> bool:
    """Whether a kernel runs as one call over its whole outer range rather than split across threads
    (codegen then gives LLVM the constant trip count)."""
    return (os.cpu_count() or 1) < 2 or work < PARALLEL_MIN_WORK or extent < 2


class KernelLaunch:
    """One kernel: fills its pointer array from env slots and runs the outer range in chunks."""

    def __init__(self, fn_addr: int, slots: list, extent: int, work: int, name: str,
                 failed_addr: int | None = None, sites: tuple = (), whole: tuple | None = None):
        """`whole`: (address of <name>_run, address of <name>_bufs) for a kernel that never splits."""
        self.fn = _KERNEL_T(fn_addr)
        # a kernel with run-time checks (a gather's index, an integer divisor) raises after a call in
        # which one failed: it kept going safely (index clamped, divisor 1) and set bit j of the flags
        # at failed_addr for sites[j] = (exception name, message)
        self.failed = ctypes.c_int32.from_address(failed_addr) if failed_addr else None
        self.sites = sites
        self.slots = slots
        if whole is not None:
            self.run = _RUN_T(whole[0])
            self.ptrs = (ctypes.c_void_p * max(len(slots), 1)).from_address(whole[1])
        else:
            self.run = None
            self.ptrs = (ctypes.c_void_p * max(len(slots), 1))()
        self.ptrs_addr = ctypes.addressof(self.ptrs)
        self.extent = extent
        self.name = name
        self.chunks = None
        if not runs_whole(work, extent):
            parts = min(os.cpu_count() or 1, extent)
            bounds = [extent * i // parts for i in range(parts + 1)]
            self.chunks = [(bounds[i], bounds[i + 1]) for i in range(parts)]
            self.pool = _pool()

    def __call__(self, env: list) -> None:
        ptrs = self.ptrs
        for i, s in enumerate(self.slots):
            ptrs[i] = env[s].data_ptr()
        self.launch()

    def emit(self, k: int, v, ns: dict) -> list:
        """Program._straight_line's lines for this launch: fill the pointers, call the kernel."""
        ns[f"P{k}"], ns[f"L{k}"], ns[f"R{k}"] = self.ptrs, self, self.run
        lines = [f"P{k}[{i}] = {v(s)}.data_ptr()" for i, s in enumerate(self.slots)]
        simple = self.run is not None and self.chunks is None and self.failed is None
        return lines + [f"R{k}()" if simple else f"L{k}.launch()"]

    def launch(self) -> None:
        if self.run is not None:
            self.run()
        elif self.chunks is None:
            self.fn(self.ptrs_addr, 0, self.extent)
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
