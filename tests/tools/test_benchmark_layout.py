"""The layout of ``benchmarks/``: its modules import one another one way only (no circle, imports inside functions
included), and no file grows past 400 lines."""

import ast
from pathlib import Path

from conftest import REPO

BENCHMARKS = sorted((Path(REPO) / "benchmarks").glob("*.py"))


def imports(path: Path) -> set:
    """The ``benchmarks.*`` modules that ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            found |= {f"benchmarks.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("benchmarks.")}
    return found


def test_no_import_circles():
    graph = {f"benchmarks.{p.stem}": imports(p) for p in BENCHMARKS}
    assert all(target in graph for targets in graph.values() for target in targets), graph
    done, path = set(), []

    def visit(module):
        assert module not in path, " -> ".join(path[path.index(module) :] + [module])
        if module not in done:
            path.append(module)
            for target in sorted(graph[module]):
                visit(target)
            path.pop()
            done.add(module)

    for module in graph:
        visit(module)


def test_no_file_is_longer_than_400_lines():
    assert {p.name: n for p in BENCHMARKS if (n := len(p.read_text().splitlines())) > 400} == {}
