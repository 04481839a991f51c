"""The exceptions minicomp raises to users."""


class MinicompError(RuntimeError):
    pass


class UnsupportedOpError(MinicompError):
    """An ATen op has no lowering and `strict=True` forbids running it through torch."""
