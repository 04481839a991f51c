"""LLVM modules to loaded machine code, for the CPU runtime (cpu.py): compiled in this process or on
compile workers (jit_pool.py), object code cached on disk (cache.py), and finished in the background.

A graph's LLVM IR is one module or several (codegen/llvm_module.py). Each starts compiling as soon as
its text is generated (`start_compile`): on an idle worker, else on a thread of this process (ctypes
releases the GIL while LLVM works). JitModule(wait=False) collects them, compiles what has not
started, and loads the object code on a thread of its own, so a cold compile hands its program back
while LLVM works; the first `address()` waits for what is left.
"""
from __future__ import annotations

import os
import threading
import time

import llvmlite
import llvmlite.binding as llvm

from . import cache, jit_pool, llvm_worker

_lock = threading.Lock()
_state: dict = {}
VERSION = "minicomp-cpu-3"  # 3: buffer tables end with the flag word's address


def _new_target_machine():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(_triple())
    cpu_name, features = _host()
    return target.create_target_machine(cpu=cpu_name, features=features, opt=3)


def _target_machine():
    """The shared target machine for optimizing and emitting objects (an engine gets its own:
    an MCJIT engine takes ownership of its target machine and frees it with itself)."""
    with _lock:
        if "tm" not in _state:
            _state["tm"] = _new_target_machine()
        return _state["tm"]


def _host() -> tuple[str, str]:
    """The host CPU's name and features, as LLVM names them (what machine code is compiled for).
    Asked once: a call into llvmlite waits for its lock, which a compile on a thread of ours holds
    through each of its steps (O3 of a whole module is one), and this is asked while they run."""
    if "host" not in _state:  # no lock: _target_machine holds it, and two threads find the same answer
        _state["host"] = (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), llvm.get_process_triple())
    return _state["host"][:2]


def _triple() -> str:
    _host()
    return _state["host"][2]


def optimize(ir_text: str) -> str:
    """The O3-optimized IR as text (tests look for vector types in it)."""
    return str(llvm_worker.optimized_module(_target_machine(), ir_text))


def compile_object(ir_text: str) -> bytes:
    """Object code for one module, compiled in this process (as a compile worker would)."""
    with _in_llvm:
        return llvm_worker.compile_object(_target_machine(), ir_text)


# Compiles finish on threads of this process (JitModule, jit_pool.Job) while the caller goes on, so a
# thread of ours may be inside LLVM when the process forks (a DataLoader's workers): the child would
# find llvmlite's lock held by a thread it does not have, and LLVM half way through a module. Our
# threads enter LLVM only holding _in_llvm, and a fork waits for it.
_in_llvm = threading.Lock()
os.register_at_fork(before=_in_llvm.acquire, after_in_parent=_in_llvm.release, after_in_child=_in_llvm.release)


def _cache_key(ir_text: str) -> str:
    cpu_name, features = _host()
    return cache.key(VERSION, llvmlite.__version__, _triple(), cpu_name, features, ir_text)


def start_compile(ir_text: str):
    """Start compiling one module now, while the caller goes on (generating the next module, building
    the program, Dynamo finishing its trace): on an idle compile worker (jit_pool.py), else on a
    thread of this process (ctypes releases the GIL while LLVM works). A job for JitModule's `jobs`,
    or None when the disk cache has the module (JitModule loads it)."""
    if cache.has("cpu", _cache_key(ir_text)):
        return None
    return jit_pool.submit(ir_text, *_host()) or jit_pool.Job(_compile_quietly, ir_text)


def _compile_quietly(ir_text: str):
    """A compile thread's work: None where LLVM refuses the module (JitModule compiles it again in
    the thread that needs it, where the error reaches the user) rather than a thread's traceback."""
    try:
        return compile_object(ir_text)
    except Exception:  # noqa: BLE001 -- raised again by that second compile
        return None


class JitModule:
    """Machine code for a graph's LLVM modules (one text, or several compiled side by side:
    jit_pool.py); `address(name)` of their functions. `jobs`: {index: what start_compile returned}
    for modules already compiling. `cached` says whether all the object code came from the disk
    cache, `in_workers` how many modules worker processes compiled (until then: how many went to them).

    wait=False returns at once and finishes on a thread of its own (collecting the jobs, compiling
    what has none, loading): a cold compile hands its program back while LLVM works, and the first
    `address()` (the program's first call binding its kernels) waits for the rest. `seconds`: from
    here until the machine code was loaded; `waited`: how long the first caller of wait() waited."""

    def __init__(self, ir_texts, jobs: dict | None = None, wait: bool = True):
        t0 = time.perf_counter()
        texts = [ir_texts] if isinstance(ir_texts, str) else list(ir_texts)
        jobs = {i: j for i, j in (jobs or {}).items() if j is not None}
        keys = [_cache_key(t) for t in texts]
        self.engines: list = [None] * len(texts)
        for i, k in enumerate(keys):
            obj = cache.get("cpu", k) if i not in jobs else None
            if obj is not None:
                try:
                    self.engines[i] = self._load(obj)
                except Exception:  # a corrupt entry: recompile and overwrite it
                    cache.drop("cpu", k)
        missing = [i for i, e in enumerate(self.engines) if e is None]
        self.cached = not missing
        self.in_workers = sum(j.remote for j in jobs.values())
        self.seconds = self.waited = 0.0
        self._lock = threading.Lock()
        self._todo = (texts, keys, missing, jobs, t0) if missing else None
        self._error: BaseException | None = None
        self._thread = None
        if self._todo is None:
            self.seconds = time.perf_counter() - t0
        elif not wait:
            self._thread = threading.Thread(target=self._finish, args=(True,), daemon=True, name="minicomp-jit")
            self._thread.start()
        else:
            self.wait()

    def _finish(self, background: bool = False) -> None:
        texts, keys, missing, jobs, t0 = self._todo
        try:
            objs, remote = jit_pool.compile_objects([texts[i] for i in missing], *_host(), compile_object,
                                                    {missing.index(i): j for i, j in jobs.items()})
            for i, obj in zip(missing, objs):
                self.engines[i] = self._load(obj)
                cache.put("cpu", keys[i], obj)
        except BaseException as e:
            if not background:
                raise
            self._error = e  # raised by wait(), in the thread that needs the code
            return
        self.in_workers = remote
        self.seconds = time.perf_counter() - t0
        self._todo = None

    def wait(self) -> None:
        """Return once every module is loaded (raising what compiling one raised)."""
        if self._todo is None and self._error is None:
            return
        t0 = time.perf_counter()
        thread = self._thread
        if thread is not None:
            thread.join()  # (in a child forked meanwhile, at once: the thread stayed in the parent)
        with self._lock:
            self._thread = None
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._todo is not None:  # nothing ran it (wait=True), or a fork left its thread behind
                self._finish()
        self.waited = time.perf_counter() - t0

    @staticmethod
    def _load(obj: bytes):
        with _in_llvm:
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _new_target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            engine.finalize_object()
        return engine

    def address(self, name: str) -> int:
        return self._find(name, "get_function_address", "function")

    def global_address(self, name: str) -> int:
        return self._find(name, "get_global_value_address", "global")

    def _find(self, name: str, how: str, what: str) -> int:
        self.wait()
        for engine in self.engines:
            addr = getattr(engine, how)(name)
            if addr:
                return addr
        raise RuntimeError(f"minicomp: compiled module has no {what} {name}")
