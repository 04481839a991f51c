"""Kernels in the IR text: a fused graph prints each kernel's body under its node, `parse` reads it
back into equal Kernels, `interpret` runs the parsed graph to eager's results, and the verifier
rejects broken bodies with the kernel and line named.

The end-to-end cases swap the backend's build step for one that prints the graph after the last
pass, parses the text and runs *that* through `interpret`: the compiled callable then is the text,
compared with eager (outputs and, for training, the gradients through the backward graph's text).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minicomp import backends
from minicomp.ir import ParseError, VerifyError, interpret, parse, prepare, round_trip, sym, verify
from minicomp.ir.index import Expr, Var
from minicomp.ir.kernel import KExpr, Reduction, walk
from minicomp.models import Block
from tests.helpers import assert_matches_eager
from tests.passes.test_fuse import SOFTMAX, compile_text

# ---- structural equality of kernels, independent of the printer ------------------------------------


def _same_expr(a: Expr, b: Expr, pair) -> bool:
    if a.const != b.const or len(a.terms) != len(b.terms):
        return False
    bt = list(b.terms)
    for atom, c in a.terms:  # Expr orders loaded values by object id: match them up in any order
        hit = next((i for i, (atom2, c2) in enumerate(bt) if c == c2 and _same_atom(atom, atom2, pair)), None)
        if hit is None:
            return False
        bt.pop(hit)
    return True


def _same_atom(a, b, pair) -> bool:
    if isinstance(a, Var) or isinstance(b, Var):
        return isinstance(a, Var) and isinstance(b, Var) and (a.name, a.size) == (b.name, b.size)
    if a.kind != b.kind:
        return False
    if a.kind == "data":
        return pair(a.c, b.c)
    return a.c == b.c and _same_expr(a.expr, b.expr, pair)


def same_kernel(k1, k2) -> bool:
    """Every field the code generators read, compared value by value (KExprs and reductions as DAGs)."""
    memo = {}

    def pair(x, y):
        if (id(x), id(y)) in memo:
            return memo[id(x), id(y)]
        memo[id(x), id(y)] = True  # DAGs; an assumption checked by the rest of the comparison
        if isinstance(x, Reduction):
            ok = isinstance(y, Reduction) and (x.op, x.dtype, x.stage) == (y.op, y.dtype, y.stage) and pair(x.value, y.value)
        elif isinstance(x, KExpr):
            ok = (isinstance(y, KExpr) and (x.op, x.dtype, len(x.args)) == (y.op, y.dtype, len(y.args))
                  and all(pair(a, b) for a, b in zip(x.args, y.args)) and set(x.attrs) == set(y.attrs)
                  and all(same_attr(x.attrs[k], y.attrs[k]) for k in x.attrs))
        else:
            ok = False
        memo[id(x), id(y)] = ok
        return ok

    def same_attr(u, v):
        if isinstance(u, Expr):
            return isinstance(v, Expr) and _same_expr(u, v, pair)
        if isinstance(u, (KExpr, Reduction)):
            return pair(u, v)
        if isinstance(u, float) and u != u:
            return isinstance(v, float) and v != v
        return type(u) is type(v) and u == v

    def stores(s1, s2):
        return len(s1) == len(s2) and all(a.buf == b.buf and _same_expr(a.index, b.index, pair) and pair(a.value, b.value)
                                          for a, b in zip(s1, s2))
    return ([(v.name, v.size) for v in k1.outer + k1.inner] == [(v.name, v.size) for v in k2.outer + k2.inner]
            and len(k1.outer) == len(k2.outer) and k1.name == k2.name
            and [(b.name, b.dtype, b.numel, b.node.type) for b in k1.buffers]
            == [(b.name, b.dtype, b.numel, b.node.type) for b in k2.buffers]
            and [len(st) for st in k1.stages] == [len(st) for st in k2.stages]
            and all(pair(r1, r2) for s1, s2 in zip(k1.stages, k2.stages) for r1, r2 in zip(s1, s2))
            and stores(k1.inner_stores, k2.inner_stores) and stores(k1.outer_stores, k2.outer_stores)
            and (k1.ops, k1.reads, k1.writes, k1.flops, k1.bytes_read, k1.bytes_written, k1.comment)
            == (k2.ops, k2.reads, k2.writes, k2.flops, k2.bytes_read, k2.bytes_written, k2.comment))


# ---- the backend's build step, replaced by the graph's text run through interpret ----------------------


@pytest.fixture
def from_text(monkeypatch):
    """Every compiled graph runs as its post-pass text, parsed, under `interpret`; returns the texts."""
    texts = []

    def build(graph, ctx, backend):
        text = str(graph)
        parsed = verify(parse(text))
        assert str(parsed) == text
        round_trip(graph)
        knodes = [(a, b) for a, b in zip(graph.nodes, parsed.nodes) if a.op == "kernel"]
        for a, b in knodes:
            assert a.meta["io"] == b.meta["io"]
            assert same_kernel(a.meta["kernel"], b.meta["kernel"]), f"kernel {a.attrs['name']} reads back differently"
        texts.append(text)
        return prepare(parsed), {}
    monkeypatch.setattr(backends, "build", build)
    return texts


def run_from_text(texts, fn, *inputs, backend="cpu", **kw):
    assert_matches_eager(fn, *inputs, backend=backend, **kw)
    assert texts and all("= kernel" in t for t in texts), "every graph has kernels, printed with their bodies"
    assert all(" {\n    domain (" in t for t in texts)
    return texts


def test_gpt_block_inference_text_runs_to_eager(from_text):
    block = Block(64, 4, 32).eval()
    with torch.no_grad():
        texts = run_from_text(from_text, block, torch.randn(2, 32, 64), grad=False)
    assert len(texts) == 1 and texts[0].count("= kernel") >= 4


def test_gpt_block_training_texts_run_to_eager(from_text):
    """Forward and backward graphs, each printed after the last pass, parsed and interpreted: the
    gradients eager computes come out of the backward graph's text."""
    texts = run_from_text(from_text, Block(64, 4, 32), torch.randn(2, 32, 64, requires_grad=True))
    assert len(texts) == 2 and "stage 0:" in texts[1]


