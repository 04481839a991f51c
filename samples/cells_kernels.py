"""Cells of the kernel-level sample notebooks: fusion (cos(cos(x))), memory-bound norms and softmax
against the bandwidth roof, and per-call overhead. make_notebooks.py turns them into notebooks.

Every notebook reads MINICOMP_QUICK=1 (small sizes, few repetitions: what CI runs) and puts its
tensors on the GPU when there is one, so backend="auto" picks the CUDA backend there.
"""
from textwrap import dedent

from nbformat.v4 import new_code_cell, new_markdown_cell


def md(text: str):
    return new_markdown_cell(dedent(text).strip("\n"))


def code(text: str):
    return new_code_cell(dedent(text).strip("\n"))


SETUP_TEMPLATE = """
    import os

    import matplotlib.pyplot as plt
    import torch

    import minicomp
    from minicomp.timing import {timing}

    QUICK = os.environ.get("MINICOMP_QUICK") == "1"  # small sizes, few repetitions
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    reps = 5 if QUICK else 30
    set_threads()
    torch.manual_seed(0)
    print("device:", device, "| quick:", QUICK)
"""



def setup(timing: str = "set_threads, time_interleaved") -> str:
    """The first code cell; `timing`: what it imports from minicomp.timing (only what the notebook uses)."""
    return SETUP_TEMPLATE.replace("{timing}", timing)


COS_COS = [
    md("""
        # Fusion: `cos(cos(x))`

        Eager PyTorch runs the two cosines as two kernels: the first writes `cos(x)` to memory, the
        second reads it back. minicomp fuses them into one kernel that reads `x` once and writes the
        result once. `minicomp.explain()` compiles the function, runs it, and counts the bytes each
        side moves; this notebook plots its figures and times eager, minicomp and `torch.compile`.
    """),
    code(setup()),
    code("""
        def f(x):
            return torch.cos(torch.cos(x))

        n = 1 << 16 if QUICK else 1 << 24
        x = torch.randn(n, device=device)
        e = minicomp.explain(f, x, backend="auto", reps=reps)
        print(e)
    """),
    md("""
        ## One kernel, and the bytes it moves

        `e.kernels` has one row per kernel and per torch call; `e.totals` sets the compiled program
        against eager's ops on the same input, and against the least any program could move (each
        input read once, each output written once).
    """),
    code("""
        t = e.totals
        print(f"minicomp: {len(e.kernels)} kernel(s), ops fused into {e.kernels[0].name}: {e.kernels[0].ops}")
        print(f"eager: {t.eager_launches} ops")
        print(f"bytes moved: minicomp {t.bytes:,}, eager {t.eager_bytes:,} (minicomp / eager = {t.bytes / t.eager_bytes:.2f})")
        print(f"least possible: {t.min_bytes:,} (= 2 x {x.element_size()} B x {n:,}: {t.min_bytes == 2 * x.element_size() * n})")
    """),
    md("""
        ## Time per call: eager, minicomp, `torch.compile`

        Median of interleaved runs (the contenders take turns, so machine noise hits all alike).
        `torch.compile` needs a C++ compiler on CPU (Triton on a GPU); where it fails, the cell says
        why and times the other two.
    """),
    code("""
        compiled = minicomp.compile(f, backend="auto")
        contenders = {"eager": f, "minicomp": compiled}
        try:
            inductor = torch.compile(f)
            inductor(x)
            contenders["torch.compile"] = inductor
        except Exception as err:
            print("torch.compile skipped:", type(err).__name__, str(err).splitlines()[0][:200])
        with torch.no_grad():
            times = time_interleaved({k: (lambda fn=fn: fn(x)) for k, fn in contenders.items()}, reps=reps, sync=sync)
        us = {k: v * 1e6 for k, v in times.items()}
        for k, v in us.items():
            print(f"{k:>14}: {v:10.1f} us per call ({us['eager'] / v:.2f}x eager's speed)")
    """),
    code("""
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
        left.bar(["eager", "minicomp", "least possible"], [t.eager_bytes, t.bytes, t.min_bytes],
                 color=["tab:gray", "tab:blue", "tab:green"])
        left.set(ylabel="bytes moved per call", title=f"cos(cos(x)), {n:,} floats")
        right.bar(list(us), list(us.values()), color=["tab:gray", "tab:blue", "tab:orange"][:len(us)])
        right.set(ylabel="us per call (median)", title=f"time per call, backend {e.report.graphs[0].backend}")
        fig.tight_layout()
        plt.show()
    """),
]

