"""A bounded run of the differential fuzzer (minicomp/fuzz.py) in CI: random programs of every op
family and dtype, NaN/Inf/huge/tiny values, a third of them training, compiled on `cpu` and
`cuda_emu` and compared with eager. The long run is `python -m minicomp.fuzz --examples N`."""
from __future__ import annotations

import logging

import pytest
import torch

from minicomp import fuzz

CPU_SEEDS = [*range(0, 40), 104795]  # + seeds the long run flagged
EMU_SEEDS = range(0, 20)
# found by the fuzzer and not fixed yet: (backend, seed) -> why, a strict xfail until it passes.
# Fixed ones stay as regression tests in the seed ranges (cuda_emu 12: a variance of a keepdim amax
# over a size-1 dim feeding a where -- a reduction with no loop the CUDA generator took for pointwise)
KNOWN: dict = {("cpu", 104795): "f16 cos(tanh(x) * 10) of a bf16 logsumexp cast to f16, fused: 0.06 from "
                                 "eager (the same chain on an f16 input matches eager exactly); not yet explained"}


def _params():
    for backend, seeds in (("cpu", CPU_SEEDS), ("cuda_emu", EMU_SEEDS)):
        for s in seeds:
            marks = [pytest.mark.xfail(strict=True, reason=KNOWN[(backend, s)])] if (backend, s) in KNOWN else []
            yield pytest.param(backend, s, marks=marks, id=f"{backend}-{s}")


@pytest.mark.parametrize("backend, seed", list(_params()))
def test_fuzz_program_matches_eager(backend, seed):
    log = logging.getLogger("minicomp")
    level = log.level
    log.setLevel(logging.ERROR)  # internal-lowering warnings are not findings; later tests read warnings
    try:
        torch._dynamo.reset()
        outcome, src, why = fuzz.run_one(seed, backend)
    finally:
        log.setLevel(level)
    assert outcome in ("ok", "skip"), f"{outcome}: {why}\n{src}"


def test_generator_draws_what_it_promises():
    """The programs cover the families the fuzzer claims (so a passing run means something), and few
    are invalid (skipped)."""
    programs = [fuzz.Generator(s, s % 3 == 0).program() for s in range(200)]
    text = "\n".join(src for src, _ in programs)
    for needle in (" @ ", "torch.cat", "torch.gather", "index_select", ".sum(", ".amax(", "torch.where",
                   ".permute(", "torch.float16", "torch.bfloat16"):
        assert needle in text, f"no program in 200 uses {needle}"
    floats = [t for _, xs in programs for t in xs if t.is_floating_point()]
    for what, pred in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf),
                       ("huge", lambda t: t.abs() == 1e30), ("tiny", lambda t: (t.abs() > 0) & (t.abs() < 1e-20))):
        assert any(pred(t.double()).any() for t in floats), f"no input in 200 programs holds a {what} value"
    assert any(not t.is_contiguous() for _, xs in programs for t in xs), "no non-contiguous input"
    assert any(t.numel() == 0 or t.ndim == 0 for _, xs in programs for t in xs), "no empty or 0-d input"
    skipped = sum(fuzz.run_one(s, "interpret")[0] == "skip" for s in range(0, 30))
    assert skipped <= 3


def test_tolerance_follows_the_coarsest_float_type_computed_in():
    """An f64 result of f32 math carries f32 rounding (seeds 101983 and 102640 of the long run were
    flagged at f64's tolerance for 1 ulp of float32); a pure f64 error is still caught at f64's."""
    for seed in (101983, 102640):
        assert fuzz.run_one(seed, "cpu")[0] == "ok"
    want = [torch.tensor([1.0], dtype=torch.float64)]
    off = [torch.tensor([1.0 + 1e-7], dtype=torch.float64)]
    assert fuzz.compare(off, want, "output") is not None
    assert fuzz.compare(off, want, "output", coarsest=fuzz.TOL["f32"]) is None

