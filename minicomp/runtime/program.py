"""A compiled program: the steps every backend runs, over one flat list of values (the env).

env layout: [inputs..., constants..., one slot per step result]. Steps are prepared at compile time
-- kernel launches (runtime/cpu.py, cuda.py, cuda_emu.py) and torch calls (externs, matmuls, views)
-- so a call does no Python work beyond filling pointer arrays and looping over the steps.
Intermediates kernels write live in one arena (planned by compiler/passes/plan_memory.py); graph
outputs are fresh tensors each call.
"""
from __future__ import annotations

import torch


class TorchCall:
    """A step that runs in torch: fn(*env[args]) -> env[out]; results kernels read are made contiguous."""

    def __init__(self, fn, args: list, out: int, contiguous: bool):
        self.fn, self.args, self.out, self.contiguous = fn, args, out, contiguous

    def __call__(self, env: list) -> None:
        r = self.fn(*[env[a] for a in self.args])
        if self.contiguous and isinstance(r, torch.Tensor) and not r.is_contiguous():
            r = r.contiguous()
        env[self.out] = r


class Program:
    """`buffers` lists the slots kernels write: (slot, shape, dtype, arena offset, or None for a fresh
    output each call). `keepalive` holds what the steps' code lives in (a JIT engine, a module)."""

    def __init__(self, n_inputs: int, constants: list, steps: list, buffers: list, outputs: list,
                 arena_bytes: int, n_slots: int, device="cpu", may_alias=()):
        self.n_inputs, self.steps, self.outputs = n_inputs, steps, outputs
        self.may_alias = tuple(may_alias)  # output positions a torch op made: they may view the arena
        self.constants, self.buffers, self.arena_bytes, self.device = constants, buffers, arena_bytes, device
        self.n_slots = n_slots
        self.template = None  # built on the first call: compilation may run under a fake-tensor mode

    def _setup(self) -> None:
        template = [None] * self.n_slots
        for i, c in enumerate(self.constants):
            template[self.n_inputs + i] = c.contiguous()
        arena = torch.empty(self.arena_bytes, dtype=torch.uint8, device=self.device) if self.arena_bytes else None
        self.fresh = []
        for slot, shape, dtype, offset in self.buffers:
            if offset is None:
                self.fresh.append((slot, shape, dtype))
            else:
                numel = torch.Size(shape).numel()
                nbytes = max(1, numel) * dtype.itemsize
                template[slot] = arena[offset:offset + nbytes].view(dtype)[:numel].view(shape)
        self.arena = arena
        self.arena_range = (arena.data_ptr(), arena.data_ptr() + self.arena_bytes) if arena is not None else None
        self.template = template

    def __call__(self, *inputs):
        if self.template is None:
            self._setup()
        env = list(self.template)
        for i, x in enumerate(inputs):
            env[i] = x if x.is_contiguous() else x.contiguous()
        for slot, shape, dtype in self.fresh:
            env[slot] = torch.empty(shape, dtype=dtype, device=self.device)
        for step in self.steps:
            step(env)
        outs = [None if o is None else env[o] for o in self.outputs]
        if self.arena_range is not None:  # never hand out memory the next call overwrites
            lo, hi = self.arena_range
            for i in self.may_alias:
                if lo <= outs[i].data_ptr() < hi:
                    outs[i] = outs[i].clone()
        return outs
