"""What verifies, runs as `interpret` says: fused graphs (the golden graphs through every pass) with
one line of a kernel body or of the graph changed at random -- a number, a loop variable, an op, an
operand, a dtype, an index wrapped in a modulus or division -- and each mutant that parses and
verifies built by the CPU backend and run against `interpret` on the same inputs. A mutant the
verifier takes is a graph the compiler promises to run: a store that skips an element, a load past
its buffer, an attribute of the wrong kind once verified here and ran to garbage or a crash.
Mutants with seeds fixed, so a failure prints the mutant to read.
"""
from __future__ import annotations

import pathlib
import random
import re

import pytest
import torch

from minicomp.backends import build
from minicomp.compiler.capture import make_context
from minicomp.compiler.pipeline import run_passes
from minicomp.errors import MinicompError
from minicomp.ir import ParseError, VerifyError, interpret, parse, sym, verify
from minicomp.options import Options
from tests.passes.check import random_inputs

GOLDEN = pathlib.Path(__file__).parent / "golden"
NUM = re.compile(r"(?<![\w.])\d+(?![\w.])")
LOOP_VAR = re.compile(r"\bi\d\b")
OPS = ("add", "sub", "mul", "maximum", "minimum", "div", "exp", "neg", "abs", "sum", "amax", "prod")


def fused_texts() -> list:
    out = []
    for f in sorted(GOLDEN.glob("*.ir")):
        g = parse(f.read_text())
        ctx = make_context(Options.make("cpu"), g.name, "cpu")
        with sym.scope(g.sizes):
            out.append(str(run_passes(g, ctx)))
    return out


def mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    body = [i for i, ln in enumerate(lines) if re.match(r"\s+(t\d+|r\d+|b\d+\[)", ln)] or list(range(1, len(lines)))
    i = rng.choice(body)
    ln, k = lines[i], rng.randrange(6)
    if k == 0 and NUM.search(ln):
        a, b = rng.choice([m.span() for m in NUM.finditer(ln)])
        ln = ln[:a] + str(rng.choice([0, 1, 2, 3, 7, 16, int(ln[a:b]) + 1, max(0, int(ln[a:b]) - 1)])) + ln[b:]
    elif k == 1 and LOOP_VAR.search(ln):
        ln = re.sub(rf"\b{rng.choice(LOOP_VAR.findall(ln))}\b", rng.choice(["i0", "i1", "i2"]), ln, count=1)
    elif k == 2 and re.search(r"= (\w+) ", ln):
        m = re.search(r"= (\w+) ", ln)
        ln = ln[:m.start(1)] + rng.choice(OPS) + ln[m.end(1):]
    elif k == 3 and len(re.findall(r"\bt\d+\b", ln)) > 1:
        ln = ln.replace(rng.choice(re.findall(r"\bt\d+\b", ln)[1:]), f"t{rng.randrange(12)}", 1)
    elif k == 4 and re.search(r": (f32|i64|b8) =", ln):
        m = re.search(r": (f32|i64|b8) =", ln)
        ln = ln[:m.start(1)] + rng.choice(["f32", "f64", "f16", "i64", "i32", "b8"]) + ln[m.end(1):]
    elif re.search(r"\[(.+)\]", ln):
        m = re.search(r"\[(.+)\]", ln)
        ln = ln[:m.start(1)] + f"(({m.group(1)}) {rng.choice(['%', '//'])} {rng.choice([2, 3, 4, 16])})" + ln[m.end(1):]
    lines[i] = ln
    return "\n".join(lines) + "\n"


def agree(got, want) -> bool:
    """Equal for integers; for floats, within 1e-4 of the largest finite magnitude where both are
    finite (a mutant may compute a variance that rounds to either side of zero: its rsqrt is NaN in
    one order of summation, not the other)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not want.is_floating_point():
        return torch.equal(got, want)
    both = torch.isfinite(got) & torch.isfinite(want)
    scale = max(1.0, want[both].abs().max().item()) if both.any() else 1.0
    tol = {torch.float16: 2e-2, torch.bfloat16: 5e-2}.get(want.dtype, 1e-4) * scale
    return bool(((got - want)[both].abs() <= tol).all())


@pytest.mark.parametrize("seed", range(8))
def test_a_mutant_that_verifies_builds_and_runs_as_interpret_says(seed):
    rng = random.Random(seed)
    texts = fused_texts()
    built = 0
    for _ in range(60):
        text = mutate(rng.choice(texts), rng)
        try:
            g = verify(parse(text))
        except (ParseError, VerifyError, MinicompError):
            continue
        ins = random_inputs(g, seed=seed)
        try:
            want = interpret(g, *ins)
        except (RuntimeError, IndexError, ZeroDivisionError):  # torch refused a mutated extern's operands
            continue
        run, _ = build(g, make_context(Options.make("cpu"), g.name, "cpu"), "cpu")
        got = run(*ins)
        got = got if isinstance(got, (tuple, list)) else (got,)
        bad = [i for i, (o, w) in enumerate(zip(got, want)) if w is not None and not agree(o, w)]
        assert not bad, f"mutant differs from interpret at outputs {bad}:\n{text}"
        built += 1
    assert built >= 10, f"only {built} of 60 mutants verified: the mutator no longer makes runnable graphs"
