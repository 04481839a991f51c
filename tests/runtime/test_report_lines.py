"""What the report says about a compiled callable's programs and about what ran eagerly: graph
breaks with the user's line, calls with nothing to compile, the mode each program was built for."""
from __future__ import annotations

import logging
import re

import torch

import minicomp


def compile_i(fn, **kw):
    return minicomp.compile(fn, backend="interpret", **kw)


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        if h.sum().item() > 0:  # data-dependent Python branch: a graph break
            return h.relu()
        return -h


def test_graph_break_gives_correct_results_and_is_reported(caplog):
    model = Gate()
    c = compile_i(model)
    pos = torch.ones(2, 4)
    with torch.no_grad():
        model.lin.bias.fill_(0)
        with caplog.at_level(logging.WARNING, logger="minicomp"):
            for x in (pos, -pos, pos, pos[:1]):  # the last is a new shape: a second program, same break
                torch.testing.assert_close(c(x), model(x))
    eager = c.report().eager
    assert len(eager) == 1 and "graph break" in eager[0] and "Tensor.item()" in eager[0], eager
    assert re.search(r"test_report_lines\.py:\d+ in forward `if h\.sum\(\)\.item\(\) > 0:", eager[0]), \
        "the user's line that broke the graph"
    assert "\n" not in eager[0], "one readable line, not Dynamo's page of hints"
    assert any("graph break" in r.getMessage() for r in caplog.records if r.name == "minicomp")
    assert "ran eagerly: graph break" in str(c.report())


def test_a_call_with_nothing_to_compile_is_reported():
    c = compile_i(lambda x: x)
    x = torch.randn(3)
    assert c(x) is x
    assert c.report().graphs == [] and "no graph captured" in c.report().eager[0]


def test_program_lines_name_the_mode_they_were_compiled_for():
    """train() and eval(), grad on and off, are parts of a program's signature: the report's
    program lines tell the programs apart."""
    m = minicomp.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1)), backend="cpu")
    x = torch.randn(2, 4)
    m(x)
    m.eval()
    m(x)
    with torch.no_grad():
        m(x)
    lines = m.report().programs
    assert len(lines) == 3 and len(set(lines)) == 3
    assert "eval mode" not in lines[0] and "in eval mode" in lines[1] and "under no_grad" in lines[2]
