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


class SizesOutsideProgram(MinicompError):
    """A call's sizes break a guard the compile assumed that Dynamo does not check: it takes sizes as
    at least 2 when it reasons about them (size-obliviously), so `s0 > 0` is no guard of its. Raised
    before anything runs; the caller runs that call some other way (capture.py: the graph in torch)."""

    def __init__(self, values: dict, failed: list):
        super().__init__(f"minicomp: sizes {values} break what this program was compiled for: {'; '.join(failed)}")
        self.values, self.failed = values, failed
