"""minicomp.compile's behaviour as a user sees it: programs per input signature, limits, weight
updates, output structure, torch.compile integration, graph breaks, debug output and dumps.
All on backend="interpret", so these test the API, not a code generator."""
from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.compiler.pipeline import KERNEL_PASSES, TENSOR_PASSES
from minicomp.ir import parse

from ..helpers import assert_matches_eager


def compile_i(fn, **kw):
    return minicomp.compile(fn, backend="interpret", **kw)


def kinds(compiled):
    return [g.kind for g in compiled.report().graphs]


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


# ---- programs per input signature ------------------------------------------------------------------

def test_new_shape_compiles_a_second_program_same_shape_reuses_it():
    f = compile_i(lambda x: torch.tanh(x) * 2)
    for n in (3, 3, 5, 5, 3):
        x = torch.randn(n, 4)
        torch.testing.assert_close(f(x), torch.tanh(x) * 2)
    assert kinds(f) == ["inference", "inference"]
    assert [g.name.rsplit("_", 1)[0] for g in f.report().graphs] == ["inference", "inference"]
    assert f.report().eager == []


def test_dtype_grad_mode_and_scalar_values_are_part_of_the_signature():
    f = compile_i(lambda x, s: x * s)
    x = torch.randn(4)
    torch.testing.assert_close(f(x, 2.0), x * 2.0)
    torch.testing.assert_close(f(x, 3.0), x * 3.0)
    torch.testing.assert_close(f(x.double(), 3.0), x.double() * 3.0)
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(f(x, 3.0), x * 3.0)
    torch.testing.assert_close(f(x, 2.0), x * 2.0)
    assert len(f.report().graphs) == 4


def test_the_fast_path_skips_the_signature_only_for_the_same_signature(monkeypatch):
    """A repeat of the last tensors-only signature is recognised by Dynamo's C++ tensor check;
    anything that changes the signature (shape, stride, dtype, requires_grad, grad mode, train/eval,
    autocast, inference mode) takes the Python signature and gets its own program."""
    from minicomp import api
    built = []
    real = api.call_signature
    monkeypatch.setattr(api, "call_signature", lambda *a: built.append(1) or real(*a))
    model = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Dropout(0.5))
    c = compile_i(model)
    x = torch.randn(6, 4)
    with torch.no_grad():
        for _ in range(3):
            assert c(x).eq(0).any(), "train mode: dropout"
        assert len(built) == 1, "repeats of one signature never build its key"
        c.eval()
        torch.testing.assert_close(c(x), model(x))
        variants = [x[:3], x.t().contiguous().t(), x.double(), x.requires_grad_(False).clone().requires_grad_()]
        for v in variants:
            torch.testing.assert_close(c(v), model(v))
        with torch.inference_mode():
            y = torch.randn(6, 4)
            torch.testing.assert_close(c(y), model(y))
        with torch.autocast("cpu"):
            torch.testing.assert_close(c(x), model(x))
    torch.testing.assert_close(c(x), model(x))  # grad mode on
    graphs = len(c.report().graphs)
    assert graphs == 9, c.report()
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x))  # back to an earlier signature: no compile
    assert len(c.report().graphs) == graphs


def test_a_new_shape_outside_the_arguments_recompiles_and_never_goes_wrong(caplog):
    """A tensor the function reads from elsewhere changes shape: the signature is the same, a Dynamo
    guard fails and Dynamo recompiles with that dimension dynamic. minicomp compiles that symbolic
    graph too: one more program, which then serves every size, and nothing runs in torch."""
    state = {"w": torch.randn(4)}

    def f(x):
        return (x * 2).sum() + torch.cos(state["w"])
    g = minicomp.compile(f, backend="cpu")
    x = torch.randn(8)
    for n in (4, 6, 7, 4):
        state["w"] = torch.randn(n)
        with caplog.at_level(logging.WARNING, logger="minicomp"):
            torch.testing.assert_close(g(x), f(x))
    graphs = g.report().graphs
    assert len(graphs) == 2 and graphs[0].detail.get("symbolic") is None
    assert len(graphs[1].detail["symbolic"]) == 1 and graphs[1].detail["symbolic"][0].split(": ")[1].startswith("f32[s")
    assert g.report().eager == []


