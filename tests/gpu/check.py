"""The GPU check: one script, at most five minutes on one GPU from a bare machine with no network.

    python tests/gpu/fetch_pycuda.py                 # once, on a machine with network access: pycuda's files in .gpu_wheels/
    python tests/gpu/check.py --quick                # on the GPU machine (carry .gpu_wheels/ there)
    python tests/gpu/check.py --backend cuda_emu --quick   # anywhere: the same logic on the emulator (CI)

1. pycuda: installed from .gpu_wheels/ when `import pycuda.driver` fails (fetch_pycuda.py --install).
2. The model zoo against eager, forward and gradients, CUDA Graphs on and off, three calls each on
   new values: the first runs eagerly, the second captures, the third is a replay -- every call is
   compared, so a wrong replay fails here, not only a wrong first call.
3. The benchmark cases on the device, in one table: device time per call against eager, achieved
   bandwidth against a measured device-to-device copy, host time per call with and without CUDA
   Graph replay, the bytes replay copies per call, and the max error of the third call against eager (WRONG
   past 1e-4 relative).
Exits non-zero if anything disagrees with eager or fails.
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import minicomp  # noqa: E402
from minicomp.bench import _max_err, _nbytes, _state, _tensors  # noqa: E402
from minicomp.bench_cases import CASE_NAMES, make_case  # noqa: E402
from minicomp.timing import grid, time_interleaved  # noqa: E402
from tests.e2e.models import ZOO  # noqa: E402
from tests.helpers import assert_matches_eager  # noqa: E402

EMU_MAX_ELEMS = 1 << 14  # cuda_emu: inputs cut to this many elements (emulated kernels are slow)
TOLERANCE = 1e-4


def ensure_pycuda() -> str:
    try:
        import pycuda.driver  # noqa: F401
    except ImportError as e:
        print(f"pycuda: not importable ({e}); installing it from .gpu_wheels/", flush=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpu", "fetch_pycuda.py"), "--install"],
                       check=True)
        importlib.invalidate_caches()
    import pycuda
    import pycuda.driver as drv
    return f"pycuda {pycuda.VERSION_TEXT}, driver CUDA {drv.get_driver_version()}"


def versions(backend: str) -> str:
    from minicomp.runtime import nvrtc
    parts = [f"torch {torch.__version__}"]
    try:
        parts.append(f"NVRTC {nvrtc.version()}, headers {nvrtc.include_dirs()[0]}")
    except Exception as e:  # cuda_emu needs no NVRTC
        parts.append(f"NVRTC: {type(e).__name__}: {e}")
    if backend == "cuda":
        parts.insert(0, torch.cuda.get_device_name())
        parts.append(ensure_pycuda())
    return ", ".join(parts)


def zoo(backend: str, device: str) -> int:
    failures, rows = 0, []
    for name, make in ZOO.items():
        for graphs in ((True, False) if backend == "cuda" else (True,)):
            torch.manual_seed(0)
            model, inputs = make()
            model = model.to(device)
            inputs = tuple(x.to(device).requires_grad_(x.is_floating_point()) for x in inputs)
            row = {"model": name, "graphs": graphs if backend == "cuda" else "-"}
            t0 = time.perf_counter()
            try:
                c = assert_matches_eager(model, *inputs, backend=backend, cuda_graphs=graphs, calls=3,
                                         rtol=1e-4, atol=1e-4)
                r = c.report()
                row.update(kernels=len(r.kernels), replay=r.replay_bytes, result="ok")
            except Exception as e:  # report every model, then fail
                failures += 1
                row["result"] = f"FAILED: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
            row["s"], row["ok"] = time.perf_counter() - t0, row["result"] == "ok"
            rows.append(row)
            print(f"zoo: {name} graphs={graphs}: {row['result'][:80]} ({row['s']:.1f} s)", file=sys.stderr, flush=True)
    print("\n".join(grid(rows, [("model", "model", "{}"), ("cuda graphs", "graphs", "{}"),
                                ("kernels", "kernels", "{}"), ("replay B/call", "replay", "{:,}"),
                                ("s", "s", "{:.1f}"), ("3 calls vs eager", "result", "{}")])))
    return failures


def shrink(case):
    """cuda_emu: the case with its big inputs cut along dim 0 (every bench case maps rows independently)."""
    def cut(x):
        if not isinstance(x, torch.Tensor) or x.numel() <= EMU_MAX_ELEMS:
            return x
        return x[:max(1, EMU_MAX_ELEMS * x.shape[0] // x.numel())].contiguous()
    case.inputs = tuple(cut(x) for x in case.inputs)
    case.shape = "x".join(map(str, case.inputs[0].shape))
    return case


def host_us(fn, inputs, sync, n: int) -> float:
    """Host time per call: calls queued back to back, no wait between (launches are asynchronous)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*inputs)
    host = (time.perf_counter() - t0) / n
    sync()
    return host * 1e6


