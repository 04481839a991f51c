"""Cells of the model-level sample notebooks: a GPT-style block (speed, explain(), the IR dump, one
kernel's source) and training with rematerialization. make_notebooks.py turns them into notebooks."""
from cells_kernels import code, md, setup

GPT_BLOCK = [
    md("""
        # A GPT-style block

        `minicomp.models.Block` is a GPT-2 block written the way nanoGPT writes it: LayerNorm, causal
        self-attention, a GELU MLP, residuals. This notebook times it eager and compiled, shows the
        `explain()` table and roofline, the IR minicomp's passes produce (the `debug` flag), and the
        code generated for one kernel.
    """),
    code(setup()),
    code("""
        from IPython.display import Image, display

        from minicomp.models import Block

        B, T, C, H = (2, 32, 64, 4) if QUICK else (8, 256, 512, 8)
        model = Block(C, H, T).to(device).eval()
        compiled = minicomp.compile(model, backend="auto")
        x = torch.randn(B, T, C, device=device)
        with torch.no_grad():
            print("max abs error against eager:", (compiled(x) - model(x)).abs().max().item())
    """),
    md("""
        ## Eager vs compiled

        Inference time per call, median of interleaved runs.
    """),
    code("""
        def infer(m):
            with torch.no_grad():
                return m(x)

        times = time_interleaved({"eager": lambda: infer(model), "minicomp": lambda: infer(compiled)}, reps=reps, sync=sync)
        ms = {k: v * 1e3 for k, v in times.items()}
        print({k: f"{v:.3f} ms" for k, v in ms.items()}, f"minicomp / eager = {ms['minicomp'] / ms['eager']:.2f}")
        plt.figure(figsize=(5, 3.5))
        plt.bar(list(ms), list(ms.values()), color=["tab:gray", "tab:blue"])
        plt.ylabel("ms per call (median)")
        plt.title(f"Block B={B} T={T} C={C} H={H}, backend {compiled.report().graphs[0].backend}")
        plt.show()
    """),
    md("""
        ## `explain()`: every kernel and torch call against the roofline

        One row per fused kernel (`k0`, `k1`, ...) and per torch call (the matmuls run in BLAS or
        cuBLAS): bytes, flops, measured time, the bound and the fraction of that roof reached; then
        the totals against eager and the fusions refused, with why.
    """),
    code("""
        e = minicomp.explain(model, x, backend="auto", reps=reps)
        print(e)
    """),
    md("""
        `e.save(folder)` writes `report.md`, `roofline.png` (left: GFLOP/s against flops per byte under
        the compute roofs; right: GB/s against bytes moved under the bandwidth roofs), a picture of the
        fused graph and every stage's IR and sources.
    """),
    code("""
        import tempfile

        folder = e.save(tempfile.mkdtemp(prefix="minicomp-block-"))
        print(sorted(os.listdir(folder)))
        display(Image(filename=os.path.join(folder, "roofline.png")))
    """),
    md("""
        ## The IR dump

        `debug="folder"` (or `MINICOMP_DUMP_DIR`) writes one numbered folder per compiled graph and
        one numbered file per stage: the fx graph, the IR after each pass, the fusion report, the
        kernels and the generated code. (`debug=2` prints the IR after each pass to stderr instead.)
        Here: the file list, and the IR after the last pass, where each kernel is one line.
    """),
    code("""
        dump = tempfile.mkdtemp(prefix="minicomp-dump-")
        dumped = minicomp.compile(model, backend="auto", debug=dump)
        with torch.no_grad():
            dumped(x)
        graph_dir = os.path.join(dump, sorted(os.listdir(dump))[0])
        stages = sorted(os.listdir(graph_dir))
        print(stages)
        last_ir = [s for s in stages if "_ir_after_" in s][-1]
        print(f"--- {last_ir}")
        print(open(os.path.join(graph_dir, last_ir)).read())
    """),
    md("""
        ## One kernel's generated source

        The kernel with the most fused ops, as the backend's code generator wrote it: LLVM IR on the
        CPU backend, CUDA C on the CUDA backend.
    """),
    code("""
        import re

        kernel = max(dumped.report().kernels, key=lambda k: len(k.ops))
        print(kernel)
        source_file = next(s for s in stages if s.endswith(("_llvm.txt", "_cuda.txt")))
        source = open(os.path.join(graph_dir, source_file)).read()
        if source_file.endswith("_cuda.txt"):  # a comment line "// k3: ..." opens each kernel
            print(re.search(rf"^// {kernel.name}:.*?(?=^// k\\d+:|\\Z)", source, re.M | re.S).group())
        else:  # the kernel's loop nest is the function k3_body
            start = source.index(f'define internal void @"{kernel.name}_body"')
            print(source[start:source.index("\\n}\\n", start) + 2])
    """),
]