def test_max_programs_limit_logs_runs_eagerly_and_reports(caplog):
    f = compile_i(lambda x: x.exp() + 1, max_programs=2, dynamic=False)  # a program per size
    with caplog.at_level(logging.WARNING, logger="minicomp"):
        for n in (1, 2, 3, 4, 3):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), x.exp() + 1)
    assert len(f.report().graphs) == 2
    limit = [r for r in caplog.records if r.name == "minicomp" and "max_programs=2" in r.getMessage()]
    assert len(limit) == 1, "warn once, not on every eager call"
    assert any("max_programs=2" in e for e in f.report().eager)
    assert "ran eagerly: max_programs=2" in str(f.report())


def test_train_and_eval_get_their_own_programs():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    c = compile_i(model)
    x = torch.randn(8, 4)
    c.eval()
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x))
        c.train()
        assert c(x).eq(0).any(), "dropout is active again in train mode"
    assert len(c.report().graphs) == 2


# ---- parameters -----------------------------------------------------------------------------------

def test_weight_changes_after_compile_take_effect():
    lin = torch.nn.Linear(4, 3)
    c = compile_i(lin)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(c(x), lin(x))
        lin.weight.mul_(2)
        torch.testing.assert_close(c(x), x @ lin.weight.T + lin.bias)
        lin.weight = torch.nn.Parameter(torch.randn(3, 4))
        torch.testing.assert_close(c(x), x @ lin.weight.T + lin.bias)
        c.bias = torch.nn.Parameter(torch.randn(3))  # assignment through the wrapper reaches the model
        assert c.bias is lin.bias
        torch.testing.assert_close(c(x), x @ lin.weight.T + lin.bias)


def test_training_step_compiles_forward_and_backward():
    compiled = assert_matches_eager(mlp(), torch.randn(5, 8, requires_grad=True))
    assert kinds(compiled) == ["forward", "backward"]


# ---- many closures, graph breaks: never silently eager --------------------------------------------

def _scaled(k):
    def f(x):
        return torch.sin(x) * k
    return f


def test_twenty_closures_each_compile():
    x = torch.randn(4)
    for k in range(20):
        c = compile_i(_scaled(k))
        torch.testing.assert_close(c(x), torch.sin(x) * k)
        assert len(c.report().graphs) == 1 and c.report().eager == [], f"closure {k}: {c.report()}"


def _breaking(k):
    def f(x):
        y = x * k
        print("between graphs")  # a graph break inside the user's function
        return y + 1
    return f


def test_closures_with_graph_breaks_past_dynamo_recompile_limit_each_compile(capsys):
    # with Dynamo's per-code-object cache, the 3rd closure would run eagerly without a word
    x = torch.randn(4)
    with torch._dynamo.config.patch(recompile_limit=2):
        for k in range(4):
            c = compile_i(_breaking(k))
            torch.testing.assert_close(c(x), x * k + 1)
            assert len(c.report().graphs) == 2, f"closure {k}: {c.report()}"
    assert capsys.readouterr().out.count("between graphs") == 4


# ---- inputs and outputs ---------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "low high")


@dataclasses.dataclass
class Stats:
    mean: torch.Tensor
    count: int


def test_output_structure_is_preserved():
    def f(x):
        return {"t": (x + 1, [x * 2, (x - 1,)]), "pair": Pair(x.amin(), x.amax()), "none": None, "n": 3}
    x = torch.randn(3, 4)
    out = compile_i(f)(x)
    want = f(x)
    assert list(out) == ["t", "pair", "none", "n"]
    assert isinstance(out["t"], tuple) and isinstance(out["t"][1], list) and isinstance(out["t"][1][1], tuple)
    assert type(out["pair"]) is Pair and out["none"] is None and out["n"] == 3
    for got, exp in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(got, exp)


