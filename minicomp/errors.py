"""The exceptions minicomp raises to users."""


class MinicompError(RuntimeError):
    pass


class UnsupportedOpError(MinicompError):
    """An ATen op has no lowering and `strict=True` forbids running it through torch."""


class KernelIndexError(IndexError, MinicompError):
    """A compiled gather read an index out of range. Eager raises IndexError (index_select, embedding)
    or RuntimeError (gather): this is both."""


class KernelZeroDivisionError(ZeroDivisionError, MinicompError):
    """A compiled integer division met a zero divisor; eager raises RuntimeError("ZeroDivisionError")."""
