"""`minicomp.compile`: a callable with the model's signature that compiles lazily per input signature.

Why not just `torch.compile(model, backend=...)`? Dynamo keys its cache on the Python code object,
so many closures of one function (or many instances of one module class) share one recompile
limit, and past it Dynamo quietly runs eager. Each CompiledModule instead keeps its own table of
programs, one per input signature (shapes, dtypes, devices, requires_grad, grad mode, scalar
arguments, train/eval mode), each traced through a fresh copy of a small trampoline's code object
and with `isolate_recompiles`, so its Dynamo cache, including the frames Dynamo resumes in after a
graph break inside the user's code, is its own. Whatever still runs eagerly is named in the
report and logged, never silent.

Sizes that change (dynamic="auto", the default): the first call compiles a static program; a later
call whose signature differs from a compiled one only in some tensors' sizes compiles one program
with exactly those dimensions symbolic, except sizes 0 and 1, which torch specializes too (Dynamo's
maybe_mark_dynamic; its ShapeEnv keeps the guards),
which then serves every size of them -- the signature table keys it with those sizes left out.
dynamic=True makes every dimension symbolic from the first call; dynamic=False compiles a program per
signature, as Dynamo's static mode does.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import logging
import threading
import types
import weakref
from typing import NamedTuple

import torch
from torch._dynamo.exc import BackendCompilerFailed
from torch._dynamo.utils import counters, graph_break_reasons, guard_failures

from .compiler.capture import make_backend, prepare
from .errors import MinicompError
from .frame_call import MISS, FrameCall
from .guard_profile import unprofiled
from .options import Options
from .report import Report
from .signature import (break_site, call_signature, changed_dims, describe, flat_inputs, guard_failure,
                        program_line, short_reason, wild)

log = logging.getLogger("minicomp")

# torch >= 2.13 can give a compiled callable a Dynamo cache of its own, resumed frames included;
# older torch gets the fresh trampoline code object only (graph breaks inside shared code then
# share Dynamo's recompile limit, and the report says when frames run eagerly).
_ISOLATE = {"isolate_recompiles": True} if "isolate_recompiles" in inspect.signature(torch.compile).parameters else {}


try:  # Dynamo's C++ tensor check (private: without it every call takes the Python signature)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:
    _TensorGuards = None


class _Fast(NamedTuple):
    """The last signature's program, checked without building its key: by Dynamo's guards when its
    entry runs without Dynamo's wrapper (frame_call.py), else by TensorGuards, which compare each
    tensor's dtype, device, dispatch keys (so autocast and inference mode too), requires_grad, sizes
    and strides in C++, ~0.15 us where `call_signature` takes ~0.9."""
    guards: object
    nargs: int
    grad: bool
    owner: object  # the module (its .training is part of the key), or _NO_MODE for a function
    training: object
    program: FrameCall


class _NoMode:
    training = None


_NO_MODE = _NoMode()


def _fast_path(model, key, args, program: FrameCall, dims=frozenset()):
    """`dims`: the (argument, dimension) pairs the program takes at any size. A program whose Dynamo
    entry runs here (`program.entry`) is checked by Dynamo's guards alone; TensorGuards are kept for
    when it has none (a graph break in it), or loses it."""
    guards = None
    if _TensorGuards is not None and key[0] == "tensors":
        try:
            sizes = [[None if (i, d) in dims else s for d, s in enumerate(x.shape)] for i, x in enumerate(args)]
            strides = [[None if any(a == i for a, _ in dims) else s for s in x.stride()] for i, x in enumerate(args)]
            guards = _TensorGuards(*args, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
        except Exception:  # a tensor the C++ check does not take: the Python signature still works
            guards = None
    if guards is None and program.entry is None:
        return None
    owner = model if isinstance(model, torch.nn.Module) else _NO_MODE
    return _Fast(guards, len(args), key[1], owner, key[2], program)


_PROGRAM_IDS = itertools.count(1)


_MARKS = ("_dynamo_weak_dynamic_indices", "_has_dynamo_dim_marking")  # what maybe_mark_dynamic sets


def _mark_dynamic(inputs, dims) -> list:
    """Mark dims (input position, dim) of `inputs` dynamic for this compile (Dynamo's
    maybe_mark_dynamic); returns each marked tensor with the marks it had before, for _unmark."""
    before = {}
    for i, d in dims:
        t = inputs[i]
        if id(t) not in before:
            before[id(t)] = (t, {a: getattr(t, a) for a in _MARKS if hasattr(t, a)})
            if hasattr(t, _MARKS[0]):
                t._dynamo_weak_dynamic_indices = set(t._dynamo_weak_dynamic_indices)  # ours, not the caller's set
        torch._dynamo.maybe_mark_dynamic(t, d)
    return list(before.values())


def _unmark(marked) -> None:
    """The marks the caller's tensors carried before this compile: a mark left behind made a later
    compile of another callable, or with dynamic=False, symbolic in those dims."""
    for t, old in marked:
        for a in _MARKS:
            if a in old:
                setattr(t, a, old[a])
            elif hasattr(t, a):
                delattr(t, a)


def _trampoline(target):
    def run(*args, **kwargs):
        return target(*args, **kwargs)
    # a new code object: a Dynamo cache of its own. Code objects compare by value and Dynamo keeps its
    # recompile reasons in a dict keyed by code, so each gets an unused constant of its own too (not a
    # name: that would show in the stack traces the graph cache keys on)
    code = run.__code__.replace(co_consts=run.__code__.co_consts + (f"minicomp program {next(_PROGRAM_IDS)}",))
    return types.FunctionType(code, run.__globals__, run.__name__, run.__defaults__, run.__closure__)


class CompiledModule:
    """Calls like the model; attribute reads and writes go to the model (`compiled.training`,
    `compiled.state_dict()`, `compiled.weight = ...`), `compiled.forward` is the compiled call, and
    methods that return the model itself (`.eval()`, `.to()`, `.train()`) return this CompiledModule,
    so chaining never drops compilation. It is not an nn.Module: register the model, not this."""

    _OWN = frozenset({"model", "options", "_report", "_programs", "_fast", "_warned_limit", "_lock", "__wrapped__",
                      "__doc__", "_patterns", "_codes", "_no_symbolic"})

    def __init__(self, model, options: Options):
        self.model = model
        self.options = options
        self._report = Report()
        self._programs: dict = {}  # signature -> (program, _Fast or None)
        self._fast: _Fast | None = None
        self._patterns: list = []  # the dimension sets of the symbolic programs (signature table keys: wild)
        self._codes: list = []  # each program's code object, in report.programs' order (Dynamo's recompiles)
        self._warned_limit = False
        self._no_symbolic: str | None = None  # why a symbolic program could not be built: sizes get static ones
        self._lock = threading.Lock()  # one compile at a time: threads racing on a new signature build it once
        # Dynamo keeps what it compiled alive after this callable is gone (its caches hang off code
        # objects it still references): release the programs' arenas and machine code with us
        weakref.finalize(self, _release, self._report.runs)
        self.__wrapped__ = model
        self.__doc__ = getattr(model, "__doc__", None)

    def __call__(self, *args, **kwargs):
        fast, tried = self._fast, None
        if fast is not None and not kwargs and len(args) == fast.nargs:
            run = fast.program
            if run.entry is not None:  # Dynamo's own guards, checked without its wrapper (frame_call.py)
                out = run.attempt(args)
                if out is not MISS:
                    return out
                tried = run
            elif (fast.guards is not None and torch.is_grad_enabled() is fast.grad
                  and fast.owner.training is fast.training and fast.guards.check(*args)):
                return run.program(*args)
        key = call_signature(self.model, args, kwargs)
        entry = self._programs.get(key) or self._symbolic_program(key)
        if entry is None:
            with self._lock:
                entry = self._programs.get(key) or self._symbolic_program(key)  # another thread's compile
                if entry is None:
                    if len(self._programs) >= self.options.max_programs:
                        self._note_limit(args, kwargs)
                        return self.model(*args, **kwargs)
                    return self._compile_new(key, args, kwargs)
        program, fast = entry
        if fast is not None:
            self._fast = fast
        if program is tried:  # its guards just failed here: straight to Dynamo's own path
            return program.fallback(*args)
        return program(*args, **kwargs)

    def _symbolic_program(self, key):
        for dims in self._patterns:
            entry = self._programs.get(wild(key, dims))
            if entry is not None:
                return entry
        return None

    def _dims_for(self, key, inputs):
        """The dimensions a new signature's program takes symbolic: with dynamic="auto", those where it
        differs in size from a signature compiled before (every one with dynamic=True)."""
        dynamic = self.options.dynamic
        if dynamic is False:
            return frozenset()
        if dynamic is True:
            return frozenset((i, d) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) for d in range(x.dim()))
        for other in self._programs:
            dims = changed_dims(other, key)
            if dims:
                # a size 0 or 1 stays static, as torch specializes it (a decode step's one token):
                # a program traced at 1 keeps `T > 1` symbolic, which torch ops and Dynamo refuse
                return frozenset((i, d) for i, d in dims if key[3 + i][0][d] > 1)
        return frozenset()

    def _note_limit(self, args, kwargs):
        if not self._warned_limit:  # the first miss is named; later ones go to the debug log
            self._warned_limit = True
            self._eager(f"max_programs={self.options.max_programs} input signatures already compiled; the call "
                        f"{describe(args, kwargs)} and later new signatures run eagerly (raise max_programs, "
                        "or keep shapes and dtypes fixed)")
        else:
            log.debug("max_programs reached; %s runs eagerly", describe(args, kwargs))

    def _eager(self, msg: str):
        if msg not in self._report.eager:  # once per compiled callable, not once per program
            log.warning("%s", msg)
            self._report.eager.append(msg)

    def _compile_new(self, key, args, kwargs):
        """A program for a new signature: symbolic in the dims that varied, or where minicomp cannot
        build that one (a size torch left unbacked: x[T - 2:]), static for this call's sizes."""
        dims = self._dims_for(key, flat_inputs(args, kwargs))
        if dims and self._no_symbolic is not None:
            return self._compile_and_run(key, args, kwargs, note=self._no_symbolic)
        if not dims or self.options.strict:
            return self._compile_and_run(key, args, kwargs, dims)
        try:
            return self._compile_and_run(key, args, kwargs, dims)
        except MinicompError as e:
            self._no_symbolic = f"its sizes varied, but no program over varying sizes: {str(e).splitlines()[0]}"
            log.warning("%s; each size gets a static program", self._no_symbolic)
            return self._compile_and_run(key, args, kwargs, note=self._no_symbolic)

    def _compile_and_run(self, key, args, kwargs, dims=frozenset(), note: str = ""):
        backend = make_backend(self.options, self._report)
        # Static shapes: the first call, which traces every frame it reaches, turns automatic dynamic
        # shapes off (Dynamo's frame state can outlive one program). Not dynamic=False: that patches
        # the config on every call (~4 us); a later recompile that still goes dynamic runs in torch.
        entry = _trampoline(self.model)
        program = torch.compile(entry, backend=backend, **_ISOLATE)
        before, graphs_before = dict(counters["graph_break"]), len(self._report.graphs) + len(self._report.eager)
        breaks_before = len(graph_break_reasons)
        inputs = flat_inputs(args, kwargs)
        prepare(self.options, inputs)
        marked = _mark_dynamic(inputs, dims)
        try:
            with torch._dynamo.config.patch(automatic_dynamic_shapes=False, assume_static_by_default=True), \
                    torch.fx.experimental._config.patch(backed_size_oblivious=bool(dims)), unprofiled():
                out = program(*args, **kwargs)
        except BackendCompilerFailed as e:
            inner = getattr(e, "inner_exception", None)
            if isinstance(inner, MinicompError):
                raise inner from None
            raise
        finally:
            _unmark(marked)
        said = set()
        for r in graph_break_reasons[breaks_before:]:  # with the user's line that broke the graph
            said.add(short_reason(r.reason))
            self._eager(f"graph break{break_site(r.user_stack)} (the code around it runs eagerly) -- {short_reason(r.reason)}")
        for reason, count in counters["graph_break"].items():  # a break that compiled no graph before it
            if count > before.get(reason, 0) and short_reason(reason) not in said:
                self._eager(f"graph break (the code around it runs eagerly): {short_reason(reason)}")
        if len(self._report.graphs) + len(self._report.eager) == graphs_before:
            self._eager(f"no graph captured for call signature #{len(self._programs)} (nothing to compile, "
                        "or Dynamo skipped the frame): it runs eagerly")
        self._report.programs.append(program_line(key, dims, args, kwargs, self.options.dynamic) + (f" ({note})" if note else ""))
        self._codes.append(entry.__code__)
        program = FrameCall(program, entry)
        fast = _fast_path(self.model, key, args, program, dims)
        if dims:
            key = wild(key, dims)
            self._patterns.append(dims)
        self._programs[key] = (program, fast)
        if fast is not None:
            self._fast = fast
        return out

    def report(self) -> Report:
        """What was compiled and why; Dynamo's own recompiles of a program (a guard it made failed
        for a later call, e.g. a model's `if length > 1`) are read from Dynamo at each request."""
        self._report.recompiles = [f"program {i} recompiled by Dynamo, a guard it made failed: {guard_failure(r)}"
                                   for i, code in enumerate(self._codes, 1) for r in guard_failures.get(code, ())]
        return self._report

    def __getattr__(self, name):
        # only called for names not found on the wrapper: forward reads to the wrapped model
        if name in CompiledModule._OWN:
            raise AttributeError(name)
        if name == "forward" and isinstance(self.model, torch.nn.Module):
            return self.__call__  # `compiled.forward(x)` must not bypass compilation
        value = getattr(self.model, name)
        if isinstance(value, types.MethodType) and value.__self__ is self.model:
            return self._rewrap(value)
        return value

    def _rewrap(self, method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            out = method(*args, **kwargs)
            return self if out is self.model else out
        return call

    def __setattr__(self, name, value):
        if name in CompiledModule._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.model, name, value)

    def __delattr__(self, name):
        if name in CompiledModule._OWN:
            object.__delattr__(self, name)
        else:
            delattr(self.model, name)

    def __repr__(self) -> str:
        return f"CompiledModule({self.model!r}, backend={self.options.backend!r})"

    def __reduce__(self):
        """copy.deepcopy and pickle (an EMA copy of a model holding a compiled part, torch.save): the
        model and the options; the copy compiles its own programs on its first call (machine code,
        arenas and Dynamo's caches are not copied)."""
        return CompiledModule, (self.model, self.options)


def _release(runs: list) -> None:
    """The programs of a compiled callable that is gone. A backward's keeps its code (`keep_code`):
    an autograd graph a forward made before may still call it."""
    for run in runs:
        release = getattr(run, "release", None)
        if release is not None:
            release(keep_code=getattr(run, "called_by_autograd", False))
    runs.clear()


def compile(model_or_fn, *, backend: str = "auto", debug=False, remat: bool = True, cuda_graphs: bool = True,
            strict: bool = False, max_programs: int = 8, recycle_outputs: bool = True,
            remat_budget: float | None = None, dynamic="auto") -> CompiledModule:
    """Compile an nn.Module or a function of tensors. See README for the options and debug flags.
    Compiling a CompiledModule again compiles the model it wraps, with the new options."""
    if isinstance(model_or_fn, CompiledModule):
        model_or_fn = model_or_fn.model
    if not callable(model_or_fn):
        raise TypeError(f"minicomp.compile wants a module or function, got {type(model_or_fn).__name__}")
    options = Options.make(backend, debug, remat, cuda_graphs, strict, max_programs, recycle_outputs, remat_budget,
                           dynamic)
    return CompiledModule(model_or_fn, options)