def test_dataclass_output():
    c = compile_i(lambda x: Stats(x.mean(0), x.shape[0]))
    x = torch.randn(5, 2)
    out = c(x)
    assert type(out) is Stats and out.count == 5
    torch.testing.assert_close(out.mean, x.mean(0))


def test_keyword_arguments_and_defaults():
    def f(x, *, scale, bias=None, act="relu"):
        y = x * scale
        y = y if bias is None else y + bias
        return F.relu(y) if act == "relu" else torch.tanh(y)
    c = compile_i(f)
    x, s, b = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    torch.testing.assert_close(c(x, scale=s), f(x, scale=s))
    torch.testing.assert_close(c(x, scale=s, bias=b), f(x, scale=s, bias=b))
    torch.testing.assert_close(c(x, bias=b, scale=s, act="tanh"), f(x, scale=s, bias=b, act="tanh"))
    assert len(c.report().graphs) == 3


# ---- the CompiledModule wrapper --------------------------------------------------------------------

def test_compiled_module_forwards_to_the_model_but_is_not_one():
    model = mlp()
    c = compile_i(model)
    assert not isinstance(c, torch.nn.Module)
    assert c.training is True and c.eval() is c and c.training is False and model.training is False
    assert c.train() is c and model.training is True
    assert c.state_dict().keys() == model.state_dict().keys()
    assert [p for p in c.parameters()] == [p for p in model.parameters()]
    assert c.model is model and minicomp.compile(c).model is model  # recompiling unwraps
    assert repr(c).startswith("CompiledModule(Sequential(") and "interpret" in repr(c)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(c.forward(x), model(x))
    assert len(c.report().graphs) == 1, "compiled.forward is the compiled call"
    with pytest.raises(AttributeError):
        c.no_such_attribute


def test_a_compiled_module_deep_copies_and_pickles_as_its_model_and_options():
    """An EMA copy (copy.deepcopy) of a model holding a compiled part, before and after its first
    call: a new CompiledModule over a copy of the model, same options, compiling its own programs."""
    import copy
    import pickle
    holder = torch.nn.Module()
    holder.c = c = minicomp.compile(mlp(), backend="cpu", remat=False)
    x = torch.randn(2, 8)
    for _ in range(2):  # before and after the first call
        for twin in (copy.deepcopy(holder).c, pickle.loads(pickle.dumps(c))):
            assert isinstance(twin, type(c)) and twin.model is not c.model and twin.options == c.options
            assert all(torch.equal(p, q) for p, q in zip(twin.parameters(), c.parameters()))
            with torch.no_grad():
                torch.testing.assert_close(twin(x), c.model(x))
            assert twin.report() is not c.report()
        with torch.no_grad():
            c(x)


def test_compiling_a_plain_function_keeps_its_doc():
    def f(x):
        """Doubles."""
        return x * 2
    c = compile_i(f)
    assert c.__doc__ == "Doubles." and c.__wrapped__ is f and c.__name__ == "f"


def test_bad_arguments():
    with pytest.raises(ValueError) as e:
        minicomp.compile(torch.sin, backend="tpu")
    assert "'tpu'" in str(e.value) and all(b in str(e.value) for b in ("auto", "interpret", "cpu", "cuda"))
    with pytest.raises(TypeError, match="module or function"):
        minicomp.compile(3)
    for bad, message in ((dict(remat="yes"), "remat='yes': want True or False"),
                         (dict(max_programs=0), "max_programs=0: want an int >= 1")):
        with pytest.raises(ValueError, match=re.escape(message)):
            minicomp.compile(torch.sin, **bad)


def test_strict_names_the_unsupported_op_and_source_line():
    def f(x):
        return torch.cumsum(x, 0) * 2
    with pytest.raises(minicomp.UnsupportedOpError) as e:
        compile_i(f, strict=True)(torch.randn(4))
    assert "aten.cumsum" in str(e.value) and "test_api.py" in str(e.value) and "torch.cumsum(x, 0)" in str(e.value)


def test_unsupported_op_runs_as_extern_and_is_reported():
    c = compile_i(lambda x: torch.cumsum(x, 0) * 2)
    x = torch.randn(4)
    torch.testing.assert_close(c(x), torch.cumsum(x, 0) * 2)
    assert c.report().graphs[0].externs == ["aten.cumsum.default"]
    assert "externs: aten.cumsum.default" in str(c.report())


