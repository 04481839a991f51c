"""Replay a whole CUDA program as one CUDA Graph.

pycuda has no graph API, so capture goes through `torch.cuda.CUDAGraph` on the stream our pycuda
launches and torch's extern ops share (cuda.py): stream capture records every kernel on it, whoever
launched it. The first call runs eagerly (a warm-up: lazy cuBLAS handles and workspaces must exist
before capture); the second captures -- in thread-local error mode, so a CUDA call another thread
makes meanwhile (a DataLoader pinning memory) neither fails nor invalidates it -- and replays;
later calls replay. A capture records no work: every call, the capturing one too, ends in a replay.

A graph reads the addresses it was captured with. An input at the same address in the warm-up and
the capture call (parameters, buffers, activations autograd hands back from a recycled block, a
caller's static tensors) is read in place: the graph then reads whatever tensor is at that address
at the call, and the address is checked every call. When it moves the graph is captured again --
reading the new tensor in place the first time, copying it into a static buffer from the second
move on (an input that moves every call). A CPU scalar a torch op reads, or any non-tensor input,
is frozen into the graph: a new value means a new capture. The others are copied into static
buffers each call, and outputs are cloned (the next replay overwrites the static ones); `detail["replay_bytes"]` counts
those copies and clones per call, and `report()` shows it.
"""
from __future__ import annotations

import threading

import torch

MOVES_IN_PLACE = 1  # address changes an in-place input may have before it is copied instead


def _key(x, device_type: str):
    """What a graph depends on in an input: a device tensor's address; a host tensor's values (a CPU
    scalar a torch op reads becomes a kernel argument, frozen into the graph); any other value itself."""
    if isinstance(x, torch.Tensor):
        return x.data_ptr() if x.device.type == device_type else ("host", x.tolist())
    return ("value", x)


def _nbytes(x) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


class GraphReplay:
    """`api`: what provides CUDAGraph and graph() (torch.cuda; tests pass a stand-in)."""

    def __init__(self, program, stream, detail: dict | None = None, api=None):
        self.program, self.stream, self.api = program, stream, api
        self.detail = detail if detail is not None else {}
        self.device_type = torch.device(getattr(program, "device", "cuda")).type
        self.graph = None
        self.calls = self.captures = 0
        self.warm: list = []
        self.lock = threading.Lock()

    def _capture(self, inputs) -> None:
        api = self.api or torch.cuda
        self.keys = [_key(x, self.device_type) for x in inputs]
        self.buffers = {i: torch.empty_like(x) for i, x in enumerate(inputs) if self.copied[i]}
        args = [self.buffers.get(i, x) for i, x in enumerate(inputs)]
        self.graph = None
        graph = api.CUDAGraph()
        with api.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
            out = self.program(*args)
        self.graph, self.static_out, self.captures = graph, out, self.captures + 1
        self.detail.update(replay_bytes=sum(_nbytes(b) for b in self.buffers.values()) + sum(map(_nbytes, out)),
                           replay_copies=len(self.buffers), captures=self.captures)

    def _copyable(self, x) -> bool:
        return isinstance(x, torch.Tensor) and x.device.type == self.device_type

    def __call__(self, *inputs):
        with self.lock:
            self.calls += 1
            if self.calls == 1:  # warm-up
                self.warm = [_key(x, self.device_type) for x in inputs]
                return self.program(*inputs)
            if self.graph is None:
                self.copied = [self._copyable(x) and _key(x, self.device_type) != w for x, w in zip(inputs, self.warm)]
                self.moves = [0] * len(inputs)
                self._capture(inputs)
            else:
                moved = [i for i, x in enumerate(inputs) if not self.copied[i] and _key(x, self.device_type) != self.keys[i]]
                if moved:
                    for i in moved:  # a value that changes is captured again every time: it cannot be copied in
                        self.moves[i] += 1
                        self.copied[i] = self._copyable(inputs[i]) and self.moves[i] > MOVES_IN_PLACE
                    self._capture(inputs)
            for i, buf in self.buffers.items():
                buf.copy_(inputs[i], non_blocking=True)
            self.graph.replay()
            return [None if o is None else o.clone() for o in self.static_out]

    def release(self, keep_code: bool = False) -> None:
        """The captured graph and its buffers, and the program's memory (Program.release); with
        `keep_code` the next call warms up and captures again."""
        with self.lock:
            self.graph = self.static_out = self.buffers = None
            if keep_code:
                self.calls = 0
        self.program.release(keep_code)
