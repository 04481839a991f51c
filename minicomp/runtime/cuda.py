"""CUDA runtime: CUBIN loaded with pycuda into torch's primary context, launched with pycuda on one
stream that torch shares.

pycuda is imported lazily (`import pycuda.driver` fails at import time without libcuda). The stream
is created by pycuda and handed to torch as an ExternalStream: our kernels (pycuda prepared calls) and
torch's extern ops (cuBLAS/cuDNN matmuls and convolutions) then run in order on one stream, and a
CUDA Graph captured on it (cuda_graph.py) records both. Buffers are torch tensors from torch's
caching allocator, so inputs and outputs are ordinary torch CUDA tensors. A call is ordered after the
caller's work and the caller's later work after the call (`on_stream`): our stream is not the one
the caller's inputs were made on, nor the one its outputs will be read on.
"""
from __future__ import annotations

import atexit
import contextlib
import threading

import torch

_lock = threading.Lock()
_state: dict = {}


def driver():
    import pycuda.driver as drv  # lazily: it needs libcuda.so.1
    return drv


def context():
    """(pycuda stream, torch ExternalStream) on torch's current device, in its primary context."""
    with _lock:
        dev = torch.cuda.current_device()
        if dev not in _state:
            drv = driver()
            drv.init()
            torch.cuda.init()
            ctx = drv.Device(dev).retain_primary_context()  # the context torch already uses
            ctx.push()
            atexit.register(ctx.pop)  # pycuda aborts the process at exit if a pushed context is left
            stream = drv.Stream()
            _state[dev] = (ctx, stream, torch.cuda.ExternalStream(stream.handle, device=dev))
        return _state[dev]


@contextlib.contextmanager
def on_stream(stream: torch.cuda.Stream):
    """Run the body on `stream`, after everything queued on the caller's current stream, and make the
    caller's stream wait for the body's work (events on the device; the host does not block)."""
    caller = torch.cuda.current_stream()
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        caller.wait_stream(stream)


def arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


class CudaModule:
    """A CUBIN (or PTX) image and its kernels."""

    def __init__(self, image: bytes, names: list):
        context()
        self.module = driver().module_from_buffer(image)
        self.functions = {n: self.module.get_function(n) for n in names}


class CudaLaunch:
    """One kernel launch, prepared once: argument types fixed, grid/block/shared memory decided."""

    def __init__(self, module: CudaModule, name: str, grid: int, block: int, shared_bytes: int, slots: list):
        self.fn = module.functions[name]
        self.fn.prepare("P" * len(slots))
        self.grid, self.block, self.shared, self.slots, self.name = (grid, 1), (block, 1, 1), shared_bytes, slots, name
        self.stream = context()[1]

    def __call__(self, env: list) -> None:
        self.fn.prepared_async_call(self.grid, self.block, self.stream, *[env[s].data_ptr() for s in self.slots],
                                    shared_size=self.shared)
