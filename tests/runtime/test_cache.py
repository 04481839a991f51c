"""The disk cache (runtime/cache.py): bounded in size, least recently used dropped first, keyed by
versions and the CPU, cleared from the command line, one warning when it cannot be written, and
two processes compiling into one folder at once."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import torch

from minicomp import cache as cache_cli
from minicomp.runtime import cache, llvm_jit
from tests.runtime.test_cpu_runtime import _CHILD, _compile_and_check


def test_the_folder_stays_under_its_limit_dropping_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MINICOMP_CACHE_MAX_MB", str(10 * 1024 / (1 << 20)))  # 10 KiB
    for i in range(4):
        cache.put("t", f"k{i}", bytes(2000))
        os.utime(tmp_path / "t" / f"k{i}", (time.time() - 100 + i,) * 2)
    assert cache.get("t", "k0") is not None  # used now: the newest
    cache.put("t", "k4", bytes(4000))  # 12 KiB > 10: drop the oldest down to 8 KiB
    left = sorted(os.listdir(tmp_path / "t"))
    assert "k0" in left and "k4" in left and "k1" not in left
    assert sum(size for _, size, _ in cache.entries()) <= 8 * 1024


def test_clear_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    _compile_and_check(torch.randn(4, 33))
    assert cache.entries()
    cache_cli.main([])
    assert "entries" in capsys.readouterr().out
    cache_cli.main(["--clear"])
    assert "cleared" in capsys.readouterr().out and cache.entries() == []


def test_an_unwritable_folder_compiles_with_one_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("no folder can be made under a file")
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(cache, "_warned", [])
    with caplog.at_level(logging.WARNING, logger="minicomp"):
        assert _compile_and_check(torch.randn(8, 33)) is False
        assert _compile_and_check(torch.randn(8, 33)) is False
    warnings = [r for r in caplog.records if "cannot write the compile cache" in r.getMessage()]
    assert len(warnings) == 1


def test_object_code_of_another_cpu_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    x = torch.randn(8, 33)
    _compile_and_check(x)
    assert _compile_and_check(x) is True
    name, features = llvm_jit._host()
    monkeypatch.setattr(llvm_jit, "_host", lambda: (name, features.replace("+avx2", "-avx2") + ",+minicomp-test"))
    assert _compile_and_check(x) is False  # another key: compiled again, not loaded


def test_graphs_of_another_torch_version_are_not_used():
    from minicomp.compiler import graph_cache
    import torch.fx as fx
    gm = fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    x = torch.randn(3)
    k = graph_cache.graph_key(gm, [x], False)
    real = torch.__version__
    try:
        torch.__version__ = real + "+other"
        assert graph_cache.graph_key(gm, [x], False) != k
    finally:
        torch.__version__ = real


def test_two_processes_compile_into_one_folder_at_once(tmp_path):
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(tmp_path))
    children = [subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for c in children:
        out, err = c.communicate(timeout=300)
        assert c.returncode == 0, err[-2000:]
    third = subprocess.run([sys.executable, "-c", _CHILD, "flipped"], env=env, capture_output=True, text=True,
                           timeout=300)
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.stdout.split() == ["flipped", "False", "True"]  # a whole entry was there to corrupt


def test_writes_do_not_walk_the_folder_each_time(monkeypatch, tmp_path):
    """A write used to scan every entry for the size bound (0.4 s a write with 16k files): the folder
    is scanned on the first write, when the running estimate passes the bound, and every
    RESCAN_PUTS writes; the bound still holds."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MINICOMP_CACHE_MAX_MB", str(64 * 1024 / (1 << 20)))  # 64 KiB
    scans = []
    real = cache.entries
    monkeypatch.setattr(cache, "entries", lambda: scans.append(1) or real())
    for i in range(100):
        cache.put("obj", f"k{i}", b"x" * 100)  # 13 KiB in all: under the bound
    assert len(scans) == 1
    for i in range(100):
        cache.put("obj", f"big{i}", b"y" * 4096)  # 400 KiB: the bound evicts
    total = sum(size for _, size, _ in real())
    assert total <= 64 * 1024 and len(scans) < 60