def bench(backend: str, device: str, quick: bool) -> int:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    reps, calls = (5, 20) if quick else (30, 200)
    names = [*CASE_NAMES, "kernels100"]
    if backend == "cuda_emu":  # the script's logic, not speed: emulated kernels run one CUDA thread at a time
        reps, calls, names = 1, 2, CASE_NAMES
    copy_elems = EMU_MAX_ELEMS if backend == "cuda_emu" else (8 << 20 if quick else 32 << 20)
    src = torch.randn(copy_elems, device=device)
    dst = torch.empty_like(src)
    rows, wrong = [], 0
    with torch.no_grad():
        for name in names:
            print(f"bench: {name}", file=sys.stderr, flush=True)
            case = make_case(name, quick, device)
            if backend == "cuda_emu":
                case = shrink(case)
            fn, inputs = case.fn, case.inputs
            expected = fn(*inputs)
            on = minicomp.compile(fn, backend=backend, cuda_graphs=True)
            off = minicomp.compile(fn, backend=backend, cuda_graphs=False)
            for _ in range(3):  # warm-up, capture, replay: the third call is what is compared
                got = on(*inputs)
                off(*inputs)
            err, scale = _max_err(got, expected)
            ok = err <= TOLERANCE * max(1.0, scale)
            wrong += not ok
            t = time_interleaved({"eager": lambda: fn(*inputs), "on": lambda: on(*inputs),
                                  "off": lambda: off(*inputs), "copy": lambda: dst.copy_(src)}, reps, sync=sync)
            moved = _nbytes(_tensors(inputs) + _state(fn) + _tensors(expected))
            copy_gbps = 2 * _nbytes([src]) / t["copy"] / 1e9
            gbps = moved / t["on"] / 1e9
            rows.append({"case": name, "shape": case.shape, "eager_ms": t["eager"] * 1e3, "on_ms": t["on"] * 1e3,
                         "off_ms": t["off"] * 1e3, "gbps": gbps, "pct": 100 * gbps / copy_gbps, "copy": copy_gbps,
                         "host_on": host_us(on, inputs, sync, calls), "host_off": host_us(off, inputs, sync, calls),
                         "replay": on.report().replay_bytes, "err": err, "ok": ok})
    print("\n".join(grid(rows, [
        ("case", "case", "{}"), ("shape", "shape", "{}"), ("eager ms", "eager_ms", "{:.3f}"),
        ("graphs ms", "on_ms", "{:.3f}"), ("no graphs ms", "off_ms", "{:.3f}"), ("GB/s", "gbps", "{:.1f}"),
        ("% copy", "pct", "{:.0f}%"), ("host us graphs", "host_on", "{:.1f}"), ("host us no graphs", "host_off", "{:.1f}"),
        ("replay B/call", "replay", "{:,}"), ("max abs err", "err", "{:.1e}")])))
    print(f"copy bandwidth (dst.copy_(src), {_nbytes([src]) / 2**20:.0f} MiB): median "
          f"{sorted(r['copy'] for r in rows)[len(rows) // 2]:.1f} GB/s (bytes read and written); GB/s = the bytes a "
          "case must move (inputs, parameters and outputs once) over minicomp's time with graphs; host us = the "
          "host's time per call queued back to back (what CUDA Graph replay saves)")
    return wrong


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cuda_emu"])
    ap.add_argument("--quick", action="store_true", help="small sizes and few repetitions")
    a = ap.parse_args(argv)
    device = "cuda" if a.backend == "cuda" else "cpu"
    if a.backend == "cuda" and not torch.cuda.is_available():
        print("no GPU: nothing to check (run with --backend cuda_emu for the emulated check)")
        return 0
    t0 = time.perf_counter()
    print(f"backend {a.backend}{' (quick)' if a.quick else ''}: {versions(a.backend)}", flush=True)
    failures = zoo(a.backend, device)
    print(flush=True)
    wrong = bench(a.backend, device, a.quick)
    print(f"\n{failures} zoo failure(s), {wrong} wrong bench case(s), {time.perf_counter() - t0:.0f} s in all")
    return 1 if failures or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
