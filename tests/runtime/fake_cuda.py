"""Stand-ins for pycuda.driver and the torch.cuda calls of runtime/cuda.py and cuda_graph.py, so
their logic runs without a GPU (programs run on `meta` tensors, or on cuda_emu's CPU tensors).

FakeDriver keeps pycuda's context semantics: one context stack per thread (pycuda's own,
thread-local); module_from_buffer and Stream need a current context on the calling thread and
raise pycuda's "no currently active context" without one; a launch needs its module's context
current (the driver's cuLaunchKernel rule); Context.pop on an empty stack raises; a module dropped
outside its context is recorded (pycuda warns and leaks it). FakeCuda records streams, stream
switches and captures; its CUDAGraph records the launches made while capturing -- as stream capture
does -- and replays them, or, for a RecordingProgram (a cuda_emu Program), reruns the program on
the captured arguments and writes the results into the captured outputs, the way a real replay
writes the addresses it was captured with.
"""
from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import types

import torch


class LogicError(RuntimeError):
    pass


class FakeDriver(types.ModuleType):
    def __init__(self, driver_version: int = 13000):
        super().__init__("pycuda.driver")
        self.driver_version = driver_version
        self.tls = threading.local()
        self.events = []  # (what, thread name, detail)
        self.launches = []  # (kernel name, pointer args, thread name)
        self.capture = None  # the FakeGraph a launch is recorded into (set by FakeCuda.graph)
        self.unloads = self.bad_unloads = 0
        self.inits = 0
        drv = self

        class Context:
            _ids = itertools.count()

            def __init__(self, device):
                self.device, self.id = device, next(Context._ids)

            def push(self):
                drv.stack().append(self)
                drv.events.append(("push", threading.current_thread().name, self.id))

            @staticmethod
            def pop():
                if not drv.stack():
                    raise LogicError("context::pop failed: invalid device context - cannot pop non-current context")
                c = drv.stack().pop()
                drv.events.append(("pop", threading.current_thread().name, c.id))

            @staticmethod
            def get_current():
                s = drv.stack()
                return s[-1] if s else None

        class Device:
            primaries: dict = {}

            def __init__(self, index):
                self.index = index

            def retain_primary_context(self):
                return Device.primaries.setdefault(self.index, Context(self.index))

        self.Context, self.Device = Context, Device

    # pycuda.driver's functions
    def stack(self) -> list:
        if not hasattr(self.tls, "stack"):
            self.tls.stack = []
        return self.tls.stack

    def depth(self) -> int:
        return len(self.stack())

    def current(self, what: str):
        c = self.Context.get_current()
        if c is None:
            raise LogicError(f"{what} failed: explicit_context_dependent failed: invalid device context - "
                             "no currently active context?")
        return c

    def init(self):
        self.inits += 1

    def get_driver_version(self):
        return self.driver_version

    def Stream(self, flags=0):
        ctx = self.current("cuStreamCreate")
        self.events.append(("stream", threading.current_thread().name, flags))
        return types.SimpleNamespace(handle=1000 + ctx.id, flags=flags, context=ctx)

    def module_from_buffer(self, image: bytes):
        ctx = self.current("cuModuleLoadDataEx")
        assert isinstance(image, bytes) and image, "an empty image"
        self.events.append(("load", threading.current_thread().name, ctx.id))
        return FakeModule(self, ctx)


class FakeModule:
    def __init__(self, drv, ctx):
        self.drv, self.ctx = drv, ctx

    def get_function(self, name):
        return FakeFunction(self, name)

    def __del__(self):
        self.drv.unloads += 1
        if self.drv.Context.get_current() is not self.ctx:
            self.drv.bad_unloads += 1


class FakeFunction:
    def __init__(self, module, name):
        self.module, self.name, self.arg_format = module, name, None

    def prepare(self, fmt):
        self.arg_format = fmt

    def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
        drv = self.module.drv
        if drv.Context.get_current() is not self.module.ctx:
            raise LogicError(f"cuLaunchKernel failed: invalid device context ({self.name})")
        assert len(args) == len(self.arg_format) and all(isinstance(a, int) for a in args)
        if drv.capture is not None:  # recorded by name: a graph holds no pycuda objects
            drv.capture.launches.append((self.name, args))
        else:
            drv.launches.append((self.name, args, threading.current_thread().name))


