"""Training steps: eager vs minicomp (rematerialization on and off) vs torch.compile (Inductor),
and the activation bytes each partition keeps between forward and backward.

A step is forward, an MSE loss, backward and an AdamW step (torch's own optimizer for every
contender: only the model is compiled). Each contender trains its own copy of the model, timed
interleaved like the inference table (timing.py). Saved bytes use one meter for all three
partitions (compiler/passes/partition.py saved_bytes: graph inputs free, storage counted once):
minicomp's min cut, remat=False, and PyTorch's own min-cut partitioner
(torch._functorch.partitioners.min_cut_rematerialization_partition) run on the same joint graph.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import minicomp
from minicomp.api import CompiledModule
from minicomp.bench_cases import Case, make_train_case
from minicomp.bench_traces import cold_caches, collect, compile_parts, trace_only, warm_traces
from minicomp.guard_profile import unprofiled
from minicomp.options import Options
from minicomp.timing import grid, set_threads, time_interleaved

TOLERANCE = 1e-4  # max abs gradient error after one step, relative to max(1, max |eager gradient|)
COLD_SAMPLES = 3  # cold first steps timed per compiler (the median is shown; one with --quick)


def torch_min_cut_bytes(model, inputs) -> int | None:
    """The saved bytes of PyTorch's min-cut partition of the joint graph minicomp would get (same
    Dynamo graph, same decompositions), measured with minicomp's meter; None where it fails."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from minicomp.compiler.decompositions import TRAINING
    from minicomp.compiler.training import saved_bytes_meter
    found = []

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kw):
        meter = saved_bytes_meter(joint)  # not a deepcopy of the joint: it may hold fake-tensor constants
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        outputs = fw.graph.find_nodes(op="output")[0].args[0][num_fwd_outputs:]
        found.append(meter([o.name for o in outputs if isinstance(o, torch.fx.Node)]))
        return fw, bw
    backend = aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g), bw_compiler=lambda g, _: make_boxed_func(g),
                           partition_fn=partition, decompositions=TRAINING)
    torch._dynamo.reset()
    try:
        out = torch.compile(copy.deepcopy(model), backend=backend)(*inputs)
        out.sum().backward()
    except Exception:
        return None
    finally:
        torch._dynamo.reset()
    return sum(found) if found else None


def _stepper(model, fn, inputs, target):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(fn(*inputs), target)
        loss.backward()
        opt.step()
        return loss
    return step