NORMS_SOFTMAX = [
    md("""
        # Norms and softmax against the roofline

        LayerNorm, RMSNorm and softmax read a row, reduce it and write a row: a handful of flops per
        byte moved. `minicomp.explain()` sets each kernel against this machine's roofline, measured
        once with minicomp's own kernels and cached: read and copy bandwidth per working-set size
        (caches first, then DRAM), a vector compute roof (in the op table's cost units) and a launch
        floor. Per kernel, the least time its bytes, its flops and its launch can take: the largest of
        the three names its `bound`, and that least time over the measured one is `roof_fraction`.

        Every kernel here is judged against one roofline, taken from the cache (or measured now) by
        `minicomp.roofline.get` and handed to each `explain()`; `get(backend, refresh=True)` measures
        it again, as a busy machine can make a cached one wrong.
    """),
    code(setup("set_threads")),
    code("""
        import torch.nn.functional as F

        from minicomp import roofline

        roof = roofline.get("cuda" if device == "cuda" else "cpu")
        print(roof)
        C = 1024
        cases = {  # name: (function, number of tensor arguments)
            "layer_norm": (lambda x, w, b: F.layer_norm(x, (C,), w, b), 3),
            "rms_norm": (lambda x, w: F.rms_norm(x, (C,), w), 2),
            "softmax": (lambda x: F.softmax(x, dim=-1), 1),
        }
        row_counts = (64, 1024) if QUICK else (64, 1024, 8192, 32768)
        points, explanations = [], {}
        for name, (fn, n_args) in cases.items():
            for rows in row_counts:
                args = [torch.randn(rows, C, device=device)] + [torch.randn(C, device=device) for _ in range(n_args - 1)]
                e = minicomp.explain(fn, *args, backend="auto", reps=reps, roofline=roof)
                explanations[name, rows] = e
                for k in e.kernels:
                    points.append((name, k))
                    print(f"{name:>10} {rows:>6}x{C}: {k.name} {k.label:<22} {k.bytes:>12,} B {k.intensity:5.2f} flop/B "
                          f"{k.gbps:7.1f} GB/s {k.gflops:7.1f} GFLOP/s  {k.bound}, {k.roof_fraction:.0%} of roof")
    """),
    md("""
        ## The kernels under the roofs

        Left: GFLOP/s against flops per byte, under each working-set class's bandwidth slope and the
        vector roof. Right: GB/s (bytes moved over the measured median time) against bytes moved,
        under the read and copy roofs; a kernel is held to the class at or above its own bytes.
        Colours: the bound `explain()` gave each kernel.
    """),
    code("""
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
        markers = {"layer_norm": "o", "rms_norm": "s", "softmax": "^"}
        colors = {"memory": "tab:blue", "compute": "tab:red", "overhead": "tab:gray"}
        intensities = [2 ** (i / 4) / 64 for i in range(4 * 14)]
        for size, read in zip(roof.sizes, roof.read_gbps):
            left.plot(intensities, [i * read for i in intensities], ":", color="k", alpha=0.5)
        left.axhline(roof.vector_gflops, color="k", label="vector roof")
        left.plot([], [], ":", color="k", label="read bandwidth x intensity, per class")
        edges = [roof.sizes[0] / 16] + list(roof.sizes) + [roof.sizes[-1] * 4]
        right.step(edges, roof.read_gbps[:1] + list(roof.read_gbps) + roof.read_gbps[-1:], "k-", where="pre",
                   label="read roof")
        right.step(edges, roof.copy_gbps[:1] + list(roof.copy_gbps) + roof.copy_gbps[-1:], "k--", where="pre",
                   label="copy roof")
        for name, k in points:
            left.scatter(k.intensity, k.gflops, marker=markers[name], color=colors[k.bound], s=45)
            right.scatter(k.bytes, k.gbps, marker=markers[name], color=colors[k.bound], s=45)
        for ax in (left, right):
            for name, m in markers.items():
                ax.scatter([], [], marker=m, color="k", label=name)
            for bound, c in colors.items():
                ax.scatter([], [], marker="o", color=c, label=f"bound: {bound}")
            ax.legend(fontsize=7)
        left.set(xscale="log", yscale="log", xlabel="flops per byte", ylabel="GFLOP/s", title="roofline")
        right.set(xscale="log", yscale="log", xlabel="bytes moved per call", ylabel="GB/s",
                  title=f"{roof.machine} [{roof.backend}]")
        fig.tight_layout()
        plt.show()
    """),
    md("""
        ## One explanation in full

        The largest softmax: its table, the totals against eager, and the roofline it was judged by.
    """),
    code("""
        print(explanations["softmax", row_counts[-1]])
    """),
]

