"""The package's layout holds: no import circle anywhere, and imports go one way between the stages.

Every module of minicomp (the demo, the benchmark, explain, roofline and fuzz included) is parsed,
and every import in it counts, the ones inside functions too: a circle that only closes when a
function runs is still a circle. Importing `a.b.c` runs the packages `a.b` on the way, so a module
depends on the `__init__` of each package it imports from (except its own packages: those are
already running when it is imported). Imports under `if TYPE_CHECKING:` never run and do not count.

The stages (DESIGN.md): ir <- codegen; runtime loads artifacts only; backends put codegen and
runtime together; the compiler drives the backends, never the other way round.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "minicomp"

# package -> the packages and modules of ours its modules may import (besides their own package)
ALLOWED = {
    "minicomp.ir": {"minicomp.errors"},
    "minicomp.codegen": {"minicomp.ir", "minicomp.errors"},
    "minicomp.runtime": {"minicomp.options", "minicomp.errors"},
    "minicomp.backends": {"minicomp.ir", "minicomp.codegen", "minicomp.runtime", "minicomp.options",
                          "minicomp.report", "minicomp.errors"},
    "minicomp.options": set(),
    "minicomp.errors": set(),
}


def _modules() -> dict:
    """{module name: path} of every module of minicomp."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str, modules: dict) -> bool:
    return modules[name].name == "__init__.py"


def _type_checking(test) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, modules: dict) -> set:
    """The modules of ours `name` imports, anywhere in its file, with the packages on their way."""
    tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    found = set()
    skipped = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _type_checking(block.test)
               for stmt in block.body for n in ast.walk(stmt)}  # never runs
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}  # `from pkg import submodule`
    ours = set()
    for target in found:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):  # the packages on the way, and the module itself
            prefix = ".".join(parts[:i])
            if prefix in modules and not (name == prefix or name.startswith(prefix + ".")):
                ours.add(prefix)
    return ours


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, modules) for name in modules}


def test_the_module_list_covers_the_tools_and_the_backends():
    names = set(_modules())
    assert {"minicomp.demo", "minicomp.bench", "minicomp.bench_cases", "minicomp.bench_train", "minicomp.explain",
            "minicomp.explain_save", "minicomp.roofline", "minicomp.fuzz", "minicomp.backends",
            "minicomp.backends.interpret", "minicomp.backends.cpu", "minicomp.backends.cuda",
            "minicomp.backends.cuda_emu"} <= names
    graph = _graph()
    assert "minicomp.backends.cuda" in graph["minicomp.backends.cuda_emu"]
    assert "minicomp.models" in graph["minicomp.bench_cases"]  # an edge the parser must see, as a check of it


def test_no_import_circles():
    graph = _graph()
    state: dict = {}  # name -> 1 while on the path, 2 once done
    path: list = []

    def visit(n):
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + [m]))
            if m not in state:
                visit(m)
        path.pop()
        state[n] = 2
    for n in sorted(graph):
        if n not in state:
            visit(n)


def _stage(name: str):
    for stage in sorted(ALLOWED, key=len, reverse=True):
        if name == stage or name.startswith(stage + "."):
            return stage
    return None


def test_imports_go_one_way_between_the_stages():
    bad = []
    for name, deps in _graph().items():
        stage = _stage(name)
        if stage is None:
            continue
        for d in deps:
            if _stage(d) != stage and not any(d == a or d.startswith(a + ".") for a in ALLOWED[stage]):
                bad.append(f"{name} imports {d}")
    assert not bad, "\n".join(sorted(bad))


def test_the_compiler_reaches_code_generation_and_runtimes_through_the_backends():
    """What turns a graph into a callable lives in minicomp.backends: no module of the compiler
    imports a code generator's module or a runtime but the graph cache (which stores lowered graphs
    in the runtime's disk cache)."""
    graph = _graph()
    reach = {name: sorted(d for d in deps if _stage(d) in ("minicomp.runtime", "minicomp.codegen"))
             for name, deps in graph.items() if name.startswith("minicomp.compiler")}
    assert {n: d for n, d in reach.items() if d} == {
        "minicomp.compiler.graph_cache": ["minicomp.runtime", "minicomp.runtime.cache"]}
    assert "minicomp.backends" in graph["minicomp.compiler.capture"]
