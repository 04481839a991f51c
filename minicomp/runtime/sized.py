"""A program over symbolic sizes: one compile, run at every size, with an instance per call size.

The kernels are compiled once, over symbolic extents (codegen reads the sizes at run time). What
does depend on the size -- output and arena shapes, the arena's layout, views' strides, each
kernel's thread split -- is laid out per size: a call binds the symbols from its inputs' shapes
and runs the Program instance for those sizes, made the first time they arrive (a concrete copy of
the graph planned and assembled as a static program is, over the same machine code: a few
milliseconds, no code generation) and kept: the most recently used MAX_INSTANCES of them, fewer when
their arenas together pass ARENA_BUDGET (a language model's 512 lengths must not hold 512 arenas).
"""
from __future__ import annotations

import collections
import threading

from ..errors import SizesOutsideProgram


class SizedProgram:
    """`where`: for each symbol, (input position, dimension) it is read from; `make(values)`: the
    Program for sizes `values` (symbol name -> int); `guards`: what the compile assumed of the sizes
    (ir/sym.py Guard objects, a list it may still append to). Dynamo checks them before each call;
    an instance checks them again when its size first arrives (a backward compiled lazily, after
    Dynamo installed its guards, could otherwise run at a size its compile ruled out). `wrap(program)`:
    what runs an instance (cuda: a CUDA Graph replay of it), the program itself when None."""

    MAX_INSTANCES = 64
    ARENA_BUDGET = 256 << 20  # bytes of arena the kept instances may hold together (at least one is kept)

    def __init__(self, where: dict, make, keepalive=None, guards=(), given=(), wrap=None):
        """`given`: the symbols a call passes as ints (`sizes=`, in this order) instead of as a dimension."""
        self.given = list(given)
        self.where = list(where.values())
        self.names = list(where) + self.given
        self.make, self.wrap = make, wrap
        self.guards = guards
        self.keepalive = keepalive  # the machine code every instance runs
        self.instances: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()  # (program, its run)
        self.built = 0  # instances made (a new size each)
        self._lock = threading.Lock()
        self._released = False
        self.last = None

    def instance(self, inputs, sizes=()):
        """(Program, what runs it) for the sizes of `inputs` (and the `sizes` given as ints)."""
        key = tuple(inputs[i].shape[d] for i, d in self.where) + tuple(sizes)
        hit = self.instances.get(key)
        if hit is not None and self.last is not hit[0]:
            try:
                self.instances.move_to_end(key)
            except KeyError:  # dropped meanwhile by another thread's new size
                pass
        if hit is None:
            with self._lock:
                hit = self.instances.get(key)
                if hit is None:
                    if self._released:
                        raise RuntimeError("minicomp: this program was released with the compiled callable that owned it")
                    values = dict(zip(self.names, key))
                    failed = [str(g) for g in self.guards if not g.check(values)]
                    if failed:
                        raise SizesOutsideProgram(values, failed)
                    prog = self.make(values)
                    hit = self.instances[key] = (prog, prog if self.wrap is None else self.wrap(prog))
                    self.built += 1
                    held = sum(getattr(p, "arena_bytes", 0) for p, _ in self.instances.values())
                    while len(self.instances) > 1 and (len(self.instances) > self.MAX_INSTANCES
                                                       or held > self.ARENA_BUDGET):
                        old_prog, old_run = self.instances.popitem(last=False)[1]
                        held -= getattr(old_prog, "arena_bytes", 0)
                        old_run.release()
        self.last = hit[0]
        return hit

    def __call__(self, *inputs, sizes=()):
        prog, run = self.instance(inputs, sizes)
        try:
            return run(*inputs)
        except RuntimeError:
            if not prog._released or self._released:
                raise
            return self.instance(inputs, sizes)[1](*inputs)  # another thread's new size evicted it just now

    def release(self, keep_code: bool = False) -> None:
        """Every instance and the machine code; with `keep_code` the instances only (a later call
        makes its size's instance again from the code kept)."""
        with self._lock:
            self._released = self._released or not keep_code
            for _, run in self.instances.values():
                run.release()
            self.instances.clear()
            self.last = None
            if not keep_code:
                self.keepalive = None

    def __getattr__(self, name):
        # what tools read of a Program (primary(), steps, source) is the last instance's
        last = self.__dict__.get("last")
        if last is None:
            raise AttributeError(name)
        return getattr(last, name)