OVERHEAD = [
    md("""
        # Overhead: a chain of tiny ops

        On 16 numbers there is almost nothing to compute or move (the `explain()` cell at the end
        prints the bytes and flops), so a call's time goes to getting the work started. Eager
        launches one op after another, through Python and the dispatcher; a compiled call runs the
        program minicomp built for the whole chain. This notebook times chains of a few to many ops
        per call, eager against compiled (and on a GPU, compiled with and without CUDA Graph replay).
    """),
    code(setup()),
    code("""
        import numpy as np

        def make_chain(n_ops):
            def chain(x):
                for i in range(n_ops):
                    x = torch.sin(x) if i % 2 else x * 1.01
                return x
            return chain

        lengths = (1, 8, 32) if QUICK else (1, 4, 16, 64, 128)
        x = torch.randn(16, device=device)
        per_call = {"eager": [], "minicomp": []}
        if device == "cuda":
            per_call["minicomp, no CUDA Graph"] = []
        for n_ops in lengths:
            fn = make_chain(n_ops)
            contenders = {"eager": fn, "minicomp": minicomp.compile(fn, backend="auto")}
            if device == "cuda":
                contenders["minicomp, no CUDA Graph"] = minicomp.compile(fn, backend="auto", cuda_graphs=False)
            with torch.no_grad():
                t = time_interleaved({k: (lambda c=c: c(x)) for k, c in contenders.items()}, reps=reps, sync=sync)
            for k in per_call:
                per_call[k].append(t[k] * 1e6)
            print(f"{n_ops:>4} ops: " + ", ".join(f"{k} {t[k] * 1e6:.1f} us" for k in per_call))
    """),
    md("""
        ## Per-call time against the number of ops

        A straight line fitted through each contender's points: its slope is what one more op adds
        to a call, its intercept what a call costs with no work at all.
    """),
    code("""
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for k, ys in per_call.items():
            slope, intercept = np.polyfit(lengths, ys, 1)
            ax.plot(lengths, ys, "o-", label=f"{k}: {slope:.2f} us/op + {intercept:.1f} us")
        ax.set(xlabel="ops in the chain", ylabel="us per call (median)", title=f"chains on 16 floats, {device}")
        ax.legend(fontsize=8)
        plt.show()
    """),
    md("""
        ## What bounds the compiled chain

        `explain()` on the longest chain: its kernels, and the bound of each against this machine's
        roofline (`overhead` when the launch floor is the largest of the three least times).
    """),
    code("""
        e = minicomp.explain(make_chain(lengths[-1]), x, backend="auto", reps=reps)
        print(e)
        print("bounds:", [k.bound for k in e.kernels])
    """),
]
