"""A compiled frame's code called with Dynamo's guards but without Dynamo's Python wrapper.

A call of a `torch.compile`d callable goes through Dynamo's Python wrapper (`compile_wrapper`: the
eval-frame callback set and reset, the compile stance, tracing checks, hooks, dispatch-key guards),
then its C++ frame evaluation: the cache entry whose guards pass runs its code, the frame's own
bytecode rewritten to call the compiled graph. On this machine the wrapper is ~12 us of a 26 us call
of a 50-op program over 16 floats; the guards ~2 us.

`FrameCall(program, trampoline)` is a call that does the same work itself: it checks the guards
of the entry Dynamo ran last (the whole guard tree, Dynamo's own: tensors, globals, grad mode and the
global state, module attributes) on the trampoline's arguments, and runs that entry's code as a
function. It steps aside to `program` (everything as before, recompiles included) when:
- the guards fail, or the entry was dropped (`torch._dynamo.reset()`) or invalidated (an object its
  guards match by id was freed);
- the frame has a graph break: its code resumes after it in a function Dynamo compiles when it
  runs, or calls the frame's callee, whose own frame Dynamo compiles (called here, either would
  run eagerly);
- the compile stance is not the default (`torch.compiler.set_stance("force_eager")`, a forced
  backend), Dynamo is tracing the caller, or torch.jit is tracing;
- this torch lacks any piece of it (then every call goes through `program`).
After a fallback the entry Dynamo ran (or compiled) becomes the one tried first. `attempt` runs the
entry only, for a caller that has its own way to go when the guards fail (CompiledModule's signature
table: another signature's program).
"""
from __future__ import annotations

import types

import torch

try:  # private Dynamo API; without it every call goes through `program`
    from torch._dynamo import eval_frame as _eval_frame, utils as _dynamo_utils
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list as _cache_entries
except ImportError:
    _eval_frame = _cache_entries = _dynamo_utils = None
from torch.autograd import profiler as _profiler

_is_compiling = torch.compiler.is_compiling
_is_tracing = torch._C._is_tracing


def _usable() -> bool:
    stance = getattr(_eval_frame, "_stance", None)
    return _cache_entries is not None and hasattr(stance, "stance") and hasattr(stance, "backend")


def _entry(trampoline):
    """(guard manager, its code as a function) of the entry Dynamo ran or made last for the
    trampoline's code, or None when that entry cannot run on its own."""
    entries = _cache_entries(trampoline.__code__)
    if not entries:
        return None
    entry = entries[0]  # Dynamo keeps its entries most recently used first
    code, guards = entry.code, entry.guard_manager
    if not isinstance(code, types.CodeType) or not hasattr(guards, "check") or getattr(guards, "cache_entry", None) is None:
        return None
    # code that calls no graph ran the frame's callee eagerly (a graph break inside it: Dynamo compiles
    # the callee's own frame when it runs), code that calls a resume function resumes after a break
    if (not any(name.startswith("__compiled_fn") for name in code.co_names)
            or any(name.startswith("__resume_at") for name in code.co_names)):
        return None
    if len(code.co_freevars) != len(trampoline.__closure__ or ()):
        return None
    scope = trampoline.__globals__
    if _UTILS in code.co_names and scope.get(_UTILS) is _dynamo_utils:
        scope = {**scope, _UTILS: _MARKS}  # the names the code reads were set before it was made
    fn = types.FunctionType(code, scope, trampoline.__name__, trampoline.__defaults__, trampoline.__closure__)
    return guards, fn


class _Marks:
    """torch._dynamo.utils as the rewritten code reads it, with its two profiler marks around the
    graph's call (a record_function while the profiler runs) made without their Dynamo-disabling
    wrappers: ~1.9 us a call there, ~0.2 here."""

    def __getattr__(self, name):
        return getattr(_dynamo_utils, name)

    @staticmethod
    def record_pregraph_bytecode_enter():
        if not _profiler._is_profiler_enabled:
            return None
        mark = torch._C._profiler._RecordFunctionFast("Pregraph bytecode")
        mark.__enter__()
        return mark

    @staticmethod
    def record_pregraph_bytecode_exit(mark) -> None:
        if mark is not None:
            mark.__exit__(None, None, None)


_UTILS = "__import_torch_dot__dynamo_dot_utils"
_MARKS = _Marks()


MISS = object()  # FrameCall.attempt: the guards did not pass, or there is no entry to check


class FrameCall:
    """`program(*args, **kwargs)` (a torch.compile of `trampoline`, a `run(*args, **kwargs)` that calls
    its one free variable `target`), with Dynamo's guards checked here."""

    __slots__ = ("program", "trampoline", "target", "entry", "__weakref__")

    def __init__(self, program, trampoline):
        self.program, self.trampoline, self.entry = program, trampoline, None
        closure = trampoline.__closure__ or ()
        self.target = closure[0].cell_contents if len(closure) == 1 else None
        if _usable() and trampoline.__code__.co_freevars == ("target",):
            self.pick()

    def pick(self) -> None:
        try:
            self.entry = _entry(self.trampoline)
        except Exception:  # a torch whose cache entries look otherwise: the full path only
            self.entry = None

    def check(self, args, kwargs=None) -> bool:
        """Dynamo's guards of the entry on these arguments (what `attempt` checks)."""
        entry = self.entry
        return entry is not None and self._passes(entry[0], args, kwargs)

    def _passes(self, guards, args, kwargs) -> bool:
        # a dropped entry no longer points at these guards (its destructor clears `cache_entry`; an
        # invalidated one carries a DeletedGuardManagerWrapper instead)
        ce = guards.cache_entry
        return ce is not None and ce.guard_manager is guards and guards.check(
            {"args": args, "kwargs": {} if kwargs is None else kwargs, "target": self.target})

    def attempt(self, args, kwargs=None):
        """The entry's code run on `args` (a tuple) and `kwargs` when its guards pass here, else MISS
        (nothing run)."""
        entry = self.entry  # read once: another thread's fallback may pick a new one meanwhile
        if entry is None:
            return MISS
        stance = _eval_frame._stance  # set_stance replaces the object: read at each call
        if stance.stance != "default" or stance.backend is not None or _is_compiling() or _is_tracing():
            return MISS
        if not self._passes(entry[0], args, kwargs):
            return MISS
        return entry[1](*args) if kwargs is None else entry[1](*args, **kwargs)

    def __call__(self, *args, **kwargs):
        if self.entry is None:
            return self.program(*args, **kwargs)
        out = self.attempt(args, kwargs)
        return self.fallback(*args, **kwargs) if out is MISS else out

    def fallback(self, *args, **kwargs):
        """The call through `program` (Dynamo's wrapper, guards, recompiles), then the entry it ran or
        compiled for these arguments is the one tried first."""
        out = self.program(*args, **kwargs)
        if self.entry is not None:
            self.pick()
        return out