def profiled_step_parts(model, inputs, target, backend: str, reps: int) -> tuple:
    """(torch s, kernel s) per minicomp training step. torch: the seconds spent in torch's code that
    Inductor's step runs too -- the optimizer step, and the torch calls (matmuls, attention,
    convolutions) in the profiled forward and backward programs (medians of each step, summed);
    kernel: the seconds in minicomp's own kernels, likewise. What is left of a step is the call
    paths of ours, AOTAutograd's and autograd's, and the small torch calls Inductor fuses (a bias
    gradient's sum)."""
    model = copy.deepcopy(model)
    fn = CompiledModule(model, dataclasses.replace(Options.make(backend=backend), profile=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    opt_s = []
    for i in range(2 + max(3, reps // 2)):
        if i == 2:
            for st in fn.report().steps:
                st.samples.clear()
        F.mse_loss(fn(*inputs), target).backward()
        t0 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        opt_s.append(time.perf_counter() - t0)

    def total(kind):
        return sum(statistics.median(st.samples) for st in fn.report().steps if st.kind == kind and st.samples)
    return statistics.median(opt_s[2:]) + total("torch"), total("kernel")


def inductor_kernel_time_per_step(model, inputs, target, reps: int) -> float | None:
    """Seconds an Inductor training step spends in the kernels Inductor generates (the median of
    profiled steps): a copy of the model compiled by Inductor with a record-function around each of
    its C++ kernels (its own cpp.enable_kernel_profile), under torch.profiler. What is left of
    Inductor's step -- torch's matmuls and optimizer, Dynamo, AOTAutograd and autograd -- is what a
    compiler whose kernels cost nothing would still spend; None where it cannot be measured."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    model = copy.deepcopy(model)
    torch._dynamo.reset()  # compiled afresh: Dynamo's entry for this forward, or a cached compile of
    try:                   # the same graph, would come without the records
        with inductor_config.patch({"cpp.enable_kernel_profile": True, "fx_graph_cache": False}), \
                functorch_config.patch({"enable_autograd_cache": False}):
            step = _stepper(model, torch.compile(model), inputs, target)
            step()
            step()
        samples = []
        for _ in range(max(3, reps // 3)):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            samples.append(sum(e.cpu_time_total for e in prof.events() if "cpp_fused" in e.name) / 1e6)
    except Exception:  # no C++ compiler, or a profiler that cannot run here
        return None
    return statistics.median(samples) if any(samples) else None


def _grads_after_one_step(model, fn, inputs, target):
    loss = F.mse_loss(fn(*inputs), target)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()], loss.item()


def _timed_step(model, fn, inputs, target) -> tuple:
    """(seconds, (gradients, loss)) of a first training step, after a full collection."""
    collect()
    t0 = time.perf_counter()
    result = _grads_after_one_step(model, fn, inputs, target)
    return time.perf_counter() - t0, result


def trace_first_step(model, inputs, target) -> float | None:
    """Seconds of a first training step through Dynamo and AOTAutograd (minicomp's decompositions,
    PyTorch's default partition) that compiles nothing: the traces any compiler built on both pays,
    and the step run by torch. Its ratio to Inductor's first step is the least a compile-s ratio
    can be. Untimed steps of the same kind go first (bench_traces.warm_traces, with each
    compiler's decompositions): they pay the process's first-use costs of tracing this model for
    both compilers, so neither the timed steps nor the compilers timed after them pay those; the
    least of two timed ones, each after a full collection (bench_traces.collect). None where it
    fails."""
    def step(backend):
        traced = copy.deepcopy(model)
        _grads_after_one_step(traced, torch.compile(traced, backend=backend), inputs, target)
    warm_traces(step)
    seconds = []
    try:
        for _ in range(2):
            torch._dynamo.reset()
            traced = copy.deepcopy(model)
            with unprofiled():  # as minicomp.compile's compiles (guard_profile.py)
                seconds.append(_timed_step(traced, torch.compile(traced, backend=trace_only()), inputs, target)[0])
    except Exception:
        return None
    finally:
        torch._dynamo.reset()
    return min(seconds)


def _grads_f64(model, inputs, target):
    """One step's gradients of a float64 copy of the model: the reference both float32 results
    approximate. None where the model does not run in float64."""
    exact = copy.deepcopy(model).double()
    try:
        out = exact(*[x.double() if x.is_floating_point() else x for x in inputs])
        F.mse_loss(out, target.double()).backward()
    except (RuntimeError, TypeError):
        return None
    return [p.grad for p in exact.parameters()]


def bench_train_case(name: str, backend: str, reps: int, quick: bool) -> dict:
    case: Case = make_train_case(name, quick)
    torch.manual_seed(0)
    target = torch.randn_like(case.fn(*case.inputs)).detach()
    models = {k: copy.deepcopy(case.fn) for k in ("eager", "minicomp", "noremat", "inductor")}
    trace_s = trace_first_step(case.fn, case.inputs, target)
    # cold first steps, the two compilers in turn, each from empty caches (bench_traces.cold_caches):
    # medians. The extra samples compile copies, each after a reset of Dynamo (a copy of a module
    # would otherwise find the compiled code of the one before); the last pair, after one more
    # reset, compiles the models the table times, and nothing resets Dynamo after them.
    fns, cold, ind_cold, notes = {"eager": models["eager"]}, [], [], []
    for k in range(1 if quick else COLD_SAMPLES):
        last = k == (0 if quick else COLD_SAMPLES - 1)
        torch._dynamo.reset()
        model = models["minicomp"] if last else copy.deepcopy(case.fn)
        with cold_caches():
            fn = minicomp.compile(model, backend=backend)
            s, result = _timed_step(model, fn, case.inputs, target)
            cold.append((s,) + compile_parts(fn.report()))
        if last:
            fns["minicomp"], (grads, loss) = fn, result
        if ind_cold is None:
            continue
        model = models["inductor"] if last else copy.deepcopy(case.fn)
        try:
            with cold_caches():
                fn = torch.compile(model)
                ind_cold.append(_timed_step(model, fn, case.inputs, target)[0])
        except Exception as e:  # a machine without a C++ compiler: still show eager vs minicomp
            ind_cold = None
            notes.append(f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        if last:
            fns["inductor"] = fn
    compile_s, own_s, llvm_s = (statistics.median(c[i] for c in cold) for i in range(3))
    inductor_s = statistics.median(ind_cold) if ind_cold else None
    fns["noremat"] = minicomp.compile(models["noremat"], backend=backend, remat=False)
    want, loss_e = _grads_after_one_step(models["eager"], fns["eager"], case.inputs, target)
    _grads_after_one_step(models["noremat"], fns["noremat"], case.inputs, target)
    scale = max(1.0, max(g.abs().max().item() for g in want))
    err = max(max((a - b).abs().max().item() for a, b in zip(grads, want)), abs(loss - loss_e))
    ok = err <= TOLERANCE * scale
    if not ok:  # eager's float32 is an approximation too: judge both against float64
        exact = _grads_f64(case.fn, case.inputs, target)
        if exact is not None:
            ours64, eager64 = (max((a.double() - b).abs().max().item() for a, b in zip(g, exact)) for g in (grads, want))
            ok = ours64 <= max(eager64, TOLERANCE * scale)
            notes.append(f"gradients off eager's by {err:.1e}; against float64, minicomp's are off by {ours64:.1e}, "
                         f"eager's by {eager64:.1e}: {'as close as eager' if ok else 'further than eager'}")
    parts = fns["minicomp"].report().partitions
    ours = sum(p.saved_bytes for p in parts)
    no_remat = sum(p.no_remat_bytes for p in parts)
    torch_cut = torch_min_cut_bytes(case.fn, case.inputs)
    notes += [f"ran eagerly: {e}" for e in fns["minicomp"].report().eager]
    steps = {k: _stepper(models[k], fn, case.inputs, target) for k, fn in fns.items()}
    t = time_interleaved(steps, reps)
    ind = t.get("inductor")
    torch_s, kernel_s = profiled_step_parts(case.fn, case.inputs, target, backend, reps)
    share, kernels = min(1.0, torch_s / t["minicomp"]), min(1.0, kernel_s / t["minicomp"])
    ind_kernels = inductor_kernel_time_per_step(case.fn, case.inputs, target, reps) if ind else None
    return {
        "case": name, "shape": case.shape,
        "eager_ms": t["eager"] * 1e3, "minicomp_ms": t["minicomp"] * 1e3, "noremat_ms": t["noremat"] * 1e3,
        "inductor_ms": ind * 1e3 if ind else None,
        "vs_eager": t["minicomp"] / t["eager"], "vs_inductor": t["minicomp"] / ind if ind else None,
        "vs_noremat": t["minicomp"] / t["noremat"],
        "torch_share": share, "floor": share * t["minicomp"] / ind if ind else None,
        "kernel_share": kernels, "kernel_free": (1 - kernels) * t["minicomp"] / ind if ind else None,
        "ind_kernel_share": ind_kernels / ind if ind_kernels else None,
        "bound": 1 - ind_kernels / ind if ind_kernels else None,
        "saved_kib": ours / 1024, "noremat_kib": no_remat / 1024,
        "torch_kib": torch_cut / 1024 if torch_cut is not None else None,
        "saved_share": ours / no_remat if no_remat else math.nan,
        "vs_torch_cut": ours / torch_cut if torch_cut else None,
        "compile_s": compile_s, "inductor_compile_s": inductor_s, "trace_s": trace_s, "own_s": own_s, "llvm_s": llvm_s,
        "trace_vs_inductor": trace_s / inductor_s if trace_s and inductor_s else None,
        "compile_vs_inductor": compile_s / inductor_s if inductor_s else None,
        "max_abs_err": err, "ok": ok, "notes": notes,
    }


COLUMNS = [  # (header, row key, format)
    ("training case", "case", "{}"), ("shape", "shape", "{}"),
    ("eager ms", "eager_ms", "{:.3f}"), ("minicomp ms", "minicomp_ms", "{:.3f}"),
    ("remat=False ms", "noremat_ms", "{:.3f}"), ("inductor ms", "inductor_ms", "{:.3f}"),
    ("mc/eager", "vs_eager", "{:.2f}"), ("mc/inductor", "vs_inductor", "{:.2f}"), ("mc/no-remat", "vs_noremat", "{:.2f}"),
    ("torch", "torch_share", "{:.0%}"), ("floor", "floor", "{:.2f}"),
    ("mc kernels", "kernel_share", "{:.0%}"), ("kernel-free", "kernel_free", "{:.2f}"),
    ("ind. kernels", "ind_kernel_share", "{:.0%}"), ("bound", "bound", "{:.2f}"),
    ("saved KiB", "saved_kib", "{:,.0f}"), ("remat=False KiB", "noremat_kib", "{:,.0f}"),
    ("torch min-cut KiB", "torch_kib", "{:,.0f}"), ("saved/no-remat", "saved_share", "{:.0%}"),
    ("saved/torch", "vs_torch_cut", "{:.2f}"),
    ("compile s", "compile_s", "{:.2f}"), ("inductor s", "inductor_compile_s", "{:.2f}"),
    ("compile/ind.", "compile_vs_inductor", "{:.2f}"), ("own s", "own_s", "{:.2f}"), ("llvm s", "llvm_s", "{:.2f}"),
    ("trace s", "trace_s", "{:.2f}"),
    ("trace/ind.", "trace_vs_inductor", "{:.2f}"), ("max abs err", "max_abs_err", "{:.1e}"),
]


def geomean(xs) -> float:
    xs = [x for x in xs if x is not None and x == x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def run_train(cases, backend: str = "auto", reps: int | None = None, quick: bool = False) -> list:
    set_threads()
    reps = reps or (7 if quick else 30)
    rows = []
    for i, name in enumerate(cases, 1):
        print(f"bench: [{i}/{len(cases)}] {name}: cold first steps (minicomp and torch.compile in turn, "
              f"{1 if quick else COLD_SAMPLES} each), remat=False, then {reps} interleaved training steps",
              file=sys.stderr, flush=True)
        rows.append(bench_train_case(name, backend, reps, quick))
    return rows


def format_train_table(rows: list) -> str:
    out = grid(rows, COLUMNS)
    good = [r for r in rows if r["ok"]]
    out.append(f"geomean over {len(good)} correct training case(s): mc/eager {geomean(r['vs_eager'] for r in good):.2f}, "
               f"mc/inductor {geomean(r['vs_inductor'] for r in good):.2f}, mc/no-remat "
               f"{geomean(r['vs_noremat'] for r in good):.2f}; saved/no-remat {geomean(r['saved_share'] for r in good):.0%}, "
               f"saved/torch min-cut {geomean(r['vs_torch_cut'] for r in good):.2f}")
    out.append("a step = forward, MSE loss, backward, AdamW step (torch's, for every contender); saved KiB = activations kept "
               "between forward and backward (graph inputs free), one meter for minicomp's cut, remat=False and PyTorch's "
               "min-cut partitioner on the same joint graph; torch = the share of minicomp's step in torch's code Inductor's "
               "step runs too (the optimizer step, and the matmuls, attention and convolutions of the profiled forward and "
               "backward); floor = that share x mc/inductor, the ratio left if minicomp's kernels and call paths cost nothing; "
               "mc kernels = the share of minicomp's step in its own kernels (profiled); kernel-free = (1 - that share) x "
               "mc/inductor, the ratio left if minicomp's kernels cost nothing and all else stays; "
               "ind. kernels = the share of Inductor's step in the kernels Inductor generates (profiled); bound = 1 - that "
               "share, the mc/inductor a compiler reaches whose kernels cost nothing and whose every other cost (torch's "
               "matmuls and optimizer, Dynamo, AOTAutograd, autograd) is Inductor's; compile s = the first step (empty caches, "
               f"median of {COLD_SAMPLES}, the compilers in turn, one with --quick; the process has traced once before, see "
               "trace s), inductor s Inductor's; own s = minicomp's part of the "
               "first step (the cut, the forward's and backward's code, the first calls' waits for LLVM), llvm s = LLVM's O3, "
               "machine code and loading, in the background from the end of each graph's code generation; trace s = a first step through Dynamo and AOTAutograd that compiles nothing (same "
               "decompositions, PyTorch's partition; the step run by torch; Dynamo's guard profile skipped, as minicomp.compile "
               "skips it), and trace/ind. that over Inductor's: the least "
               "compile/ind. a compiler built on both can reach")
    out += [f"{r['case']}: {n}" for r in rows for n in r["notes"]]
    wrong = [r["case"] for r in rows if not r["ok"]]
    if wrong:
        out.append(f"WRONG (gradient error above {TOLERANCE:g} x max(1, max|eager grad|)): {', '.join(wrong)}")
    return "\n".join(out)
