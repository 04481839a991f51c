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
import subprocess
import sys
import threading

from .. import options
from .llvm_worker import read_frame, write_frame

MAX_WORKERS = 3
MAX_FAILURES = 3  # workers that failed in this process before it stops starting new ones
MIN_BODIES_PER_MODULE = 3  # a module of its own costs a few ms of LLVM's per-module work and a round trip
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llvm_worker.py")
log = logging.getLogger("minicomp")
_lock = threading.Lock()
_state: dict = {"pid": None, "idle": [], "all": [], "failures": 0}


def workers() -> int:
    """How many worker processes compiles may use."""
    n = options.compile_workers()
    return max(0, min((os.cpu_count() or 1) - 1, MAX_WORKERS) if n is None else n)


class _Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, close_fds=True)

    def compile(self, cpu: str, features: str, ir_text: str) -> bytes:
        write_frame(self.proc.stdin, (cpu, features, ir_text))
        answer = read_frame(self.proc.stdout)
        if answer is None:
            raise RuntimeError(f"compile worker exited (code {self.proc.poll()})")
        status, payload = answer
        if status != "ok":
            raise RuntimeError(payload)
        return payload

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except Exception:
            self.proc.kill()


def _mine() -> None:
    """Forget workers started by the process this one was forked from (under _lock)."""
    if _state["pid"] != os.getpid():
        _state.update(pid=os.getpid(), idle=[], all=[], failures=0)


def prestart() -> None:
    """Start the workers now (if they are not running), so they are ready when the modules are."""
    want = workers()
    with _lock:
        _mine()
        if _state["failures"] >= MAX_FAILURES:  # something about this setup breaks them: stay in process
            return
        while len(_state["all"]) < want:
            try:
                w = _Worker()
            except OSError as e:  # no interpreter to run, no processes allowed: compile in process
                log.info("minicomp: compile workers unavailable (%s); LLVM runs in this process", e)
                _state["all"].append(None)  # counted, so we do not retry at every compile
                continue
            _state["all"].append(w)
            _state["idle"].append(w)


def _take(n: int) -> list:
    with _lock:
        _mine()
        got = _state["idle"][:n]
        del _state["idle"][:n]
        return got


def _give_back(w: _Worker, ok: bool) -> None:
    with _lock:
        if _state["pid"] != os.getpid():
            return
        if ok:
            _state["idle"].append(w)
        else:  # a worker that failed once is not trusted again: a fresh one replaces it
            _state["all"].remove(w)
            _state["failures"] += 1
            if _state["failures"] == MAX_FAILURES:
                log.warning("minicomp: %d compile workers failed in this process; LLVM runs in this process "
                            "from now on (MINICOMP_COMPILE_WORKERS=0 says so from the start)", MAX_FAILURES)
            w.close()


class Job:
    """One module compiling on a worker: `result()` waits for its object code; None when the worker
    failed (logged; the caller compiles the module itself)."""

    def __init__(self, worker: _Worker, cpu: str, features: str, ir_text: str):
        self._out: list = []
        self._thread = threading.Thread(target=self._run, args=(worker, cpu, features, ir_text), daemon=True)
        self._thread.start()

    def _run(self, worker, cpu, features, ir_text) -> None:
        try:
            self._out.append(worker.compile(cpu, features, ir_text))
            _give_back(worker, True)
        except Exception as e:
            log.info("minicomp: a compile worker failed (%s); compiling that module in this process", e)
            _give_back(worker, False)

    def result(self):
        self._thread.join()
        return self._out[0] if self._out else None


def submit(ir_text: str, cpu: str, features: str):
    """Start compiling `ir_text` on an idle worker: a Job, or None when none is idle."""
    if workers() and not _state["idle"]:
        prestart()  # replaces workers that failed (up to MAX_FAILURES)
    got = _take(1)
    return Job(got[0], cpu, features, ir_text) if got else None


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
            remote += 1
    return results, remote


@atexit.register
def _close_all() -> None:
    with _lock:
        if _state["pid"] == os.getpid():
            for w in _state["all"]:
                if w is not None:
                    w.close()
            _state.update(idle=[], all=[])
