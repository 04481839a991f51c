"""Sizes that change between calls: dynamic="auto" compiles static first and then one program with the
changing dimension symbolic; the outputs and gradients match eager at every size, the number of
programs is asserted, and the report names the symbolic dimensions."""
from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch

import minicomp
from minicomp.compiler.capture import make_backend
from minicomp.models import MLP, Block
from minicomp.options import Options
from minicomp.report import Report

LENGTHS = [7, 13, 2, 33, 5, 64, 19]  # not the blocks' 128, where Dynamo's own guard splits (models.py causal[:T, :T])


def _only_the_slice_guard(guards) -> bool:
    """The block's causal[:T] of its 128-row buffer is Min(128, T) (sizes are not 0/1-specialized): its
    one guard `T <= 128` is the one Dynamo itself makes when it decides that slice; minicomp's own
    decisions guard nothing."""
    return all(re.fullmatch(r"s\d+ <= 128", g) for g in guards)


def _graphs(c, kind=None):
    return [g for g in c.report().graphs if kind is None or g.kind == kind]


@pytest.mark.parametrize("backend", ["cpu", "interpret", "cuda_emu"])
def test_block_over_sequence_lengths_builds_two_programs(backend):
    torch.manual_seed(0)
    m = Block(32, 4, 128).eval()
    c = minicomp.compile(m, backend=backend)
    with torch.no_grad():
        for T in LENGTHS:
            x = torch.randn(2, T, 32)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    graphs = _graphs(c)
    assert len(graphs) == 2, [g.detail for g in graphs]  # the first size static, then one symbolic program
    assert graphs[0].detail.get("symbolic") is None
    symbolic = graphs[1].detail["symbolic"]
    assert len(symbolic) == 1 and re.fullmatch(r"\w+: f32\[2,s\d+,32\]", symbolic[0]), symbolic
    assert _only_the_slice_guard(graphs[1].detail["guards"]), graphs[1].detail["guards"]
    assert c.report().eager == []


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_batch_and_length_both_vary(backend):
    torch.manual_seed(0)
    m = MLP(16, 32).eval()
    c = minicomp.compile(m, backend=backend)
    with torch.no_grad():
        for shape in [(3, 5, 16), (4, 9, 16), (7, 2, 16), (2, 11, 16)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert len(_graphs(c)) == 2
    if backend == "cuda_emu":  # the symbolic program ran every later shape over one kernel library
        run = c.report().runs[-1]
        assert run.built == 3 and run.keepalive is not None


def test_dynamic_false_compiles_a_program_per_size():
    c = minicomp.compile(lambda x: torch.sin(x) * 2, backend="cpu", dynamic=False)
    for n in (3, 4, 5):
        x = torch.randn(n)
        torch.testing.assert_close(c(x), torch.sin(x) * 2)
    assert len(_graphs(c)) == 3


def test_dynamic_true_is_symbolic_from_the_first_call():
    c = minicomp.compile(lambda x: torch.softmax(x, -1), backend="cpu", dynamic=True)
    for n in (3, 4, 9):
        x = torch.randn(n, 2 * n + 1)
        torch.testing.assert_close(c(x), torch.softmax(x, -1))
    graphs = _graphs(c)
    assert len(graphs) == 1 and graphs[0].detail["symbolic"]


@pytest.mark.parametrize("dynamic", ["auto", True])
def test_keyword_and_scalar_arguments_get_a_symbolic_program_too(dynamic):
    """HF models are called with input_ids=..., attention_mask=...: keyword tensors (and scalars
    beside them) vary in size like positional ones, and get one symbolic program."""
    def f(x, y, scale=1.0):
        return (x * y).sum(-1) * scale
    c = minicomp.compile(f, backend="cpu", dynamic=dynamic)
    for n in range(2, 12):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        torch.testing.assert_close(c(x=x, y=y, scale=0.5), f(x, y, 0.5))
        torch.testing.assert_close(c(x, y, 2.0), f(x, y, 2.0))
    assert len(c.report().programs) == (4 if dynamic == "auto" else 2), c.report().programs
    assert not c.report().eager  # max_programs never reached
    assert all("symbolic in input 0 dim 0" in p for p in c.report().programs if "symbolic" in p)


def test_a_call_with_other_arguments_after_a_symbolic_program_compiles_its_own():
    c = minicomp.compile(lambda x, scale=1.0: x * scale, backend="cpu")
    c(torch.randn(2))
    c(torch.randn(3))  # a symbolic program for the tensors-only calls
    x = torch.randn(4)
    torch.testing.assert_close(c(x), x)
    torch.testing.assert_close(c(x, scale=2.0), x * 2.0)  # was a TypeError in the symbolic lookup
    torch.testing.assert_close(c(x, 3.0), x * 3.0)


def test_gradients_through_a_dynamic_program():
    torch.manual_seed(0)
    m = Block(32, 4, 64)
    ref = copy.deepcopy(m)
    c = minicomp.compile(m, backend="cpu")
    for T in (5, 9, 17, 3):
        x = torch.randn(2, T, 32)
        out, want = c(x), ref(x)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        out.square().mean().backward()
        want.square().mean().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
        m.zero_grad()
        ref.zero_grad()
    kinds = [(g.kind, bool(g.detail.get("symbolic"))) for g in _graphs(c)]
    assert kinds == [("forward", False), ("backward", False), ("forward", True), ("backward", True)]
    # both joint graphs, the symbolic one too, are cut by minicomp's min cut, not AOTAutograd's default
    parts = c.report().partitions
    assert len(parts) == 2 and c.report().eager == [] and parts[1].saved_bytes < parts[1].no_remat_bytes


def test_torch_compile_without_dynamic_false_runs_compiled():
    """torch.compile's own automatic dynamic: the second size makes a symbolic graph, which minicomp
    now compiles instead of handing back to torch."""
    report = Report()
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: torch.relu(x @ y + 1.0).sum(-1), backend=make_backend(Options.make("cpu"), report))
    for n in (4, 6, 11):
        x, y = torch.randn(n, 8), torch.randn(8, 3)
        torch.testing.assert_close(f(x, y), torch.relu(x @ y + 1.0).sum(-1))
    assert len(report.graphs) == 2 and report.graphs[1].detail["symbolic"] and report.eager == []


