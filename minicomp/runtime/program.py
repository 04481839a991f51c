"""A compiled program: the steps every backend runs, over one flat list of values (the env).

env layout: [inputs..., constants..., one slot per step result]. Steps are prepared at compile time
-- kernel launches (runtime/cpu.py, cuda.py, cuda_emu.py) and torch calls (externs, matmuls, views)
-- and a call is one generated Python function, one line a step (Executor): no Python work beyond
filling pointer arrays and calling. Pointers that never change (arena views, constants) go into the
kernels' tables once, when the call is generated; a program whose steps are all plain CPU kernels
fills one pointer array and runs every kernel in one native call (runtime/cpu.py PlanRun, the CPU's
counterpart of a CUDA Graph replay). Profiling (options.profile) and a torch.profiler trace get the
same function with a clock read around each step, or each step inside a record_function of its
name (such a program's one native call taken apart into its kernels' calls): what is timed is what
runs unprofiled. overhead.py times the call's phases the same way (Executor.phased).
Intermediates kernels write live in one arena (planned by backends/arena.py); graph
outputs are fresh tensors each call. On the CPU a big output's memory is recycled once the caller has
dropped every reference to it (see Recycler): fresh pages from the OS cost a page fault and zeroing
each, which for a 64 MB output takes longer than the kernel that fills it.
"""
from __future__ import annotations

import functools
import threading
import time

import torch

try:  # torch.empty parses its arguments each call (~1.5 us); Inductor's generated code calls this (~0.4 us)
    from torch._C._dynamo.guards import _empty_strided_cpu
except ImportError:  # private: a torch without it gets the public call
    def _empty_strided_cpu(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype)

try:  # a view with no autograd bookkeeping (~0.9 us against as_strided's ~1.9), as Inductor's code makes them
    from torch._C._dynamo.guards import _reinterpret_tensor as _reinterpret
except ImportError:
    def _reinterpret(t, size, stride, offset):
        return t.as_strided(size, stride, t.storage_offset() + offset)

from .pages import HUGE_MIN_BYTES, advise_huge
from torch.autograd import profiler as _profiler  # ._is_profiler_enabled: whether a torch.profiler records


RECYCLE_MIN_BYTES = 1 << 20  # smaller blocks come from malloc's free lists without page faults
RECYCLE_KEEP = 2  # storages kept per output: `y = f(x)` in a loop holds one while the next is made


class Recycler:
    """Makes one output's tensor each call, reusing a storage of an earlier call's output when
    nothing but this recycler references it any more (storage use count 1: no tensor, view,
    autograd save or storage object of the caller's is left), like a caching allocator.
    Fresh storages are adopted until RECYCLE_KEEP are held; beyond that outputs are plain new tensors."""

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device = torch.Size(shape), dtype, device
        self.stride = torch.empty(shape, device="meta").stride()
        self.nbytes = self.shape.numel() * dtype.itemsize
        self.storages = []

    def __call__(self) -> torch.Tensor:
        for s in self.storages:
            if torch._C._storage_Use_Count(s._cdata) == 1 and s.nbytes() == self.nbytes:
                return torch.empty(0, dtype=self.dtype, device=self.device).set_(s, 0, self.shape, self.stride)
        t = advise_huge(torch.empty(self.shape, dtype=self.dtype, device=self.device))
        if len(self.storages) < RECYCLE_KEEP:
            self.storages.append(t.untyped_storage())
        return t


class TorchCall:
    """A step that runs in torch: fn(*env[args]) -> env[out]; results kernels read are made contiguous."""

    def __init__(self, fn, args: list, out: int, contiguous: bool):
        self.fn, self.args, self.out, self.contiguous = fn, args, out, contiguous

    def emit(self, k: int, v, ns: dict) -> list:
        ns[f"T{k}"] = self.fn
        lines = [f"{v(self.out)} = T{k}({', '.join(v(a) for a in self.args)})"]
        if self.contiguous:
            lines.append(f"if isinstance({v(self.out)}, Tensor) and not {v(self.out)}.is_contiguous(): "
                         f"{v(self.out)} = {v(self.out)}.contiguous()")
        return lines


