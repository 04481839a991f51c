"""Builds the sample notebooks from plain-Python cell lists, without outputs (run it after editing a cell):

    python samples/make_notebooks.py

Keeping the cells in Python (here, cells_kernels.py and cells_models.py) makes notebook changes
reviewable as ordinary diffs; tests/e2e/test_notebooks.py checks that the committed notebooks are
exactly what this writes (cell ids are numbered, not random, so a rebuild changes nothing).
"""
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the cell modules sit next to this file, also when a test loads it by path
    sys.path.insert(0, str(HERE))

from cells_kernels import COS_COS, NORMS_SOFTMAX, OVERHEAD  # noqa: E402
from cells_models import GPT_BLOCK, TRAINING_REMAT  # noqa: E402

EAGER_VS_COMPILED = [
    new_markdown_cell(
        "# Eager vs compiled\n\n"
        "`minicomp.compile` captures a model, lowers it into minicomp's IR, runs the passes and hands the\n"
        "result to a backend. This notebook prints that IR, checks the compiled model against eager\n"
        "PyTorch, times both and shows what the compiler did."),
    new_code_cell(
        "import os\n\n"
        "import torch\n"
        "import torch.nn.functional as F\n"
        "import matplotlib.pyplot as plt\n\n"
        "import minicomp\n"
        "from minicomp.timing import set_threads, time_interleaved\n"
        "from minicomp.models import Block\n\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'  # backend='auto' follows the inputs' device\n"
        "sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)\n"
        "QUICK = os.environ.get('MINICOMP_QUICK') == '1'  # fewer repetitions\n"
        "torch.manual_seed(0)\n"
        "set_threads()\n"
        "print('device:', device, '| quick:', QUICK)"),
    new_markdown_cell(
        "## The IR\n\n"
        "`debug=2` prints the IR after capture and after each pass (to stderr). A LayerNorm followed by\n"
        "GELU: the LayerNorm decomposes into a mean, a variance and pointwise arithmetic."),
    new_code_cell(
        "def layernorm_gelu(x, w, b):\n"
        "    return F.gelu(F.layer_norm(x, x.shape[-1:], w, b))\n\n"
        "x, w, b = (torch.randn(*s, device=device) for s in ((64, 256), (256,), (256,)))\n"
        "small = minicomp.compile(layernorm_gelu, debug=2)\n"
        "out = small(x, w, b)\n"
        "print('max abs error:', (out - layernorm_gelu(x, w, b)).abs().max().item())"),
    new_markdown_cell(
        "## A GPT block\n\n"
        "The demo's block (`python -m minicomp.demo`): LayerNorm, causal attention, GELU MLP, residuals.\n"
        "Compiled inference output against eager:"),
    new_code_cell(
        "B, T, C, H = 4, 64, 128, 4\n"
        "model = Block(C, H, T).to(device).eval()\n"
        "compiled = minicomp.compile(model)\n"
        "x = torch.randn(B, T, C, device=device)\n"
        "with torch.no_grad():\n"
        "    eager_out, compiled_out = model(x), compiled(x)\n"
        "print('max abs error:', (compiled_out - eager_out).abs().max().item())"),
    new_markdown_cell(
        "## Time per call\n\n"
        "Median of interleaved runs (eager and compiled take turns, so machine noise hits both alike)."),
    new_code_cell(
        "def infer(m):\n"
        "    with torch.no_grad():\n"
        "        return m(x)\n\n"
        "times = time_interleaved({'eager': lambda: infer(model), 'minicomp': lambda: infer(compiled)}, reps=5 if QUICK else 20,\n"
        "                         sync=sync)\n"
        "ms = {k: v * 1e3 for k, v in times.items()}\n"
        "plt.bar(list(ms), list(ms.values()), color=['tab:gray', 'tab:blue'])\n"
        "plt.ylabel('ms per call (median)')\n"
        "plt.title(f'GPT block B={B} T={T} C={C}, backend {compiled.report().graphs[0].backend}')\n"
        "plt.show()\n"
        "ms"),
    new_markdown_cell(
        "## What the compiler did\n\n"
        "Per graph: nodes before and after, ops that ran through torch (`externs`), compile time; per\n"
        "kernel (native backends): fused ops and bytes moved; and anything that ran eagerly, with why."),
    new_code_cell("print(compiled.report())"),
]


NOTEBOOKS = {  # file name -> cells
    "eager_vs_compiled.ipynb": EAGER_VS_COMPILED,
    "fusion_cos_cos.ipynb": COS_COS,
    "norms_softmax_roofline.ipynb": NORMS_SOFTMAX,
    "gpt_block.ipynb": GPT_BLOCK,
    "training_remat.ipynb": TRAINING_REMAT,
    "overhead.ipynb": OVERHEAD,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook `name`, without outputs, its cells numbered `<name>-<i>`."""
    stem = name.removesuffix(".ipynb")
    cells = [nbformat.from_dict({**cell, "id": f"{stem}-{i:02d}"}) for i, cell in enumerate(NOTEBOOKS[name])]
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    nbformat.validate(nb)
    return nb


def text(name: str) -> str:
    """The file the notebook `name` is written as."""
    s = nbformat.writes(build(name))
    return s if s.endswith("\n") else s + "\n"


def write(name: str) -> Path:
    path = HERE / name
    path.write_text(text(name))
    return path


if __name__ == "__main__":
    for name in NOTEBOOKS:
        print("wrote", write(name).name)
