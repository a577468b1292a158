"""The predict package's modules import one way: records at the bottom, the public call on top.

Every ``from .x import`` / ``from . import x`` in the package counts, lazy ones inside functions
and those under ``TYPE_CHECKING`` too (issue 50: ``_api`` <-> ``_parallel`` <-> ``_records`` was a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import proftune.predict

PACKAGE = Path(proftune.predict.__file__).parent


def sibling_imports() -> dict[str, set[str]]:
    """Module name -> the sibling modules it imports, anywhere in its source."""
    names = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    targets.add(node.module.split(".")[0])
                else:
                    targets.update(a.name for a in node.names)
        graph[path.stem] = {t for t in targets if t in names and t != path.stem}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports (its modules in order, the first repeated at the end), or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_the_package_has_no_circle_of_imports() -> None:
    graph = sibling_imports()
    assert {"_api", "_parallel", "_records"} <= set(graph)
    assert find_cycle(graph) == []


def test_records_sit_at_the_bottom() -> None:
    assert sibling_imports()["_records"] == set()


def test_the_check_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