class AsStrided:
    """A chain of views of a tensor whose layout is known when compiling, as one view
    (backends/layout.py static_views); `offset` counts from the root's own storage offset.
    `fallback(root)`: the chain's torch ops, for a root whose layout is only known when it is
    contiguous (checked each call). A view no output is a tracked view of (`output` False: only
    torch ops of this call read it) is made without autograd's view bookkeeping, as Inductor's
    reinterpret_tensor, and a fixed root's (an arena's, a constant's) once, when the call is made."""

    def __init__(self, root: int, out: int, size, stride, offset: int, fallback=None, output: bool = True):
        self.root, self.out, self.size, self.stride, self.offset = root, out, size, stride, offset
        self.fallback, self.output = fallback, output

    def emit(self, k: int, v, ns: dict) -> list:
        r, o = v(self.root), v(self.out)
        args = f"{self.size!r}, {self.stride!r}"
        if self.fallback is not None:
            ns[f"F{k}"] = self.fallback
        if r in ns and not self.output:  # a fixed root: the view is made now
            t = ns[r]
            ns[f"V{k}"] = (_reinterpret(t, self.size, self.stride, self.offset)
                           if self.fallback is None or t.is_contiguous() else self.fallback(t))
            return [f"{o} = V{k}"]
        if self.output:
            view = f"{r}.as_strided({args}, {r}.storage_offset() + {self.offset})"
        else:
            ns["RT"] = _reinterpret
            view = f"RT({r}, {args}, {self.offset})"
        if self.fallback is None:
            return [f"{o} = {view}"]
        return [f"{o} = {view} if {r}.is_contiguous() else F{k}({r})"]


def _touched(step) -> list:
    """The env slots a step reads or writes."""
    if isinstance(step, TorchCall):
        return step.args + [step.out]
    if isinstance(step, AsStrided):
        return [step.root, step.out]
    return list(getattr(step, "slots", ()))


def _lifetimes(steps: list, p, fixed) -> tuple[dict, dict]:
    """({slot: the first step touching it}, {step index: the temporaries -- torch results, their
    views, fresh buffers -- no later step reads}). The call makes each fresh output just before its
    first step and drops each temporary after its last use, as Inductor's code does, so malloc hands
    the memory to the next torch result while its pages are warm and the call's peak stays low."""
    first, last = {}, {}
    for k, step in enumerate(steps):
        for x in _touched(step):
            first.setdefault(x, k)
            last[x] = k
    keep = {o for o in p.outputs if o is not None}
    drop: dict = {}
    for x, k in sorted(last.items()):
        if x >= p.n_inputs and x not in keep and fixed(x) is None:
            drop.setdefault(k, []).append(x)
    return first, drop