TRAINING_REMAT = [
    md("""
        # Training with rematerialization

        In training, the forward keeps activations for the backward. minicomp's partitioner decides
        what to keep as a minimum cut over the joint forward+backward graph: a value that is cheap to
        recompute inside a backward kernel is recomputed there instead of stored (`remat=True`, the
        default); `remat=False` keeps every forward value the backward uses. This notebook compares
        the two: activation bytes kept between forward and backward, and the time of a training step.
    """),
    code(setup()),
    code("""
        import copy

        import torch.nn.functional as F

        from minicomp.models import Block

        B, T, C, H = (2, 32, 64, 4) if QUICK else (8, 256, 256, 8)
        base = Block(C, H, T).to(device)
        x = torch.randn(B, T, C, device=device)
        target = torch.randn(B, T, C, device=device)
        models = {k: copy.deepcopy(base) for k in ("eager", "remat=True", "remat=False")}
        fns = {"eager": models["eager"],
               "remat=True": minicomp.compile(models["remat=True"], backend="auto", remat=True),
               "remat=False": minicomp.compile(models["remat=False"], backend="auto", remat=False)}
        grads = {}
        for k, fn in fns.items():  # one forward and backward each: compiles, and checks gradients against eager
            F.mse_loss(fn(x), target).backward()
            grads[k] = [p.grad.clone() for p in models[k].parameters()]
        for k in ("remat=True", "remat=False"):
            err = max((a - b).abs().max().item() for a, b in zip(grads[k], grads["eager"]))
            print(f"{k}: max abs gradient error against eager {err:.1e}")
    """),
    md("""
        ## What the forward keeps

        `report().saved_bytes`: activations the training graph keeps between forward and backward
        (graph inputs, such as parameters, cost nothing extra). Each partition's line names what the
        min cut recomputes in the backward and the bytes that saves.
    """),
    code("""
        saved = {k: fns[k].report().saved_bytes for k in ("remat=True", "remat=False")}
        for k in saved:
            for p in fns[k].report().partitions:
                print(p)
        print(f"saved bytes: remat=True {saved['remat=True']:,}, remat=False {saved['remat=False']:,} "
              f"({saved['remat=True'] / saved['remat=False']:.0%})")
    """),
    md("""
        ## Step time

        A step: forward, MSE loss, backward and an AdamW step (torch's optimizer for every
        contender; only the model is compiled). Each contender trains its own copy of the block.
    """),
    code("""
        def stepper(model, fn):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(fn(x), target).backward()
                opt.step()
            return step

        times = time_interleaved({k: stepper(models[k], fn) for k, fn in fns.items()}, reps=reps, sync=sync)
        ms = {k: v * 1e3 for k, v in times.items()}
        print({k: f"{v:.3f} ms" for k, v in ms.items()})

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
        left.bar(list(saved), [v / 1024 for v in saved.values()], color=["tab:blue", "tab:purple"])
        left.set(ylabel="KiB kept for the backward", title="saved activations")
        right.bar(list(ms), list(ms.values()), color=["tab:gray", "tab:blue", "tab:purple"])
        right.set(ylabel="ms per training step (median)", title=f"Block B={B} T={T} C={C}, {device}")
        fig.tight_layout()
        plt.show()
    """),
]
