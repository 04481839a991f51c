"""`minicomp.compile`: a callable with the model's signature that compiles lazily per input signature.

Why not just `torch.compile(model, backend=...)`? Dynamo keys its cache on the Python code object,
so many closures of one function (or many instances of one module class) share one recompile
limit, and past it Dynamo quietly runs eager. Each CompiledModule instead keeps its own table of
programs, one per input signature (shapes, dtypes, devices, requires_grad, grad mode), each traced
through a fresh copy of a small trampoline's code object, so its Dynamo cache is its own.
"""
from __future__ import annotations

import logging
import types

import torch
import torch.utils._pytree as pytree
from torch._dynamo.exc import BackendCompilerFailed
from torch._dynamo.utils import counters

from .compiler.capture import make_backend
from .errors import MinicompError
from .options import Options
from .report import Report

log = logging.getLogger("minicomp")


def _trampoline(target):
    def run(*args, **kwargs):
        return target(*args, **kwargs)
    code = run.__code__.replace()  # a new code object: a Dynamo cache of its own
    return types.FunctionType(code, run.__globals__, run.__name__, run.__defaults__, run.__closure__)


def _signature(args, kwargs):
    leaves, spec = pytree.tree_flatten((args, kwargs))
    key = [torch.is_grad_enabled(), str(spec)]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            key.append((tuple(x.shape), x.dtype, x.device, x.requires_grad, x.stride()))
        else:
            key.append(type(x))
    return tuple(key)


class CompiledModule:
    def __init__(self, model, options: Options):
        self.model = model
        self.options = options
        self._report = Report()
        self._programs: dict = {}
        self._warned_limit = False
        self.__wrapped__ = model
        self.__doc__ = getattr(model, "__doc__", None)

    def __call__(self, *args, **kwargs):
        key = _signature(args, kwargs)
        program = self._programs.get(key)
        if program is None:
            if len(self._programs) >= self.options.max_programs:
                if not self._warned_limit:
                    self._warned_limit = True
                    msg = (f"{len(self._programs)} input signatures compiled (max_programs="
                           f"{self.options.max_programs}); new signatures run eagerly")
                    log.warning("minicomp: %s", msg)
                    self._report.eager.append(msg)
                return self.model(*args, **kwargs)
            return self._compile_and_run(key, args, kwargs)
        return program(*args, **kwargs)

    def _compile_and_run(self, key, args, kwargs):
        backend = make_backend(self.options, self._report)
        program = torch.compile(_trampoline(self.model), backend=backend, dynamic=False)
        before = dict(counters["graph_break"])
        try:
            out = program(*args, **kwargs)
        except BackendCompilerFailed as e:
            inner = getattr(e, "inner_exception", None)
            if isinstance(inner, MinicompError):
                raise inner from None
            raise
        breaks = {k: v - before.get(k, 0) for k, v in counters["graph_break"].items() if v > before.get(k, 0)}
        for reason in breaks:
            msg = f"graph break (code between graphs runs eagerly): {reason}"
            log.warning("minicomp: %s", msg)
            self._report.eager.append(msg)
        self._programs[key] = program
        return out

    def report(self) -> Report:
        return self._report

    def __getattr__(self, name):
        # forward attribute reads (e.g. model.config) to the wrapped model
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)


def compile(model_or_fn, *, backend: str = "auto", debug=False, remat: bool = True, cuda_graphs: bool = True,
            strict: bool = False, max_programs: int = 8) -> CompiledModule:
    """Compile an nn.Module or a function of tensors. See README for the options and debug flags."""
    if not callable(model_or_fn):
        raise TypeError(f"minicomp.compile wants a module or function, got {type(model_or_fn).__name__}")
    options = Options.make(backend, debug, remat, cuda_graphs, strict, max_programs)
    return CompiledModule(model_or_fn, options)