class FakeStream:
    def __init__(self, name, device=None):
        self.name, self.device, self.waits = name, device, []

    def wait_stream(self, other):
        self.waits.append(other.name)


class FakeGraph:
    def __init__(self, cuda):
        self.cuda, self.launches, self.calls, self.replays = cuda, [], [], 0

    def replay(self):
        self.replays += 1
        drv = self.cuda.drv
        drv.current("cudaGraphLaunch")
        for name, args in self.launches:
            drv.launches.append((name, args, threading.current_thread().name))
        for program, args, outs in self.calls:
            for static, new in zip(outs, program.program(*args)):
                if static is not None:
                    static.copy_(new)


class FakeCuda:
    """The torch.cuda calls the runtime makes (put in minicomp.runtime.cuda.tc)."""

    def __init__(self, drv: FakeDriver, capability=(9, 0)):
        self.drv, self.capability = drv, capability
        self.device = 0
        self.streams = {}
        self.current = {}
        self.default = {}
        self.captures = []  # (stream name, capture_error_mode, thread name)
        self.capturing = None

    def init(self):
        pass

    def current_device(self):
        return self.device

    def get_device_capability(self, index=None):
        return self.capability

    def ExternalStream(self, handle, device=None):
        return self.streams.setdefault(handle, FakeStream(f"external {handle}", device))

    def current_stream(self, index=None):
        return self.current.get(threading.get_ident()) or self.default.setdefault(index, FakeStream(f"default {index}"))

    @contextlib.contextmanager
    def stream(self, s):
        key = threading.get_ident()
        before = self.current.get(key)
        self.current[key] = s
        try:
            yield
        finally:
            self.current[key] = before

    def CUDAGraph(self):
        return FakeGraph(self)

    @contextlib.contextmanager
    def graph(self, g, stream=None, capture_error_mode="global"):
        assert self.capturing is None, "a capture inside a capture"
        self.captures.append((stream.name, capture_error_mode, threading.current_thread().name))
        self.capturing = self.drv.capture = g
        try:
            with self.stream(stream):
                yield
        finally:
            self.capturing = self.drv.capture = None


class RecordingProgram:
    """A Program whose calls under a FakeCuda capture are recorded into the graph (a real capture
    records the kernels instead). Capture runs no work: the captured outputs come back as NaN (or
    -1) until a replay fills them, so a call that forgets to replay is seen."""

    def __init__(self, program, cuda: FakeCuda):
        self.program, self.cuda = program, cuda
        self.calls = 0
        self.device = program.device

    def __call__(self, *args):
        self.calls += 1
        out = self.program(*args)
        g = self.cuda.capturing
        if g is not None:
            for o in out:
                if o is not None:
                    o.fill_(float("nan") if o.is_floating_point() else -1)
            g.calls.append((self, args, out))
        return out

    def release(self, keep_code=False):
        self.program.release(keep_code)


def install(monkeypatch, driver_version: int = 13000, capability=(9, 0)):
    """Put a FakeDriver in place of pycuda.driver and a FakeCuda in place of runtime/cuda.py's
    torch.cuda, with no device state left from an earlier test. Returns (driver, cuda)."""
    from minicomp.runtime import cuda
    drv = FakeDriver(driver_version)
    fake = FakeCuda(drv, capability)
    pkg = types.ModuleType("pycuda")
    pkg.driver = drv
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)
    monkeypatch.setattr(cuda, "tc", fake)
    monkeypatch.setattr(cuda, "_devices", {})
    return drv, fake


def run_in_thread(fn, *args, name="worker"):
    """fn(*args) on a new thread (as autograd's device thread runs a backward); its result, or its
    exception raised here."""
    box = {}

    def body():
        try:
            box["out"] = fn(*args)
        except BaseException as e:  # handed to the caller
            box["err"] = e
    t = threading.Thread(target=body, name=name)
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box.get("out")


def meta(*xs):
    return tuple(x.to("meta") if isinstance(x, torch.Tensor) else x for x in xs)
