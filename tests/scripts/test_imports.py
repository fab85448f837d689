"""scripts/: every module imports the others one way only, so that none needs another half-initialised (the
comparison runner, a rule of its runs and the renderer once imported each other)."""

import ast
from typing import Dict, List, Optional, Set

from conftest import REPO


def imports(path) -> Set[str]:
    """The modules of ``scripts`` that ``path`` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "scripts":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scripts."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("scripts."))
    return found - {path.stem}


def circle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """The first import circle of ``graph`` (module -> the modules it imports), as a path back to its start."""
    done: Set[str] = set()
    path: List[str] = []

    def visit(module: str) -> Optional[List[str]]:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        path.append(module)
        for other in sorted(graph.get(module, ())):
            found = visit(other)
            if found:
                return found
        path.pop()
        done.add(module)
        return None

    return next((found for found in map(visit, sorted(graph)) if found), None)


def test_no_module_of_scripts_imports_one_that_imports_it_back():
    graph = {path.stem: imports(path) for path in sorted((REPO / "scripts").glob("*.py"))}
    assert {"figures", "results_io"} <= graph["compare_runs"], "the scan missed compare_runs' imports"
    assert "compare_runs" in graph["render_results"], "the scan missed render_results' imports"
    found = circle(graph)
    assert found is None, "an import circle in scripts/: " + " -> ".join(found)


def test_the_scan_counts_package_and_function_level_imports_and_finds_a_circle(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("from scripts import c\n\n\ndef f():\n    from scripts.b import y\n")
    assert imports(path) == {"b", "c"}
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