CASES = {
    "pointwise": (lambda x: torch.cos(torch.cos(x)) * 2 + 1, [torch.randn(4, 5)]),
    "softmax": (lambda x: F.softmax(x, -1), [torch.randn(8, 16)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (32,), w, b), [torch.randn(4, 8, 32), torch.randn(32), torch.randn(32)]),
    "split_sum": (lambda x: (x * x).sum(), [torch.randn(512, 256)]),
    "split_columns": (lambda x: x.exp().sum(0), [torch.randn(4096, 8)]),
    "views": (lambda x, y: x.t()[1:5] * y.reshape(4, 1, 6).permute(1, 0, 2).reshape(4, 6), [torch.randn(6, 8), torch.randn(24)]),
    "gather": (lambda x, i: torch.gather(x, 1, i) + 1, [torch.randn(4, 8), torch.randint(0, 8, (4, 3))]),
    "index": (lambda x, i, j: x[i, j] * 2, [torch.randn(6, 7), torch.randint(0, 6, (5,)), torch.randint(0, 7, (5,))]),
    "embedding": (lambda w, i: F.embedding(i, w).relu(), [torch.randn(10, 4), torch.randint(0, 10, (3, 5))]),
    "cat": (lambda x, y: torch.cat([x.sin(), y], 1).exp(), [torch.randn(3, 4), torch.randn(3, 2)]),
    "casts": (lambda x: (x.to(torch.float16) * 3).to(torch.int32).to(torch.float64), [torch.randn(16) * 10]),
    "f16": (lambda x: F.gelu(x) + x.amax(-1, keepdim=True), [torch.randn(4, 8).half()]),
    "bf16": (lambda x: torch.tanh(x) * x, [torch.randn(4, 8).bfloat16()]),
    "int": (lambda a, b: (a // b) + a % b - a.argmax(-1, keepdim=True), [torch.randint(-9, 9, (4, 6)),
                                                                           torch.randint(1, 5, (4, 6))]),
    "bool": (lambda x: ((x > 0) & (x < 1)) | (x == x.amax(0)), [torch.randn(5, 3)]),
    "constants": (lambda x: torch.where(x > 0, torch.full_like(x, float("nan")), x).clamp(max=float("inf"))
                  + torch.where(x < -1, float("-inf"), 0.5), [torch.randn(6, 4)]),
    "iota": (lambda x: x + torch.arange(6, dtype=torch.float32) * 0.5 + torch.arange(6), [torch.randn(2, 6)]),
}


