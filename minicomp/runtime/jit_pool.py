"""Compile workers: a graph's LLVM modules optimized and emitted side by side on several cores.

llvmlite serializes every call into LLVM in a process (one global lock), so in one process O3 and
machine code use one core however many the machine has, and they were most of what a cold compile
spends after Dynamo's and AOTAutograd's traces. A graph with enough distinct kernel bodies is split
into several modules (codegen/llvm_module.py generate_modules): each but the first goes to a
worker process (llvm_worker.py) as soon as its text is generated (`submit`), the first compiles in
this process, and the workers' object code is loaded here like the disk cache's.

Workers: min(cores - 1, MAX_WORKERS), or $MINICOMP_COMPILE_WORKERS (0: none, every module compiles
in process). They start when a CPU compile begins (`prestart`, from backends.prepare before Dynamo
traces), so their start-up (~50 ms: they import llvmlite and nothing else) overlaps the trace, and
they live until this process exits. A module a worker cannot compile (the worker died, LLVM
refused it) compiles in process instead, with a log line, and a fresh worker takes the failed
one's place (after MAX_FAILURES in a process, none does); a process forked after they started (a
DataLoader's) starts workers of its own. Compiles from several threads at once share them: a
module that finds no idle worker compiles in process.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time

from .. import options
from .llvm_worker import HEADER, identity

MAX_WORKERS = 3
MAX_FAILURES = 3  # workers that failed in this process before it stops starting new ones
MIN_BODIES_PER_MODULE = 3  # a module of its own costs a few ms of LLVM's per-module work and a round trip
READY_S = 30.0  # a worker that has not said hello by then is not a Python with our llvmlite
ANSWER_S = 600.0  # nor one that has not answered a module by then: killed, the module compiles here
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llvm_worker.py")
log = logging.getLogger("minicomp")
_lock = threading.Lock()
_state: dict = {"idle": [], "all": [], "failures": 0}


class Refused(RuntimeError):
    """LLVM refused the module (the worker is fine; compiling it here raises the same error)."""


def workers() -> int:
    """How many worker processes compiles may use: the cores this process may run on, less one."""
    n = options.compile_workers()
    if n is not None:
        return n
    try:
        cores = len(os.sched_getaffinity(0))  # what taskset and a container's cpuset leave us
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(0, min(cores - 1, MAX_WORKERS))


class _Worker:
    """One worker process. It sees the sys.path this process has (so it imports the same llvmlite),
    not the script's folder (-P), ignores Ctrl-C (the terminal's interrupt reaches the whole process
    group: a REPL's Ctrl-C must not kill the workers), and first says which llvmlite and LLVM it
    runs: object code from another version would not be what the disk cache's key says."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        flags = ["-P"] if sys.version_info >= (3, 11) else []  # 3.10: the script's folder shadows nothing we import
        self.proc = subprocess.Popen([sys.executable, *flags, SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, close_fds=True, bufsize=0, env=env)
        self.ready = False

    def _read(self, timeout: float):
        """The worker's next frame, or an exception: it exited, or said nothing for `timeout` s."""
        fd, deadline, data, need = self.proc.stdout.fileno(), time.monotonic() + timeout, b"", HEADER.size
        for part in range(2):
            while len(data) < need:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise RuntimeError(f"compile worker silent for {timeout:g} s")
                chunk = os.read(fd, need - len(data))
                if not chunk:
                    try:
                        code = self.proc.wait(timeout=1)
                    except subprocess.TimeoutExpired:
                        code = None
                    raise RuntimeError(f"compile worker exited (code {code})")
                data += chunk
            if part == 0:
                (need,), data = HEADER.unpack(data), b""
        return pickle.loads(data)

    def compile(self, cpu: str, features: str, ir_text: str) -> bytes:
        if not self.ready:
            hello = self._read(READY_S)
            if hello != identity():
                raise RuntimeError(f"compile worker runs {hello}, this process {identity()}")
            self.ready = True
        data = pickle.dumps((cpu, features, ir_text), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(HEADER.pack(len(data)) + data)
        while view:  # an unbuffered pipe may take part of it at a time
            view = view[self.proc.stdin.write(view):]
        status, payload = self._read(ANSWER_S)
        if status != "ok":
            raise Refused(payload)
        return payload

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _forget_after_fork() -> None:
    """In a child forked from this process: a lock of its own (the parent's may have been held by
    another thread at the fork), and none of the parent's workers; their pipes closed here, so the
    workers see their end when the parent closes them, not when every child has exited."""
    global _lock
    _lock = threading.Lock()
    for w in _state["all"]:
        if w is not None:
            for f in (w.proc.stdin, w.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
    _state.update(idle=[], all=[], failures=0)


os.register_at_fork(after_in_child=_forget_after_fork)


def prestart() -> None:
    """Start the workers now (if they are not running), so they are ready when the modules are."""
    want = workers()
    with _lock:
        for w in [w for w in _state["idle"] if not w.alive()]:  # killed meanwhile (by a signal): replaced,
            _state["idle"].remove(w)                           # not counted as a failure of ours
            _state["all"].remove(w)
            w.close()
        if _state["failures"] >= MAX_FAILURES:  # something about this setup breaks them: stay in process
            return
        while len(_state["all"]) < want:
            try:
                w = _Worker()
            except Exception as e:  # no interpreter to run (sys.executable empty), no processes allowed
                log.info("compile workers unavailable (%s); LLVM runs in this process", e)
                _state["all"].append(None)  # counted, so we do not retry at every compile
                continue
            _state["all"].append(w)
            _state["idle"].append(w)


def _take(n: int) -> list:
    with _lock:
        got = [w for w in _state["idle"] if w.alive()][:n]
        for w in got:
            _state["idle"].remove(w)
        return got


def _give_back(w: _Worker, ok: bool) -> None:
    with _lock:
        if w not in _state["all"]:  # closed at exit meanwhile
            return
        if ok:
            _state["idle"].append(w)
            return
        # a worker that failed once is not trusted again: a fresh one replaces it
        _state["all"].remove(w)
        _state["failures"] += 1
        if _state["failures"] == MAX_FAILURES:
            log.warning("%d compile workers failed in this process; no new ones start, modules "
                        "compile in this process (MINICOMP_COMPILE_WORKERS=0 says so from the start)", MAX_FAILURES)
    w.close()


class Job:
    """One module compiling on a thread while the caller goes on: `compile(*args)` gives its object
    code, or None when it failed (the caller then compiles the module itself, where LLVM's error
    reaches the user). `remote`: the thread waits on a worker process (`submit`); else the module
    compiles in this process (runtime/llvm_jit.py). `result()` waits for it: None also when the
    thread never ran to its end (this is a child forked meanwhile, the thread left in the parent)."""

    def __init__(self, compile, *args, remote: bool = False):
        self.remote = remote
        self._out: list = []
        self._thread = threading.Thread(target=lambda: self._out.append(compile(*args)), daemon=True)
        self._thread.start()

    def result(self):
        self._thread.join()
        return self._out[0] if self._out else None


def _on_worker(worker: _Worker, cpu: str, features: str, ir_text: str):
    """The module's object code from `worker`, which goes back to the idle ones (or is replaced)."""
    try:
        obj = worker.compile(cpu, features, ir_text)
        _give_back(worker, True)
        return obj
    except Refused:  # compiling it here raises LLVM's error where the user sees it
        _give_back(worker, True)
    except Exception as e:
        log.info("a compile worker failed (%s); compiling that module in this process", e)
        _give_back(worker, False)
    return None


def submit(ir_text: str, cpu: str, features: str):
    """Start compiling `ir_text` on an idle worker: a Job, or None when none is idle."""
    if not workers():
        return None
    prestart()  # replaces workers found dead, and ones that failed (up to MAX_FAILURES)
    got = _take(1)
    return Job(_on_worker, got[0], cpu, features, ir_text, remote=True) if got else None


def compile_objects(texts: list, cpu: str, features: str, compile_here, jobs: dict | None = None) -> tuple[list, int]:
    """Object code for each IR text, and how many came from workers. `jobs`: {index: Job} already
    started; of the others, texts[0] (and any that find no idle worker) compile here with
    `compile_here(text)`, the rest on workers meanwhile."""
    jobs = dict(jobs or {})
    for i in range(1, len(texts)):
        if i not in jobs:
            job = submit(texts[i], cpu, features)
            if job is None:
                break
            jobs[i] = job
    results: list = [None] * len(texts)
    for i in range(len(texts)):
        if i not in jobs:
            results[i] = compile_here(texts[i])
    remote = 0
    for i, job in jobs.items():
        results[i] = job.result()
        if results[i] is None:
            results[i] = compile_here(texts[i])
        else:
            remote += job.remote
    return results, remote


@atexit.register
def _close_all() -> None:
    with _lock:
        closing = [w for w in _state["all"] if w is not None]
        _state.update(idle=[], all=[])
    for w in closing:
        w.close()