class Program:
    """`buffers` lists the slots kernels write: (slot, shape, dtype, arena offset, or None for a fresh
    output each call). `keepalive` holds what the steps' code lives in (a JIT engine, a module).

    Calls may come from several threads at once (a server's workers, a DataLoader's collate). Each
    call in flight runs on an executor of its own -- an arena, recycled outputs and kernel pointer
    tables no other call touches -- checked out of a small pool for the call and put back after, so
    calls run side by side instead of queueing on one lock. The first executor uses the launches'
    own pointer tables; one built for a second caller in flight gets private tables
    (KernelLaunch.private). Checking out and back is a list pop and
    append: atomic under the GIL, a tenth of a microsecond.

    Each step has `emit(k, v, ns)`: its lines of the generated call. `timers` (options.profile):
    per step, None or a function given the seconds each call of the step took. `bind`: run on the
    steps once, before the first call builds its executor (the cpu backend's kernels wait there for
    machine code still compiling when the program was built)."""

    MAX_EXECUTORS = 16  # calls in flight at once; more wait for one to finish

    def __init__(self, n_inputs: int, constants: list, steps: list, buffers: list, outputs: list,
                 arena_bytes: int, n_slots: int, device="cpu", may_alias=(), recycle=True, contiguous_inputs=None,
                 names=None, timers=None):
        self.n_inputs, self.steps, self.outputs = n_inputs, steps, outputs
        self.timers = list(timers) if timers is not None else [None] * len(steps)
        # what each step is called in a torch.profiler trace ("minicomp forward_0 k3 (add+gelu)")
        self.names = list(names) if names is not None else [f"minicomp step {i}" for i in range(len(steps))]
        # inputs kernels read are made contiguous; the others go to torch ops as they come
        self.contiguous_inputs = tuple(range(n_inputs) if contiguous_inputs is None else contiguous_inputs)
        self.may_alias = tuple(may_alias)  # output positions a torch op made: they may view the arena
        self.constants, self.buffers, self.arena_bytes, self.device = constants, buffers, arena_bytes, device
        self.n_slots, self.recycle = n_slots, recycle
        self._first: list = []   # the primary executor while it is idle (built on the first call:
        self._idle: list = []    # compilation may run under a fake-tensor mode); idle private executors
        self._count = 0
        self._grow = threading.Condition()
        self._released = False
        self.keepalive = None
        self.bind = None  # steps -> steps, run once before the first call (backends/cpu.py binds kernels)

    def _bound(self) -> list:
        """The steps, bound first if they are waiting for their machine code (under self._grow)."""
        if self.bind is not None:
            self.steps = self.bind(self.steps)
            self.bind = None
        return self.steps

    def primary(self) -> "Executor":
        """The executor single-threaded calls run on (built now if no call has run yet)."""
        if not self._count:
            with self._grow:
                if not self._count:
                    self._first.append(Executor(self, self._bound()))
                    self._count = 1
        return self._first[0] if self._first else None

    def _checkout(self) -> "Executor":
        if self._released:
            raise RuntimeError("minicomp: this program was released with the compiled callable that owned it")
        try:
            return self._first.pop()
        except IndexError:
            pass
        try:
            return self._idle.pop()
        except IndexError:
            pass
        with self._grow:
            while True:
                if not self._count:  # the very first call
                    ex = Executor(self, self._bound())
                    self._count = 1
                    return ex
                try:
                    return self._first.pop() if self._first else self._idle.pop()
                except IndexError:
                    pass
                if self._count < self.MAX_EXECUTORS:
                    self._count += 1
                    return Executor(self, [s.private() if hasattr(s, "private") else s for s in self.steps],
                                    primary=False)
                self._grow.wait()

    def _checkin(self, ex: "Executor") -> None:
        if self._released:  # released during the call: no later call may find this executor
            return
        (self._first if ex.is_primary else self._idle).append(ex)
        if self._count >= self.MAX_EXECUTORS:
            with self._grow:
                self._grow.notify()

    def release(self, keep_code: bool = False) -> None:
        """Free the arenas, recycled outputs and machine code (the callable that owned this program
        is gone); a later call is an error, not a use of freed code. `keep_code`: free only what a
        call builds again (the executors: arenas, recycled outputs), for a backward that autograd
        graphs made before the owner died may still call."""
        if keep_code:  # the idle executors go; one out in a call is checked in as usual, and while the
            with self._grow:  # primary is out, no second one is built (the count still holds it)
                self._count -= len(self._first) + len(self._idle)
                self._first.clear()
                self._idle.clear()
            return
        self.steps, self.keepalive, self.bind, self._released = [], None, None, True
        self._first.clear()
        self._idle.clear()

    def __call__(self, *inputs):
        try:  # the primary executor, idle: the common case, inline (a released program has none)
            ex = self._first.pop()
        except IndexError:
            ex = self._checkout()
        try:
            if _profiler._is_profiler_enabled:  # a torch.profiler trace shows each kernel and torch call by name
                return ex.traced(*inputs)
            return ex.run(*inputs)
        finally:
            self._checkin(ex)