# what each case's text must show: the kernel feature it is there for
FEATURES = {
    "pointwise": ["= cos t"], "softmax": ["stage 1:", "inner stores:"], "layer_norm": ["= rsqrt t", "stage 1:"],
    "split_sum": ['name="k1"', "r0: f32 = sum t"], "split_columns": ["domain (i1: 8) x [i0: 4096]"],
    "views": ["load b0[8*i0 + i1 + 1]"],  # eager's result is transposed: written so, x read along its rows
    "gather": ["clamp_index", "data(t"], "index": ["// 7", "% 7", "data(t"],
    "embedding": ["data(t"], "cat": ["[guard=t"], "casts": ["[dtype=f16]", "[dtype=i32]", "[dtype=f64]"],
    "f16": ["f16 = load", "r0: f16 = amax"], "bf16": ["bf16 = load", "[dtype=bf16]", "bf16 = mul"], "int": ["[where=", "r0: i64 = argmax"],
    "bool": ["b8 = bitwise_and", "b8 = eq", "b8[15] = out 0"], "constants": ["const nan", "const inf", "const -inf", "const 0.5"],
    "iota": ["i64 = index i1", "cast"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_graph_text_runs_to_eager(case, from_text):
    fn, inputs = CASES[case]
    text = run_from_text(from_text, fn, *inputs)[-1]
    missing = [f for f in FEATURES[case] if f not in text]
    assert not missing, f"{case}: {missing} not in\n{text}"


def test_cuda_emu_graph_text_runs_to_eager(from_text):
    """The CUDA backends fuse with another flops-per-byte balance: their graphs read back too."""
    fn, inputs = CASES["layer_norm"]
    run_from_text(from_text, fn, *inputs, backend="cuda_emu")


def test_loaded_indices_print_stably():
    """Two gathers in one index (x[i, j]): printed in one order whatever their object ids."""
    texts = set()
    for _ in range(3):
        g, _ = compile_text("""graph f(%x: f32[6,7], %i: i64[5], %j: i64[5]) -> (f32[5]) {
  %0: f32[5,7] = index_select %x %i [dim=0]
  %1: i64[5,1] = reshape %j [shape=(5, 1)]
  %2: f32[5,1] = gather %0 %1 [dim=1]
  %3: f32[5] = reshape %2 [shape=(5,)]
  return %3
}
""")
        texts.add(str(g))
        assert str(parse(str(g))) == str(g)
    assert len(texts) == 1 and "load b2[7*data(t1) + data(t3)]" in texts.pop()


# ---- the verifier on hand-broken kernel text --------------------------------------------------------

FUSED = str(compile_text(SOFTMAX)[0])


def broken(old: str, new: str) -> str:
    assert old in FUSED, old
    return FUSED.replace(old, new, 1)


def line_of(text: str, needle: str) -> int:
    return next(i + 1 for i, ln in enumerate(text.splitlines()) if needle in ln)


def test_fused_text_verifies_and_interprets():
    g = verify(parse(FUSED))
    x = torch.randn(8, 16)
    torch.testing.assert_close(interpret(g, x)[0], F.softmax(x, -1))


@pytest.mark.parametrize("old, new, message", [
    ("t2: f32 = sub t0 t1", "t2: f16 = sub t0 t1", "sub of f32, f32 gives f32, not f16"),
    ("t5: f32 = div t3 t4", "t5: b8 = div t3 t4", "div of f32, f32 gives f32, not b8"),
    ("t3: f32 = exp t2", "t3: f32 = bitwise_not t2", "bitwise_not does not take f32 operands"),
    ("t3: f32 = exp t2", "t3: f32 = gather t2", "'gather' is not a pointwise op"),
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f32 = load b5[16*i0 + i1]", "load of b5, which the kernel does not have"),
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f16 = load b0[16*i0 + i1]", "load of f32 buffer b0 typed f16"),
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f32 = load b0[16*i0 + i1 + 1]", "load index reaches [1, 128]"),
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f32 = load b1[16*i0 + i1]", "load of b1, a buffer the kernel writes"),
    ("b1[16*i0 + i1] = t5", "b0[16*i0 + i1] = t5", "store to b0, which is not a result buffer"),
    ("    stage 1:\n", "", "accumulator of a reduction that is not finished by an earlier stage"),
    ("inner stores:", "outer stores:", "index uses i1, outside the outer loops"),
    ("      b1[16*i0 + i1] = t5\n", "", "result buffer b1 is never stored"),
    ("t4: f32 = acc r1", "t4: f16 = acc r1", "accumulator typed f16 of a f32 reduction"),
    ("r1: f32 = sum t3", "r1: i64 = sum t3", "sum of f32 gives f32, not i64"),
    ("bytes=1024", "bytes=1000", "attribute bytes=1000, but its kernel says 1024"),
    ('domain="8 x [16]"', 'domain="8x16"', "attribute domain='8x16', but its kernel says '8 x [16]'"),
    # an index with divisions or moduli: its divisors, and its value at the loops' corners (exact there)
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f32 = load b0[16*i0 + ((i1) // 0)]", "index divides by 0"),
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f32 = load b0[16*i0 + ((i1) % 0)]", "index takes a modulus by 0"),
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f32 = load b0[16*i0 + ((i1 + 16) % 32)]",
     "load index is 143 at i0=7, i1=15, outside the buffer's 128 elements"),
    ("b1[16*i0 + i1] = t5", "b1[16*((i0 + 1) % 9) + i1] = t5", "store index is 143 at i0=7, i1=15"),
    # ... whose extremes need not lie at the loops' corners: (i1 + 3) % 17 peaks at i1 = 13
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f32 = load b0[16*i0 + ((i1 + 3) % 17)]",
     "load index is 128 at i0=7, i1=13, outside the buffer's 128 elements"),
    # the stores of a result write each element once: one skipped keeps whatever memory held
    ("b1[16*i0 + i1] = t5", "b1[8*i0 + i1] = t5", "element 8 of b1 is written 2 times by its stores"),
    ("b1[16*i0 + i1] = t5", "b1[16*i0 + ((i1) // 2)] = t5", "element 0 of b1 is written 2 times by its stores"),
])
def test_verifier_rejects_broken_kernel_text(old, new, message):
    text = broken(old, new)
    g = parse(text)
    with pytest.raises(VerifyError) as err:
        verify(g)
    msg = str(err.value)
    assert message in msg and "kernel k0" in msg, msg
    quoted = msg.split("`")[1] if "`" in msg else None
    if quoted:  # the line named is the line quoted, in the graph as printed (what a dump file holds)
        assert f"line {line_of(str(g), quoted)}:" in msg, msg


@pytest.mark.parametrize("old, new, message", [
    ("t5: f32 = div t3 t4", "t5: f32 = div t3 t9", "line 17: t9 is used before it is defined"),
    ("t0: f32 = load b0[16*i0 + i1]", "t0: f32 = load b0[16*j0 + i1]", "'j0', which is not one of the kernel's loop"),
    ("t1: f32 = acc r0", "t1: f32 = acc r3", "acc of 'r3', which is no reduction defined before it"),
    ("b1: f32[128] = out 0", "b1: f32[128] = %y", "buffer %y is not an operand of the kernel"),
    ("  }\n", "", "the kernel's body has no closing brace"),
    ("t2: f32 = sub t0 t1", "t2: f32 = sub t0 t1 [dims=", "line 12: unexpected"),
    ("t2: f32 = sub t0 t1", "t2: f32 = sub t0 t1 x", "line 12: x is used before it is defined"),
])
def test_parser_rejects_broken_kernel_text(old, new, message):
    with pytest.raises(ParseError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse(broken(old, new))


def test_an_index_that_regroups_its_loops_is_in_range():
    """16*(i0 // 2) + 8*(i0 % 2) + i1 is 8*i0 + i1 (an unravel put back): bounds over ranges would
    put its top at 16*3 + 8 + 7 = 63 and refuse it; the corners are exact, and it reads b0 whole."""
    text = FUSED.replace("16*i0 + i1]", "16*((i0) // 2) + 8*((i0) % 2) + i1]", 1).replace(
        "(i0: 8)", "(i0: 16)").replace("[i1: 16]", "[i1: 8]").replace('"8 x [16]"', '"16 x [8]"')
    text = text.replace("16*i0 + i1] = t5", "8*i0 + i1] = t5")
    g = verify(parse(text))
    x = torch.randn(8, 16)
    torch.testing.assert_close(interpret(g, x)[0], F.softmax(x.reshape(16, 8), -1).reshape(8, 16))


def test_a_store_that_permutes_its_buffer_verifies():
    """Rows written rotated by one (16*((i0 + 1) % 8) + i1): every element exactly once, so the
    cover check takes it, though no affine bound could tell."""
    g = verify(parse(broken("b1[16*i0 + i1] = t5", "b1[16*((i0 + 1) % 8) + i1] = t5")))
    x = torch.randn(8, 16)
    torch.testing.assert_close(interpret(g, x)[0], F.softmax(x, -1).roll(1, 0))


def test_an_index_over_sizes_is_checked_at_the_sizes_it_runs_at():
    """16*i0 + i1 + (s0 - 2) stays inside x's 16*s0 elements at s0 = 2, so no range over sizes can
    refuse it; at the hint this compile runs at (s0 = 6) it reads element 99 of 96."""
    text = SOFTMAX.replace("f32[8,", "f32[s0,").replace("{\n", "{\n  sizes s0 in 2.. hint 6\n", 1)
    g = parse(text)
    with sym.scope(g.sizes):
        fused = str(compile_text(text)[0])
    assert "load b0[16*i0 + i1]" in fused
    verify(parse(fused))
    bad = parse(fused.replace("load b0[16*i0 + i1]", "load b0[16*i0 + i1 + {s0 - 2}]"))
    with pytest.raises(VerifyError, match="load index is 99 at i0=5, i1=15, outside the buffer's 96 elements"):
        verify(bad)


def test_verifier_names_the_line_after_earlier_kernels():
    """Line numbers count the bodies printed above: the second kernel's error points into its own body."""
    g, _ = compile_text("""graph f(%x: f32[8,16], %w: f32[16,16]) -> (f32[8,16]) {
  %0: f32[8,16] = exp %x
  %1: f32[8,16] = mm %0 %w
  %2: f32[8,16] = cos %1
  return %2
}
""")
    text = str(g)
    assert text.count("= kernel") == 2
    bad = text.replace("t1: f32 = cos t0", "t1: f64 = cos t0")
    with pytest.raises(VerifyError, match=f"line {line_of(bad, 't1: f64 = cos t0')}: kernel k1: `t1: f64 = cos t0`"):
        verify(parse(bad))


def rename_loop(k, name: str) -> None:
    """Kernel k's first outer loop renamed wherever it appears (a Var never changes: a new one takes
    its place in the loops, the loads' and index ops' expressions and the stores)."""
    old = k.outer[0]
    sub = {old.name: Var(name, old.size)}
    k.outer = (sub[old.name],) + tuple(k.outer[1:])
    stores = k.inner_stores + k.outer_stores
    for e in walk([r.value for st in k.stages for r in st] + [s.value for s in stores]):
        for a in ("index", "expr"):
            if isinstance(e.attrs.get(a), Expr):
                e.attrs[a] = e.attrs[a].substitute(sub)
    for s in stores:
        s.index = s.index.substitute(sub)


def test_var_never_changes():
    """Vars are shared between kernels (ir/index.py's memo): none changes, and a copy is a new one."""
    import copy
    import pickle
    v = Var("i0", 8)
    with pytest.raises(AttributeError, match="never changes"):
        v.name = "i 0"
    e = Expr.of(v) * 3 + 1
    for c in (pickle.loads(pickle.dumps(e)), copy.deepcopy(e)):
        assert c.key() == e.key() and c.terms[0][0] is not v and c.terms[0][0].size == 8


def test_round_trip_names_the_first_line_that_differs():
    g = parse(FUSED)
    g.nodes[0].meta["kernel"].flops += 1
    round_trip(g)  # prints and reads back the same: flops are text
    rename_loop(g.nodes[0].meta["kernel"], "i 0")
    with pytest.raises(VerifyError, match="does not parse back|reads back as"):
        round_trip(g)


def test_hand_written_names_read_back_renumbered():
    """The text's own names bind (a hand edit need not keep the printer's numbering); printed, they
    come out numbered in order again."""
    text = FUSED.replace("t5", "t50").replace("r1", "r9")
    assert "t50: f32 = div" in text and str(verify(parse(text))) == FUSED


def test_pass_driver_checks_the_round_trip(monkeypatch):
    """With verify on, a pass whose result prints a text that does not read back stops the compile."""
    from minicomp.compiler import pipeline

    def rename(graph, ctx):  # still a valid kernel, but `i 0` is no name the text can carry
        for n in graph.nodes:
            if n.op == "kernel":
                rename_loop(n.meta["kernel"], "i 0")
        return graph
    monkeypatch.setattr(pipeline, "KERNEL_PASSES", pipeline.KERNEL_PASSES + [("rename_loop", rename)])
    with pytest.raises(VerifyError, match="graph softmax: its text does not parse back"):
        compile_text(SOFTMAX)
