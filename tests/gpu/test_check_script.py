"""The first-GPU script's own logic, every day, without a GPU: tests/gpu/check.py on cuda_emu with
--quick runs the zoo (three compared calls each, forward and gradients) and the benchmark table."""
import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check.py")


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="cuda_emu needs g++")
def test_check_script_on_cuda_emu():
    proc = subprocess.run([sys.executable, SCRIPT, "--backend", "cuda_emu", "--quick"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    for head in ("3 calls vs eager", "host us graphs", "host us no graphs", "% copy", "replay B/call", "max abs err"):
        assert head in out, f"the table lost its {head!r} column"
    assert "0 zoo failure(s), 0 wrong bench case(s)" in out
    assert out.count(" ok\n") + out.rstrip().endswith(" ok") >= 16, "a zoo model is missing from the table"
