"""Builds the sample notebooks from the cells below, without outputs (run it after editing a cell):

    python samples/make_notebooks.py

Keeping the cells here, in plain Python, makes notebook changes reviewable as ordinary diffs.
"""
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

EAGER_VS_COMPILED = [
    new_markdown_cell(
        "# Eager vs compiled\n\n"
        "`minicomp.compile` captures a model, lowers it into minicomp's IR, runs the passes and hands the\n"
        "result to a backend. This notebook prints that IR, checks the compiled model against eager\n"
        "PyTorch, times both and shows what the compiler did."),
    new_code_cell(
        "import torch\n"
        "import torch.nn.functional as F\n"
        "import matplotlib.pyplot as plt\n\n"
        "import minicomp\n"
        "from minicomp.timing import set_threads, time_interleaved\n"
        "from minicomp.models import Block\n\n"
        "torch.manual_seed(0)\n"
        "set_threads()"),
    new_markdown_cell(
        "## The IR\n\n"
        "`debug=2` prints the IR after capture and after each pass (to stderr). A LayerNorm followed by\n"
        "GELU: the LayerNorm decomposes into a mean, a variance and pointwise arithmetic."),
    new_code_cell(
        "def layernorm_gelu(x, w, b):\n"
        "    return F.gelu(F.layer_norm(x, x.shape[-1:], w, b))\n\n"
        "x, w, b = torch.randn(64, 256), torch.randn(256), torch.randn(256)\n"
        "small = minicomp.compile(layernorm_gelu, debug=2)\n"
        "out = small(x, w, b)\n"
        "print('max abs error:', (out - layernorm_gelu(x, w, b)).abs().max().item())"),
    new_markdown_cell(
        "## A GPT block\n\n"
        "The demo's block (`python -m minicomp.demo`): LayerNorm, causal attention, GELU MLP, residuals.\n"
        "Compiled inference output against eager:"),
    new_code_cell(
        "B, T, C, H = 4, 64, 128, 4\n"
        "model = Block(C, H, T).eval()\n"
        "compiled = minicomp.compile(model)\n"
        "x = torch.randn(B, T, C)\n"
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
        "times = time_interleaved({'eager': lambda: infer(model), 'minicomp': lambda: infer(compiled)}, reps=20)\n"
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


def write(name: str, cells) -> Path:
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    nbformat.validate(nb)
    path = HERE / name
    nbformat.write(nb, str(path))
    return path


if __name__ == "__main__":
    print("wrote", write("eager_vs_compiled.ipynb", EAGER_VS_COMPILED).name)
