"""CUDA runtime: CUBIN loaded with pycuda into torch's primary context, launched with pycuda on one
stream that torch shares.

pycuda is imported lazily (`import pycuda.driver` fails at import time without libcuda). The stream
is created by pycuda and handed to torch as an ExternalStream: our kernels (pycuda prepared calls) and
torch's extern ops (cuBLAS/cuDNN matmuls and convolutions) then run in order on one stream, and a
CUDA Graph captured on it (cuda_graph.py) records both. It is a non-blocking stream: work another
thread queues on the legacy default stream (a DataLoader's copies) neither waits for ours nor
joins a capture. A call is ordered after the caller's work and the caller's later work after the
call (`on_stream`): our stream is not the one the caller's inputs were made on.

Contexts are per thread. pycuda keeps a context stack per thread and refuses to load a module or
make a stream on a thread whose stack is empty -- and AOTAutograd compiles the backward at the
first backward(), on autograd's device thread, not the thread that compiled the forward. So every
entry point (module load, a program's call, hence capture and replay) runs in `Device.active()`:
the device's primary context (the one torch uses) is pushed when it is not this thread's current
one, and popped after. A program runs on its inputs' device, not the current one (`CudaRunner`).
"""
from __future__ import annotations

import contextlib
import threading
import time

import torch

tc = torch.cuda  # what the runtime calls of torch.cuda; tests put a stand-in here
_lock = threading.Lock()
_devices: dict = {}
NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING (pycuda has no name for it)


def driver():
    import pycuda.driver as drv  # lazily: it needs libcuda.so.1
    return drv


class Device:
    """One GPU: its primary context, retained once; our stream on it; its architecture and the
    driver's CUDA version (nvrtc.target decides CUBIN or PTX from both)."""

    def __init__(self, index: int):
        self.drv = drv = driver()
        drv.init()
        tc.init()
        self.index = index
        self.context = drv.Device(index).retain_primary_context()
        self.arch = "sm_%d%d" % tuple(tc.get_device_capability(index))
        self.driver_version = drv.get_driver_version()  # e.g. 12040 for CUDA 12.4
        with self.active():
            self.stream = drv.Stream(NON_BLOCKING)
        self.torch_stream = tc.ExternalStream(self.stream.handle, device=torch.device("cuda", index))

    @contextlib.contextmanager
    def active(self):
        current = self.drv.Context.get_current()  # pycuda's stack on this thread: None when empty
        pushed = current is None or current != self.context
        if pushed:
            self.context.push()
        try:
            yield self
        finally:
            if pushed:
                self.drv.Context.pop()


def device(index: int) -> Device:
    with _lock:
        if index not in _devices:
            _devices[index] = Device(index)
        return _devices[index]


def input_device(inputs) -> torch.device:
    """The device a program runs on: its first tensor input's (a CUDA program's inputs are all on one
    device, bar CPU scalars); the current CUDA device when it has no tensor input."""
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return x.device
    return torch.device("cuda", tc.current_device())


@contextlib.contextmanager
def on_stream(dev: Device):
    """Run the body on our stream, after everything queued on the caller's current stream of that
    device, and make the caller's stream wait for the body's work (events; the host does not block)."""
    caller, ours = tc.current_stream(dev.index), dev.torch_stream
    ours.wait_stream(caller)
    try:
        with tc.stream(ours):
            yield
    finally:
        caller.wait_stream(ours)


class CudaModule:
    """A CUBIN (or PTX) image and its kernels, in one device's context. Unloaded in that context
    too, whichever thread drops the last reference (pycuda would warn and leak otherwise)."""

    def __init__(self, dev: Device, image: bytes, names: list):
        self.device = dev
        with dev.active():
            self.module = dev.drv.module_from_buffer(image)
            self.functions = {n: self.module.get_function(n) for n in names}

    def __del__(self):
        try:
            with self.device.active():
                self.functions = self.module = None
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass


class CudaLaunch:
    """One kernel launch, prepared once: argument types fixed, grid/block/shared memory decided.
    It reaches its function through the module, so that only the module holds pycuda objects.
    `sizes`: a kernel over symbolic sizes takes their values after its buffers (`long long` each)."""

    def __init__(self, module: CudaModule, name: str, grid: int, block: int, shared_bytes: int, slots: list,
                 sizes=()):
        self.module, self.name, self.slots, self.sizes = module, name, slots, tuple(sizes)
        module.functions[name].prepare("P" * len(slots) + "q" * len(self.sizes))
        self.grid, self.block, self.shared = (grid, 1), (block, 1, 1), shared_bytes
        self.stream = module.device.stream

    def emit(self, k: int, v, ns: dict) -> list:
        """The generated call's line for this launch (runtime/program.py)."""
        ns[f"L{k}"] = self
        return [f"L{k}.launch({''.join(f'{v(s)}.data_ptr(), ' for s in self.slots)})"]

    def launch(self, *pointers) -> None:
        self.module.functions[self.name].prepared_async_call(self.grid, self.block, self.stream, *pointers,
                                                             *self.sizes, shared_size=self.shared)


class CudaRunner:
    """A CUDA program's callable. Its first call binds it to its inputs' device: `bind(torch
    device, Device, inputs)` compiles and loads the kernels there and returns the Program; every
    call then runs in that device's context, on its stream, replayed as a CUDA Graph when `graphs`."""

    def __init__(self, bind, detail: dict, graphs: bool, arena_bytes: int):
        self.bind, self.detail, self.graphs, self.arena_bytes = bind, detail, graphs, arena_bytes
        self.device = self.run = self.program = None
        self._lock = threading.Lock()

    def _first(self, inputs) -> None:
        from .cuda_graph import GraphReplay
        with self._lock:
            if self.device is not None:
                return
            where = input_device(inputs)
            dev = device(where.index if where.type == "cuda" and where.index is not None else tc.current_device())
            t0 = time.perf_counter()
            with dev.active():
                self.program = self.bind(where, dev, inputs)
            self.detail["load_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
            self.run = GraphReplay(self.program, dev.torch_stream, self.detail, api=tc) if self.graphs else self.program
            self.device = dev  # last: a call on another thread takes a set device as a bound runner

    def __call__(self, *inputs):
        if self.device is None:
            if self.run is _released:
                _released()
            self._first(inputs)
        dev = self.device
        with dev.active(), on_stream(dev):
            return self.run(*inputs)

    def release(self, keep_code: bool = False) -> None:
        """Free the arena, the captured graph and the kernels; a later call is an error. With
        `keep_code`, the arena and the captured graph only (Program.release)."""
        release = getattr(self.run, "release", None)  # a GraphReplay releases its graph and the program
        if release is not None:
            release(keep_code)
        if not keep_code:
            self.run, self.program = _released, None


def _released(*inputs):
    raise RuntimeError("minicomp: this program was released with the compiled callable that owned it")
