"""Data-parallel training with minicomp: DistributedDataParallel over gloo, one process per worker.

    torchrun --nproc_per_node 2 samples/ddp_train.py [--steps N] [--check]

Each process builds the same model (same seed), wraps it in DistributedDataParallel and compiles
the wrapped model with minicomp; DDP's hooks all-reduce the gradients the compiled backward
produces, exactly as they do for eager. `--check` also trains an eager DDP copy side by side and
fails (exit 1) when a gradient after the all-reduce, or the loss, differs from eager's.
"""
from __future__ import annotations

import argparse
import copy
import gc
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import minicomp


class MLP(nn.Module):
    def __init__(self, dim: int = 64):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):                               # x: (B, dim)
        return x + self.out(F.gelu(self.fc(self.ln(x))))


def train(args, rank: int, world: int) -> float:
    """Train `args.steps` steps; the largest difference from eager DDP (0.0 without --check)."""
    torch.manual_seed(0)
    model = MLP()
    eager = DDP(copy.deepcopy(model)) if args.check else None
    compiled = minicomp.compile(DDP(model), backend=args.backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1) if eager is not None else None
    gen = torch.Generator().manual_seed(1 + rank)  # each worker its own batches
    worst = 0.0
    for step in range(args.steps):
        x, target = torch.randn(16, 64, generator=gen), torch.randn(16, 64, generator=gen)
        loss = F.mse_loss(compiled(x), target)
        opt.zero_grad()
        loss.backward()  # gradients all-reduced by DDP across the workers
        if eager is not None:
            loss_e = F.mse_loss(eager(x), target)
            opt_e.zero_grad()
            loss_e.backward()
            for (name, a), b in zip(model.named_parameters(), eager.module.parameters()):
                err = (a.grad - b.grad).abs().max().item()
                worst = max(worst, err, abs(loss.item() - loss_e.item()))
                if err > 1e-5:
                    print(f"rank {rank} step {step}: gradient of {name} differs from eager DDP by {err:.2e}")
            opt_e.step()
        opt.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.5f}")
    if rank == 0:
        print(compiled.report())
        if eager is not None:
            print(f"{world} workers, {args.steps} steps: max difference from eager DDP {worst:.2e}")
    return worst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--check", action="store_true", help="compare with eager DDP after every step")
    p.add_argument("--backend", default="auto", help="minicomp backend")
    args = p.parse_args(argv)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)  # the workers share this machine's cores
    worst = train(args, dist.get_rank(), dist.get_world_size())
    # Tracing a DDP module (Dynamo's, under any backend) leaves reference cycles that hold it, and
    # through it the process group, until a garbage collection. Collect them now, so destroying the
    # group stops gloo's threads while Python is fully alive: left to the collection at interpreter
    # exit, a gloo thread that frees a tensor then aborts the process.
    gc.collect()
    dist.destroy_process_group()
    return 1 if worst > 1e-5 else 0


if __name__ == "__main__":
    sys.exit(main())