# ---- torch.compile(backend="minicomp") -------------------------------------------------------------

def test_torch_compile_backend_after_import():
    model = mlp()
    x = torch.randn(3, 8)
    c = torch.compile(model, backend="minicomp", options={"backend": "interpret"})
    torch.testing.assert_close(c(x), model(x))


def test_torch_compile_modes_and_unknown_options():
    """torch.compile passes `mode` to a backend (it takes mode or options, not both): each of its
    modes compiles; an option key minicomp does not have, or a mode torch does not, is named."""
    model, x = mlp(), torch.randn(3, 8)
    for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model, backend="minicomp", mode=mode)(x), model(x))
    from minicomp.compiler.capture import minicomp_backend
    gm = torch.fx.symbolic_trace(model)
    with pytest.raises(ValueError, match="unknown option\\(s\\) 'remmat'; the options are backend, debug, remat"):
        minicomp_backend(gm, [x], options={"remmat": False})
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        minicomp_backend(gm, [x], mode="fast")


def test_dynamo_backend_entry_point_is_installed():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert [e.value for e in eps if e.name == "minicomp"] == ["minicomp.compiler.capture:minicomp_backend"]


@pytest.mark.slow  # a fresh interpreter imports torch and Dynamo: ~10 s
def test_torch_compile_backend_without_importing_minicomp():
    script = textwrap.dedent("""
        import sys, torch
        model = torch.nn.Linear(4, 3)
        x = torch.randn(2, 4)
        c = torch.compile(model, backend="minicomp", options={"backend": "interpret"})
        torch.testing.assert_close(c(x), model(x))
        print("ok", "minicomp" in sys.modules)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMP_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "True"], "the entry point loaded minicomp"


# ---- debug output -----------------------------------------------------------------------------------

def test_debug_true_prints_one_summary_per_graph(capsys):
    assert_matches_eager(mlp(), torch.randn(2, 8, requires_grad=True), debug=True)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("minicomp: ")]
    assert len(lines) == 3  # the joint graph's cut, then the forward and backward it was cut into
    assert re.match(r"minicomp: joint_\d+ \[min-cut\]: saved_bytes=\d+", lines[0])
    assert re.match(r"minicomp: forward_\d+ \[forward, interpret\]: \d+ fx nodes -> \d+ IR nodes", lines[1])
    assert re.match(r"minicomp: backward_\d+ \[backward, interpret\]", lines[2])


def test_debug_level_2_from_the_environment_prints_ir_after_each_pass(capsys, monkeypatch):
    monkeypatch.setenv("MINICOMP_DEBUG", "2")
    c = compile_i(lambda x: torch.exp(x) + 1)
    c(torch.randn(3))
    err = capsys.readouterr().err
    for name, _ in TENSOR_PASSES:  # interpret runs the tensor passes, and only those
        assert f": ir_after_{name} ---" in err
    assert ": ir_after_fuse ---" not in err
    block = err.split(": ir_after_dce ---\n", 1)[1]
    graph = parse(block[:block.index("}\n") + 2])
    assert [n.op for n in graph.nodes] == ["exp", "full", "add"]


def _check_dump(folder, n_graphs, passes=TENSOR_PASSES):
    folders = sorted(os.listdir(folder))
    assert [g[:4] for g in folders] == [f"{i:03d}_" for i in range(len(folders))]
    graphs = [g for g in folders if "_joint_" not in g]  # a training graph's cut has a folder of its own
    assert len(graphs) == n_graphs
    for g in graphs:
        files = sorted(os.listdir(os.path.join(folder, g)))
        assert all(re.fullmatch(r"\d\d_\w+\.txt", f) for f in files), files
        stages = [f[3:-4] for f in files]
        want = ["fx", "ir"] + [f"ir_after_{name}" for name, _ in passes]
        assert [s for s in stages if s.startswith(("fx", "ir"))] == want, "fx, then the IR, then the IR after each pass, in order"
        for f in files:
            if f[3:].startswith("ir"):
                parse(open(os.path.join(folder, g, f)).read())
    return graphs


def test_debug_path_dumps_numbered_files_per_graph(tmp_path, capsys):
    assert_matches_eager(mlp(), torch.randn(2, 8, requires_grad=True), debug=str(tmp_path))
    graphs = _check_dump(tmp_path, 2)
    assert re.fullmatch(r"001_forward_\d+", graphs[0]) and re.fullmatch(r"002_backward_\d+", graphs[1])
    assert "class GraphModule" in (tmp_path / graphs[0] / "00_fx.txt").read_text()
    # the joint graph, the cut and the two graphs it was cut into
    joint, = [g for g in sorted(os.listdir(tmp_path)) if "_joint_" in g]
    assert joint.startswith("000_")
    stages = [f[3:-4] for f in sorted(os.listdir(tmp_path / joint))]
    assert stages == ["fx", "ir", "cut", "ir_forward", "ir_backward"]
    cut = (tmp_path / joint / "02_cut.txt").read_text()
    assert "saved (" in cut and "recomputed in backward:" in cut
    for f in ("01_ir.txt", "03_ir_forward.txt", "04_ir_backward.txt"):
        parse((tmp_path / joint / f).read_text())


def test_a_kernel_backend_dumps_exactly_the_kernel_pass_list(tmp_path):
    """The pipeline's list is what runs: a cpu compile dumps the IR after each kernel pass, in order."""
    c = minicomp.compile(lambda x: torch.cos(torch.cos(x)).sum(0), backend="cpu", debug=str(tmp_path))
    x = torch.randn(4, 3)
    torch.testing.assert_close(c(x), torch.cos(torch.cos(x)).sum(0))
    graph, = _check_dump(tmp_path, 1, KERNEL_PASSES)
    last, = [f for f in os.listdir(tmp_path / graph) if f.endswith("_ir_after_plan_memory.txt")]
    assert " = kernel " in (tmp_path / graph / last).read_text()


def test_dump_dir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_DUMP_DIR", str(tmp_path))
    c = compile_i(lambda x: x.sum(0))
    c(torch.randn(2, 3))
    c(torch.randn(4, 3))
    _check_dump(tmp_path, 2)


def test_report_reads_well():
    c = compile_i(mlp())
    with torch.no_grad():
        c(torch.randn(2, 8))
    text = str(c.report())
    assert text.splitlines()[0] == "minicomp report: 1 graph(s), 0 kernel(s)"
    assert re.fullmatch(r"  inference_\d+ \[inference, interpret\]: \d+ fx nodes -> \d+ IR nodes(, graph_cache=(hit|memo))?; "
                        r"compiled in [\d.]+ ms", text.splitlines()[1])


def test_compiles_log_to_the_minicomp_logger_with_progress_when_long(caplog, monkeypatch):
    import logging

    import minicomp.compiler.debug as debug
    monkeypatch.setattr(debug, "PROGRESS_AFTER_S", 0.0)  # every compile counts as long
    with caplog.at_level(logging.INFO, logger="minicomp"):
        compile_i(lambda x: torch.sin(x) + 1)(torch.randn(3))
    messages = [r.getMessage() for r in caplog.records if r.name == "minicomp"]
    assert any("compiling inference_" in m and "lowered to" in m for m in messages), messages
    assert any("passes done" in m for m in messages) and any("[inference, interpret]" in m for m in messages)
    # the record's logger name says minicomp: the message does not say it again ("minicomp:minicomp:")
    assert not any(m.startswith("minicomp") for m in messages), messages


def test_compiling_and_calling_adds_nothing_to_the_users_module():
    """CompiledModule keeps its own state on itself (CompiledModule._OWN); any other attribute it
    set would land on the user's module."""
    m = torch.nn.Linear(4, 4)
    before = set(vars(m))
    c = minicomp.compile(m, backend="cpu")
    for n in (2, 3, 5):  # static, then symbolic programs
        c(torch.randn(n, 4))
    assert set(vars(m)) == before