def test_a_new_size_reuses_the_machine_code():
    c = minicomp.compile(lambda x: torch.tanh(x) + x, backend="cpu")
    for n in (5, 6, 7, 8, 5):
        x = torch.randn(n, 3)
        torch.testing.assert_close(c(x), torch.tanh(x) + x)
    run = c.report().runs[-1]
    # 6, 7, 8 and 5 again (once the symbolic program is the one calls go to, it serves every size)
    assert run.built == 4 and len(c.report().graphs) == 2


def _convnet():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10))


ZOO = {  # model, input shape with None where the size varies
    "mlp": (lambda: MLP(16, 64), (None, 16)),
    "mixer": (lambda: __import__("minicomp.models", fromlist=["MixerBlock"]).MixerBlock(8, 16), (None, 8, 16)),
    "normstack": (lambda: __import__("minicomp.models", fromlist=["NormStack"]).NormStack(32, 2), (3, None, 32)),
    "block": (lambda: Block(32, 4, 128), (2, None, 32)),
    "convnet": (_convnet, (None, 3, 8, 8)),
}


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("train", [False, True])
def test_zoo_over_several_sizes_two_programs_and_no_guards_of_ours(name, train):
    torch.manual_seed(0)
    make, shape = ZOO[name]
    m = make().train(train)
    ref = copy.deepcopy(m)
    c = minicomp.compile(m, backend="cpu")
    for n in (3, 5, 9, 6):
        x = torch.randn(*[n if s is None else s for s in shape])
        if train:
            out, want = c(x), ref(x)
            out.sum().backward()
            want.sum().backward()
            for p, q in zip(m.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            for b1, b2 in zip(m.buffers(), ref.buffers()):  # batch norm's running statistics
                torch.testing.assert_close(b1, b2, rtol=1e-5, atol=1e-6)
            m.zero_grad()
            ref.zero_grad()
        else:
            with torch.no_grad():
                out, want = c(x), ref(x)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    graphs = _graphs(c)
    per_program = 2 if train else 1  # a forward and a backward graph each
    assert len(graphs) == 2 * per_program, [(g.kind, g.detail.get("symbolic")) for g in graphs]
    assert all(_only_the_slice_guard(g.detail.get("guards")) for g in graphs[per_program:]), \
        [g.detail.get("guards") for g in graphs]
    assert all(g.detail.get("symbolic") for g in graphs[per_program:])


@pytest.mark.parametrize("backend", ["cpu", "interpret", "cuda_emu"])
def test_means_and_variances_over_a_symbolic_dimension_count_at_run_time(backend):
    """The count a mean divides by is the call's size, not the size the program was compiled at."""
    def f(x):
        return x.mean(0), x.var(0), torch.nn.functional.layer_norm(x.t(), (x.shape[0],)), x.sum(0) / x.shape[0]
    c = minicomp.compile(f, backend=backend)
    for n in (3, 4, 11, 6, 29):
        x = torch.randn(n, 5)
        for got, want in zip(c(x), f(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(_graphs(c)) == 2


def _stats(x):
    return torch.softmax(x, -1) * 2, x.var(0), x.mean(0), x.sum(0) / (x.shape[0] + 1)


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
@pytest.mark.parametrize("make", [lambda: _stats, lambda: MLP(5, 16).eval()], ids=["stats", "mlp"])
def test_sizes_zero_and_one_run_in_the_symbolic_program(backend, make):
    """Symbolic programs are not 0/1-specialized: sizes 1 and 0 after the second size run in the one
    symbolic program (a var over one row is NaN as in eager, a mean over none too), no third program."""
    fn = make()
    c = minicomp.compile(fn, backend=backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's "degrees of freedom is <= 0" for the var over one row
        for n in (5, 9, 1, 0, 3, 1, 2):
            x = torch.randn(n, 5)
            got, want = c(x), fn(x)
            got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
    graphs = _graphs(c)
    assert len(graphs) == 2 and graphs[1].detail["guards"] == [], [g.detail.get("guards") for g in graphs]
    assert c.report().eager == []


def test_gradients_at_sizes_one_and_zero_through_the_symbolic_program():
    m = MLP(5, 16)
    ref = copy.deepcopy(m)
    c = minicomp.compile(m, backend="cpu")
    for n in (4, 7, 1, 0, 3):
        x = torch.randn(n, 5)
        c(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
        m.zero_grad()
        ref.zero_grad()
    assert len(_graphs(c)) == 4  # a forward and a backward graph for the static and the symbolic program


def test_a_models_own_branch_on_size_one_recompiles_and_the_report_names_it():
    """Code that branches on a size being 1 (HF attention's `q_length > 1`) makes Dynamo guard the
    symbolic program; a size-1 call then builds one more graph, and the report names the guard."""
    def f(x):
        return x * 2 if x.shape[0] > 1 else x + 1
    c = minicomp.compile(f, backend="cpu")
    for n in (3, 4, 1, 5, 1):
        x = torch.randn(n, 3)
        torch.testing.assert_close(c(x), f(x))
    report = c.report()
    assert len(report.graphs) == 3 and len(report.programs) == 2
    assert len(report.recompiles) == 1 and report.recompiles[0].startswith("program 2 recompiled by Dynamo")
    assert "x.shape[0] > 1" in report.recompiles[0] and report.recompiles[0] in str(report)


def test_report_says_which_dimensions_are_symbolic_and_why_each_program_was_built():
    c = minicomp.compile(lambda x: torch.softmax(x, -1), backend="cpu")
    for n in (3, 4, 9):
        c(torch.randn(n, 5))
    text = str(c.report())
    assert "program 1: static, for the call (f32[3, 5])" in text
    assert "program 2: symbolic in argument 0 dim 0" in text and "first call (f32[4, 5])" in text
    assert re.search(r"sizes of inference_\d+: symbolic inputs \w+: f32\[s\d+,5\]; guards: none added by minicomp; "
                     r"2 size\(s\) run so far", text), text


DATA_DEPENDENT = {  # name: (function, inputs, what the report's graph break names)
    "item_as_start": (lambda x, i: torch.narrow(x, 0, i.item(), 2) * 2, lambda k: (torch.randn(6, 3), torch.tensor(k)),
                      "Tensor.item()"),
    "item_as_size": (lambda x, n: x[: n.item()] * 2, lambda k: (torch.randn(6), torch.tensor(k + 1)), "Tensor.item()"),
    "boolean_mask": (lambda x: x[x > 0].sum() + 1, lambda k: (torch.randn(6 + k),), "nonzero"),
    "nonzero": (lambda x: torch.nonzero(x > 0).float().sum(0) * 3, lambda k: (torch.randn(5 + k, 2),), "nonzero"),
}


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT))
def test_data_dependent_sizes_are_a_graph_break_the_report_names(name):
    """A size only the data knows cuts the function at a graph break: the code around it runs in
    torch, what follows is compiled, and the report names the break; never silently all in torch."""
    fn, make, named = DATA_DEPENDENT[name]
    c = minicomp.compile(fn, backend="cpu")
    for k in (1, 2, 3):
        args = make(k)
        torch.testing.assert_close(c(*args), fn(*args))
    report = c.report()
    assert report.graphs, "the code after the break is compiled"
    assert any("graph break" in e and named in e for e in report.eager), report.eager


def test_hf_gpt2_over_sequence_lengths_two_programs():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=100, n_positions=256)
    m = transformers.GPT2Model(cfg).eval()

    def f(ids):
        return m(ids).last_hidden_state
    c = minicomp.compile(f, backend="cpu")
    with torch.no_grad():
        for T in (37, 5, 200, 2, 64, 129, 18):
            ids = torch.randint(0, 100, (2, T))
            torch.testing.assert_close(c(ids), f(ids), rtol=1e-4, atol=1e-5)
    graphs = _graphs(c)
    assert len(graphs) == 2 and graphs[1].detail["symbolic"] and graphs[1].detail["guards"] == []


def test_hf_model_called_with_keyword_tensors_over_lengths_two_programs():
    """The way HF models are called: the module itself, input_ids= and attention_mask= as keywords."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=100, n_positions=256)
    m = transformers.GPT2Model(cfg).eval()
    c = minicomp.compile(m, backend="cpu")
    with torch.no_grad():
        for T in (37, 5, 200, 2, 64, 18):
            ids, mask = torch.randint(0, 100, (2, T)), torch.ones(2, T, dtype=torch.long)
            mask[1, : T // 3] = 0  # left padding in the second row
            want = m(input_ids=ids, attention_mask=mask).last_hidden_state
            torch.testing.assert_close(c(input_ids=ids, attention_mask=mask).last_hidden_state, want,
                                       rtol=1e-4, atol=1e-5)
    assert len(c.report().programs) == 2, c.report().programs
    assert "symbolic in input 0 dim 1, input 1 dim 1" in c.report().programs[1]
    assert not c.report().eager


NEGATIVE_INDEX = {  # a negative index into a dimension that varies: T - 1, not -1 (nor (-1) % T truncated)
    "last_token_softmax": lambda x: torch.softmax(x[:, -1, :] / 0.8, dim=-1),
    "select_last": lambda x: x[:, -1] * 1,
    "select_last_row": lambda x: x[-1] * 1,
    "view_of_last": lambda x: x[:, -2],
    "narrow_from_end": lambda x: x.narrow(1, -3, 2) + 1,
}


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
@pytest.mark.parametrize("dynamic", ["auto", True])
@pytest.mark.parametrize("name", sorted(NEGATIVE_INDEX))
def test_a_negative_index_into_a_symbolic_dimension_counts_from_its_end(name, dynamic, backend):
    fn = NEGATIVE_INDEX[name]
    compiled = minicomp.compile(fn, backend=backend, dynamic=dynamic)
    for t in (5, 7, 9):
        x = torch.randn(3, t, 6, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        got, want = compiled(x), fn(xe)
        torch.testing.assert_close(got, want)
        g = torch.randn_like(want)
        got.backward(g)  # the backward is a select_scatter at the same index
        want.backward(g)
        torch.testing.assert_close(x.grad, xe.grad)


INPUT_VIEWS = {  # an output that views an input at an offset the sizes decide
    "middle_row": lambda x: x[x.shape[0] // 2],
    "narrow": lambda x: x.narrow(0, x.shape[0] // 2, 1),
    "tail": lambda x: x[x.shape[0] // 2:],
    "column": lambda x: x[:, x.shape[1] // 2],
}


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
@pytest.mark.parametrize("dynamic", ["auto", True])
@pytest.mark.parametrize("name", sorted(INPUT_VIEWS))
def test_an_output_viewing_an_input_at_a_symbolic_offset(name, dynamic, backend):
    """AOTAutograd rebuilds such an alias from what the program returned (as_strided, when a view
    took a symbolic argument): a fresh copy made x[T // 2] row 0. The view is now the graph's own
    view of the caller's tensor (compiler/input_views.py)."""
    fn = INPUT_VIEWS[name]
    compiled = minicomp.compile(fn, backend=backend, dynamic=dynamic)
    for n in (4, 6, 9):
        x = torch.arange(n * 5.).view(n, 5)
        got, want = compiled(x), fn(x)
        assert torch.equal(got, want) and got.stride() == want.stride() and got.data_ptr() == want.data_ptr()


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_an_updated_input_and_a_view_of_it_over_sizes(backend):
    def fn(x, w):
        x.mul_(2)
        return x[x.shape[0] // 2], (x * w).sum(0)
    compiled = minicomp.compile(fn, backend=backend)
    for n in (4, 6, 9):
        x, w = torch.randn(n, 5), torch.randn(n, 5, requires_grad=True)
        xe, we = x.clone(), w.detach().clone().requires_grad_()
        got, want = compiled(x, w), fn(xe, we)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, xe)  # the caller's tensor updated as eager updates it
        got[1].sum().backward()
        want[1].sum().backward()
        torch.testing.assert_close(w.grad, we.grad)


def test_dynamic_true_leaves_no_mark_on_the_callers_tensor():
    """dynamic=True marks the call's dims dynamic for its compile only: a later compile of another
    callable with dynamic=False, on the same tensor, builds a static program."""
    x = torch.arange(35.).view(5, 7)
    x._dynamo_weak_dynamic_indices = {1}  # a mark of the caller's own stays as it was
    minicomp.compile(lambda t: t[t.shape[0] // 2] * 2, backend="cpu", dynamic=True)(x)
    assert x._dynamo_weak_dynamic_indices == {1}
    del x._dynamo_weak_dynamic_indices
    minicomp.compile(lambda t: t * 3, backend="cpu", dynamic=True)(x)
    assert not hasattr(x, "_dynamo_weak_dynamic_indices")
    static = minicomp.compile(lambda t: t[t.shape[0] // 2] + 1, backend="cpu", dynamic=False)
    torch.testing.assert_close(static(x), x[2] + 1)
    assert "static" in str(static.report().programs[-1])


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_flip_and_a_descending_arange_over_a_symbolic_dimension(backend):
    """A reversed index starts at T - 1: an iota with a symbolic start (it was taken for a float)."""
    fns = [lambda x: x.flip(0), lambda x: x.flip(0, 1) * 2,
           lambda x: x + torch.arange(x.shape[0] - 1, -1, -1).unsqueeze(1)]
    for fn in fns:
        compiled = minicomp.compile(fn, backend=backend)
        for n in (6, 2, 9, 1):
            x = torch.randn(n, 6)
            torch.testing.assert_close(compiled(x), fn(x))


def test_where_no_symbolic_program_can_be_built_each_size_gets_a_static_one():
    """x[T - 2:]: torch leaves the slice's size unbacked over varying T, which minicomp refuses; the
    calls keep running compiled, one static program per size, and the report says why."""
    fn = lambda x: x[x.shape[0] - 2:] * 2  # noqa: E731
    compiled = minicomp.compile(fn, backend="cpu")
    for n in (6, 3, 9, 4):
        x = torch.randn(n, 6)
        torch.testing.assert_close(compiled(x), fn(x))
    programs = compiled.report().programs
    assert len(programs) == 4 and all(p.startswith("static") for p in programs)
    assert "no program over varying sizes" in programs[1] and "data-dependent" in programs[1]
    assert not compiled.report().eager


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_the_backward_of_slices_over_a_symbolic_dimension_lowers_without_externs(backend):
    """A slice's backward is a slice_scatter at the slice's bounds, symbolic here: it lowered
    through Python's slice.indices (a TypeError on a symbolic size) and ran as an extern."""
    fns = [lambda x: (x[:, : x.shape[1] // 2] * 2).sum(), lambda x: (x[:, 1:] ** 2).sum(),
           lambda x: x[:, 1: x.shape[1] - 1].sin().sum(), lambda x: (x[:, ::2] * 3).sum()]
    for fn in fns:
        compiled = minicomp.compile(fn, backend=backend)
        for n in (6, 7, 9):
            x = torch.randn(5, n, requires_grad=True)
            xe = x.detach().clone().requires_grad_()
            compiled(x).backward()
            fn(xe).backward()
            torch.testing.assert_close(x.grad, xe.grad)
        assert not [e for g in compiled.report().graphs for e in g.externs if "slice_scatter" in e]
