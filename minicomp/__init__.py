"""minicomp: a small deep-learning compiler. `minicomp.compile(model)` runs the model through our own
IR, fusion and code generators, and matches eager PyTorch. See README.md and DESIGN.md."""
from .api import CompiledModule, compile
from .errors import MinicompError, UnsupportedOpError
from .explain import Explanation, explain
from .report import Report

__version__ = "0.1.0"


def _register_dynamo_backend():
    from torch._dynamo import list_backends, register_backend
    from .compiler.capture import minicomp_backend
    if "minicomp" not in list_backends(exclude_tags=()):
        register_backend(name="minicomp")(minicomp_backend)


_register_dynamo_backend()

__all__ = ["compile", "explain", "CompiledModule", "Explanation", "MinicompError", "UnsupportedOpError", "Report",
           "__version__"]
