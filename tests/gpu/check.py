"""The GPU check: one script, a few minutes on one GPU (python tests/gpu/check.py).

1. The model zoo on backend="cuda" against eager: forward and gradients, CUDA Graphs on and off.
2. The benchmark on the device: eager vs minicomp vs torch.compile, achieved bandwidth against a
   measured device-to-device copy.
3. Host time per call of a 100-kernel program, with and without CUDA Graph replay.
Prints one short table per part and exits non-zero if anything disagrees with eager.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import minicomp  # noqa: E402
from minicomp.bench import format_table, run_bench  # noqa: E402
from minicomp.bench_cases import make_case  # noqa: E402
from tests.e2e.models import ZOO  # noqa: E402
from tests.helpers import assert_matches_eager  # noqa: E402


def zoo() -> int:
    failures = 0
    print(f"{'model':24} {'graphs':>6} {'kernels':>7} {'cuda graphs':>11}  result")
    for name, make in ZOO.items():
        for graphs in (True, False):
            torch.manual_seed(0)
            model, inputs = make()
            model = model.cuda()
            inputs = tuple((x.cuda().requires_grad_(x.is_floating_point())) for x in inputs)
            try:
                c = assert_matches_eager(model, *inputs, backend="cuda", cuda_graphs=graphs, rtol=1e-4, atol=1e-4)
                r = c.report()
                print(f"{name:24} {len(r.graphs):6} {len(r.kernels):7} {str(graphs):>11}  ok")
            except Exception as e:  # report every model, then fail
                failures += 1
                print(f"{name:24} {'':6} {'':7} {str(graphs):>11}  FAILED: {type(e).__name__}: {str(e)[:200]}")
    return failures


def host_time_per_call() -> None:
    case = make_case("kernels100", device="cuda")
    print(f"\n{'kernels100 host time per call':32} {'us':>8}")
    with torch.no_grad():
        for graphs in (False, True):
            c = minicomp.compile(case.fn, backend="cuda", cuda_graphs=graphs)
            for _ in range(3):
                c(*case.inputs)
            torch.cuda.synchronize()
            n = 200
            t0 = time.perf_counter()
            for _ in range(n):
                c(*case.inputs)
            host = (time.perf_counter() - t0) / n  # launches are asynchronous: this is the host's share
            torch.cuda.synchronize()
            print(f"{'cuda graphs ' + ('on' if graphs else 'off'):32} {host * 1e6:8.1f}")


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: nothing to check")
        return 0
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures = zoo()
    rows = run_bench(backend="cuda", reps=10, device="cuda")
    print()
    print(format_table(rows))
    host_time_per_call()
    wrong = [r["case"] for r in rows if not r["ok"]]
    return 1 if failures or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
