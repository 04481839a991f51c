"""The sample notebooks: each runs top to bottom in quick mode (MINICOMP_QUICK=1) on a kernel of this
very Python (a kernel spec made for the test, so a `python3` kernel installed elsewhere cannot stand
in), and each committed .ipynb is exactly what samples/make_notebooks.py writes: no outputs, and no
notebook edited without its cells (or the other way round)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402  (comes with nbclient)
from jupyter_client.manager import KernelManager  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
NOTEBOOKS = sorted(p.name for p in SAMPLES.glob("*.ipynb"))
KERNEL = "minicomp-test"
CELL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    """A kernel spec folder holding one spec: this interpreter, in quick mode."""
    root = tmp_path_factory.mktemp("kernels")
    spec = root / KERNEL
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "minicomp test (this Python)", "language": "python",
        "env": {"MINICOMP_QUICK": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline"},
    }))
    return str(root)


@pytest.fixture
def generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", SAMPLES / "make_notebooks.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    return maker


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 6, NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, kernel_dir, tmp_path):
    nb = nbformat.read(str(SAMPLES / name), as_version=4)
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernel_dir]))
    client = nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=False,
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{name}: a cell failed\n{err}", pytrace=False)
    finally:  # a client given its kernel manager leaves the kernel running: a process with torch loaded
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "quick: True" in printed, f"{name} did not run in quick mode"
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, f"{name} drew no plot"


def test_committed_notebooks_are_what_the_generator_writes(generator):
    assert sorted(generator.NOTEBOOKS) == NOTEBOOKS, "a notebook in samples/ without cells in make_notebooks.py, " \
                                                     "or the other way round"
    stale = [n for n in NOTEBOOKS if (SAMPLES / n).read_text() != generator.text(n)]
    assert not stale, f"{stale} differ from make_notebooks.py's cells: edit the cells, then " \
                      "`python samples/make_notebooks.py` (never the .ipynb alone)"