class Executor:
    """One call's state: the env template (constants and arena views), the arena, the makers of fresh
    outputs (recyclers), and the steps with their pointer tables."""

    def __init__(self, program: Program, steps: list, primary: bool = True):
        self.program, self.steps, self.is_primary = program, steps, primary
        p = program
        template = [None] * p.n_slots
        for i, c in enumerate(p.constants):
            template[p.n_inputs + i] = c.contiguous()
        arena = advise_huge(torch.empty(p.arena_bytes, dtype=torch.uint8, device=p.device)) if p.arena_bytes else None
        self.fresh = []
        cpu = torch.device(p.device).type == "cpu"
        for slot, shape, dtype, offset in p.buffers:
            if offset is None:
                nbytes = torch.Size(shape).numel() * dtype.itemsize
                if p.recycle and cpu and nbytes >= RECYCLE_MIN_BYTES:
                    self.fresh.append((slot, Recycler(shape, dtype, p.device)))
                elif cpu:
                    stride = torch.empty(shape, device="meta").stride()
                    make = functools.partial(_empty_strided_cpu, tuple(shape), stride, dtype)
                    self.fresh.append((slot, (lambda make=make: advise_huge(make())) if nbytes >= HUGE_MIN_BYTES else make))
                else:
                    self.fresh.append((slot, functools.partial(torch.empty, shape, dtype=dtype, device=p.device)))
            else:
                numel = torch.Size(shape).numel()
                nbytes = max(1, numel) * dtype.itemsize
                template[slot] = arena[offset:offset + nbytes].view(dtype)[:numel].view(shape)
        self.arena = arena
        self.arena_range = (arena.data_ptr(), arena.data_ptr() + p.arena_bytes) if arena is not None else None
        self.template = template
        self.source = self.traced_source = self.phased_source = ""  # the generated calls' text (tests compare them)
        self.run = self._generate()
        self._traced = None

    def traced(self, *inputs):
        """The call with each step inside a torch.profiler record_function of its name, so a trace
        shows each kernel and torch call (generated at the first traced call)."""
        if self._traced is None:
            self._traced = self._generate(traced=True)
        return self._traced(*inputs)

    def _plan(self, fixed):
        """The one-call path's maker (runtime/cpu.py PlanRun) when this executor's steps can all
        take it: kernels that run whole or on the OpenMP team without run-time checks, and views;
        not with per-step timers, nor for a private executor (its launches take their own tables)."""
        kernels = [s for s in self.steps if not isinstance(s, AsStrided)]
        Plan = getattr(type(kernels[0]), "Plan", None) if kernels else None
        if (Plan is None or not self.is_primary or any(t is not None for t in self.program.timers)
                or len(kernels) < 2 or not all(Plan.plannable(s) for s in kernels)):  # one: its own call is cheaper
            return None
        return lambda dynamic, fixed: Plan(kernels, dynamic, fixed)

    def phased(self):
        """The call with a clock read between its phases (overhead.py): (run, totals, marks), where
        totals[j] adds up the seconds spent in phase j (its name: the key of run.phases) over the
        calls made, and marks[j] counts the clock reads phase j takes per call."""
        totals: list = []
        run = self._generate(phased=totals)
        return run, totals, run.marks

    @staticmethod
    def mark_seconds(calls: int = 2000, n: int = 20) -> float:
        """What one clock read of a phased call adds to the phase it closes (timed on marks alone)."""
        ns = {"clock": time.perf_counter, "ACC": [0.0]}
        body = ["    t0 = clock()"] + ["    t1 = clock(); ACC[0] += t1 - t0; t0 = t1"] * n
        exec(compile("def marks():\n" + "\n".join(body) + "\n", "<minicomp marks>", "exec"), ns)
        for _ in range(calls):
            ns["marks"]()
        return ns["ACC"][0] / (calls * n)

    def _generate(self, traced: bool = False, phased: list | None = None):
        """The call as generated Python, one line a step, every slot a local: no list, no loop over
        the steps, no attribute lookups (a few microseconds on a small program). A step with a timer
        runs between two clock reads; `traced` puts each step inside its record_function; `phased`
        (a list, filled with one running total per phase) puts a clock read between phases."""
        p = self.program
        ns: dict = {"Tensor": torch.Tensor, "clock": time.perf_counter,
                    "record_function": torch.profiler.record_function}

        def v(slot: int) -> str:
            if self.template[slot] is not None and slot >= p.n_inputs:
                ns[f"C{slot}"] = self.template[slot]  # a constant or an arena view: fixed
                return f"C{slot}"
            return f"s{slot}"

        def fixed(slot: int):
            return self.template[slot] if slot >= p.n_inputs else None
        groups: list = []  # (phase, lines): what phased mode times apart
        groups.append(("input checks", [f"if not s{i}.is_contiguous(): s{i} = s{i}.contiguous()"
                                        for i in p.contiguous_inputs]))
        for slot, make in self.fresh:
            ns[f"M{slot}"] = make
        allocation = ("output allocation", [f"s{slot} = M{slot}()" for slot, _ in self.fresh])
        groups.append(allocation)  # a call with torch steps makes each just before its first use instead
        tables = [s.ptrs_addr for s in self.steps if hasattr(s, "prefill")]
        if len(set(tables)) == len(tables):  # no two launches share a table: fixed pointers go in once
            for step in self.steps:
                if hasattr(step, "prefill"):
                    step.prefill(fixed)
        plan = None if traced or len(set(tables)) != len(tables) else self._plan(fixed)
        if plan is not None:  # every step a kernel (or a view): one native call runs them all
            dynamic = list(dict.fromkeys(s for step in self.steps if hasattr(step, "slots")
                                         for s in step.slots if fixed(s) is None))
            for k, step in enumerate(self.steps):
                if isinstance(step, AsStrided):
                    groups.append(("views", step.emit(k, v, ns)))
            body = plan(dynamic, fixed).emit([v(s) for s in dynamic], ns)
            groups += [("pointer binding", body[:-1]), ("kernels", body[-1:])]
        first_use, last = _lifetimes(self.steps, p, fixed)
        first: dict = {}
        if plan is None and self.steps:  # each output made just before the step that writes it, not held across
            groups.remove(allocation)  # the torch calls before it (oneDNN scratch, a matmul result)
            for slot, _ in self.fresh:
                first.setdefault(first_use.get(slot, 0), []).append(f"s{slot} = M{slot}()")
        for k, (step, timer) in enumerate(zip(self.steps, p.timers)):
            if plan is not None:
                break
            if k in first:
                groups.append(("output allocation", first[k]))
            emitted = step.emit(k, v, ns)
            dels = [f"del {', '.join(f's{x}' for x in last[k])}"] if k in last else []
            if phased is not None and hasattr(step, "slots"):  # a launch: its pointer lines, then its call
                groups += [("pointer binding", emitted[:-1]), ("kernels", emitted[-1:] + dels)]
                continue
            body = emitted + dels
            if timer is not None:
                ns[f"D{k}"] = timer
                body = ["t = clock()", *body, f"D{k}(clock() - t)"]
            if traced:
                ns[f"N{k}"] = p.names[k]
                body = [f"with record_function(N{k}):", *("    " + line for line in body)]
            groups.append(("views" if isinstance(step, AsStrided) else "kernels" if hasattr(step, "slots")
                           else "torch calls", body))
        outs = ["None" if o is None else v(o) for o in p.outputs]
        tail = []
        if self.arena_range is not None:  # never hand out memory the next call overwrites
            lo, hi = self.arena_range
            for i in p.may_alias:
                tail.append(f"o{i} = {outs[i]}")
                tail.append(f"if {lo} <= o{i}.data_ptr() < {hi}: o{i} = o{i}.clone()")
                outs[i] = f"o{i}"
        groups.append(("output checks", tail))
        lines = [f"def run({', '.join(f's{i}' for i in range(p.n_inputs))}):"]
        phases: dict = {}
        marks: list = []
        if phased is not None:
            lines.append("    t0 = clock()")
        for phase, body in groups:
            lines += ["    " + line for line in body]
            if phased is not None and body:
                j = phases.setdefault(phase, len(phases))
                marks += [0] * (len(phases) - len(marks))
                marks[j] += 1
                lines.append(f"    t1 = clock(); ACC[{j}] += t1 - t0; t0 = t1")
        lines.append(f"    return [{', '.join(outs)}]")
        source = "\n".join(lines) + "\n"
        if phased is not None:
            phased[:] = [0.0] * len(phases)
            ns["ACC"] = phased
            self.phased_source = source
        elif traced:
            self.traced_source = source
        else:
            self.source = source
        exec(compile(source, "<minicomp program>", "exec"), ns)
        ns["run"].phases, ns["run"].marks = phases, marks  # phased: name -> index in the totals, clock reads
        return ns["run"]
