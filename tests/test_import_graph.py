"""The package's files import one another in one direction: no circle, counting the imports inside
functions too (a deferred import hides a circle from Python, not from a reader)."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_tfm"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The package's modules `path` imports: `from a.b import c` counts as `a.b.c` where that is a module,
    else as `a.b`; a package's `__init__` is not counted as importing its own files."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                found.add(whole if whole in modules else node.module)
    return {name for name in found if name in modules}


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                return path[path.index(other) :] + [other]
            if other not in state and (found := visit(other)):
                return found
        state[name] = 2
        path.pop()
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


@pytest.mark.backend_independent
def test_no_file_of_the_package_imports_one_that_imports_it_back():
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(files)
    graph = {
        name: {other for other in imported_modules(path, modules) if not name.startswith(other + ".")} - {name}
        for name, path in files.items()
        if not path.name == "__init__.py"
    }
    graph = {name: {other for other in imports if other in graph} for name, imports in graph.items()}
    assert circle(graph) is None, " -> ".join(circle(graph))
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one
