"""The layering of proftune's subpackages, read from the source with ``ast``.

A *unit* is a subpackage (``proftune.search``) or a top-level module (``proftune.task``,
``proftune._device``). Every import between units counts, the ones inside functions too (a lazy
import is still a dependency; it only delays the cost). Two rules:

1. **Layers.** A unit imports only units of a lower layer in :data:`LAYERS` (bottom first), so
   there is no circle between units. A unit of the same layer is not imported either: two units
   side by side do not know each other.
2. **Public names only.** From another subpackage or a public top-level module (``task``,
   ``train``, ``metrics``, ``exceptions``), a module imports only names its ``__all__`` lists, and
   never one of its private modules (``proftune.compress._measure``). A private top-level module
   (``_device.py``, ``_paths.py``, ``_api.py``, ...) is shared infrastructure: any unit above it
   may import its names that do not start with ``_``.

3. **No circle of files inside a unit.** Inside one subpackage the modules import in one
   direction too (records at the bottom, what uses them above): the imports between its files,
   lazy and type-only ones included, form no circle, unless the import line's comment says why it
   must stay (``# circle: <why>``). :data:`KNOWN_CIRCLES` names the units still being restructured.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "proftune"

#: Bottom first. A unit imports only units of the layers below its own.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    {"exceptions", "_deprecated", "_callable"},  # errors; former names, callable subpackages
    {"_registry"},  # the one way a kind of part is pluggable: named entries, plug-ins by entry point
    # shared infrastructure: paths, devices, tensors, JSON, the metric registry
    {"_paths", "_optional", "_device", "_tensors", "_jsonsafe", "_cpplog", "_optimizers", "_with_options",
     "_records", "metrics", "_report_writers"},
    {"_units"},  # quantities as people write them, and back (a number through _jsonsafe's finite_float)
    {"_threads", "_machine"},  # the CPU thread count from measured steps (reads _records); memory and cores
    {"task"},  # the Task and its loader, with the registry that examples/ and integrations/ fill
    {"_fit_state", "_step", "_schedule", "_train_params"},  # the fit loop's parts: its callbacks' state and
    # result; one optimizer step; a task's learning-rate schedule and when the loop steps it; a training's
    # params, validated once where they are made
    {"_thread_control"},  # the fit loop's CPU threads, a callback
    {"train", "examples", "_usercode"},  # the fit loop; the built-in tasks; where user code failed (reads task)
    {"track"},  # the Store
    {"profile"},  # measurements
    {"predict"},  # models of cost: a step's memory and time predicted, the memory model
    {"recommend"},  # decisions from measurements
    {"diagnose"},  # health checks, controllers, the bandit (reads recommend's LR range test)
    {"integrations"},  # adapters of Lightning, Hugging Face, bare modules; their callbacks
    {"_holdout", "_api", "search", "compress"},
    {"optimize"},  # the loop over all of it
    {"script"},  # a training script as it is: its flags searched, each trial one process of it
    {"report"},  # renders every result kind, read back through its record (CompressResult, OptimizeResult)
    {"cli"},
    {"__main__"},  # python -m proftune: the console script
    {"proftune"},  # the package's __init__: the curated public API
))


@dataclass(frozen=True)
class Import:
    """One import between two units: where it is, what it imports."""

    where: str  # "path:line"
    source: str  # the importing unit
    target: str  # the imported unit
    module: str  # the imported module, dotted
    names: tuple[str, ...]  # the names imported from it (empty for ``import a.b``)


def _module_name(path: Path, src: Path = SRC) -> list[str]:
    parts = ["proftune", *path.relative_to(src).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _unit(parts: list[str]) -> str:
    return parts[1] if len(parts) > 1 else "proftune"


def _is_module(parts: list[str], src: Path = SRC) -> bool:
    rel = Path(*parts[1:]) if len(parts) > 1 else Path()
    return (src / rel).with_suffix(".py").is_file() or (src / rel / "__init__.py").is_file()


_BY_NAME = {"import_module", "find_spec", "__import__"}


def _named_by_importlib(node: ast.AST) -> str | None:
    """The module a call ``importlib.import_module("proftune.x")`` (``find_spec``, ``__import__``)
    names by a literal string: a lower unit that reaches a higher one so is importing it."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return node.args[0].value if name in _BY_NAME else None


def _imports(src: Path = SRC) -> Iterator[Import]:
    """Every import of a proftune module in the package at ``src``, lazy ones included."""
    for path in sorted(src.rglob("*.py")):
        here = _module_name(path, src)
        package = here if path.name == "__init__.py" else here[:-1]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            where = f"{path.relative_to(src.parent)}:{getattr(node, 'lineno', 0)}"
            named = _named_by_importlib(node)
            if named is not None and named.split(".")[0] == "proftune":  # an import all the same
                yield Import(where, _unit(here), _unit(named.split(".")), named, ())
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "proftune":
                        yield Import(where, _unit(here), _unit(parts), alias.name, ())
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    parts = base + (node.module.split(".") if node.module else [])
                else:
                    parts = (node.module or "").split(".")
                if parts[0] != "proftune":
                    continue
                names = tuple(a.name for a in node.names)
                if len(parts) == 1:  # from proftune import task, search: each name is a unit
                    for name in names:
                        target = ["proftune", name]
                        yield Import(where, _unit(here), _unit(target) if _is_module(target, src) else "proftune",
                                     ".".join(target), ())
                    continue
                for name in names:  # from proftune.compress import _measure: a module
                    if _is_module([*parts, name], src):
                        yield Import(where, _unit(here), _unit(parts), ".".join([*parts, name]), ())
                        names = tuple(n for n in names if n != name)
                yield Import(where, _unit(here), _unit(parts), ".".join(parts), names)


def _layer_of(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"unit {unit!r} is in no layer of LAYERS; add it where it belongs")


def _public(unit: str) -> set[str]:
    """The names ``__all__`` lists in a unit's module (its ``__init__.py`` for a subpackage)."""
    path = SRC / unit / "__init__.py" if (SRC / unit).is_dir() else SRC / f"{unit}.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


CROSS = [imp for imp in _imports() if imp.source != imp.target]


def test_every_unit_is_in_a_layer() -> None:
    units = {_unit(_module_name(p)) for p in SRC.rglob("*.py")}
    placed = set().union(*LAYERS)
    assert units - placed == set(), "units missing from LAYERS"


def test_imports_go_down_the_layers() -> None:
    upward = [f"{imp.where}: {imp.source} imports {imp.module}" for imp in CROSS
              if _layer_of(imp.target) >= _layer_of(imp.source)]
    assert upward == []


def test_no_private_module_of_another_unit() -> None:
    private = [f"{imp.where}: {imp.module}" for imp in CROSS
               if any(part.startswith("_") for part in imp.module.split(".")[2:])]
    assert private == []


def test_only_public_names_of_another_unit() -> None:
    found = []
    for imp in CROSS:
        if imp.target == "proftune" or len(imp.module.split(".")) > 2:
            continue  # the package itself and private modules: the tests above
        if imp.target.startswith("_"):  # shared infrastructure: its names without a leading _
            outside = [n for n in imp.names if n.startswith("_")]
        else:
            public = _public(imp.target)
            outside = [n for n in imp.names if n not in public]
        found += [f"{imp.where}: {imp.module}.{n}" for n in outside]
    assert found == []


def test_no_unit_imports_the_package() -> None:
    """``import proftune`` from inside would run the whole public API's imports, and circle."""
    assert [imp.where for imp in CROSS if imp.target == "proftune"] == []


def _graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same subpackage it imports, lazily or not."""
    graph: dict[str, set[str]] = {}
    for path in sorted((SRC / package).glob("*.py")):
        edges = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:  # from ._x import y, from . import _x
                edges.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
    return graph


@pytest.mark.parametrize(("high", "low"), [("_quant_backends", "_quantize")])
def test_no_circle_inside_compress(high: str, low: str) -> None:
    """The backends call the torch.ao recipes of ``_quantize``; the recipes know no backend."""
    graph = _graph("compress")
    assert low in graph[high]
    assert high not in graph[low]


#: Units whose files still import each other in a circle, each being restructured now. Remove a
#: unit from here as soon as its circle is gone; never add one.
KNOWN_CIRCLES: dict[str, str] = {}
_CIRCLE_OK = "# circle:"


def _file_edges(src: Path = SRC) -> Iterator[tuple[str, str, str]]:
    """(importing module, imported module, "path:line") for every import between two modules of
    the same unit, lazy and type-only ones included, but for lines marked ``# circle: <why>``."""
    for path in sorted(src.rglob("*.py")):
        here = _module_name(path, src)
        package = here if path.name == "__init__.py" else here[:-1]
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or _CIRCLE_OK in lines[node.lineno - 1]:
                continue
            targets: list[list[str]] = []
            if isinstance(node, ast.Import):
                targets = [alias.name.split(".") for alias in node.names]
            else:
                if node.level:
                    parts = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                else:
                    parts = (node.module or "").split(".")
                subs = [[*parts, a.name] for a in node.names if _is_module([*parts, a.name], src)]
                targets = subs + ([parts] if len(subs) < len(node.names) else [])
            for target in targets:
                if target[0] == "proftune" and len(target) > 1 and _unit(target) == _unit(here) and target != here:
                    yield ".".join(here), ".".join(target), f"{path.relative_to(src.parent)}:{node.lineno}"


def _circles(src: Path = SRC) -> dict[str, list[list[str]]]:
    """Unit -> its circles of files (strongly connected sets of more than one module, sorted)."""
    graph: dict[str, set[str]] = {}
    for a, b, _ in _file_edges(src):
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: dict[str, list[list[str]]] = {}

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.setdefault(_unit(v.split(".")), []).append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_circle_of_files_inside_a_unit() -> None:
    circles = {unit: c for unit, c in _circles().items() if unit not in KNOWN_CIRCLES}
    assert circles == {}, "files that import each other in a circle (imports go one way inside a unit too)"


def test_the_known_circles_are_still_there() -> None:
    """An exception that no longer holds is removed at once, so it cannot hide a new circle."""
    assert set(KNOWN_CIRCLES) <= set(_circles())


#: optimize/'s files, bottom first (issue 50): a file imports only files of its own layer or below.
OPTIMIZE_LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    # records: every stage's typed outputs and their parts, the plans, the state file; no stage
    # and the result (a record names its stage: it needs no stage registry)
    {"_computed", "_changes", "_decide", "_budget_plan", "_layer_value", "_search_plan", "_search_records",
     "_final_records", "_records", "_state", "_numbers", "_result_records"},
    # the contract: options, what a stage is given, the stage base and registry, the clock, the plan
    {"_config", "_context", "_planner", "_stages", "_budget"},
    # the stages' work
    {"_stage_measures", "_warm_start", "_search", "_final", "_search_lead", "_reuse", "_lr_check", "_health_gate",
     "_builtin"},
    {"_story", "_output"},  # what the run writes: the story told from the result, the files
    {"_api", "__init__"},  # the orchestrator (_Loop, optimize) and the public names
))


def test_optimize_s_files_import_down_their_layers() -> None:
    def layer(module: str) -> int:
        name = module.split(".")[2] if module.count(".") > 1 else "__init__"
        return next(i for i, files in enumerate(OPTIMIZE_LAYERS) if name in files)

    files = {p.stem for p in (SRC / "optimize").glob("*.py")}
    assert files == set().union(*OPTIMIZE_LAYERS), "a file of optimize/ in no layer (or a layer's file gone)"
    upward = [f"{where}: {a} imports {b}" for a, b, where in _file_edges()
              if a.startswith("proftune.optimize") and layer(b) > layer(a)]
    assert upward == []


def test_a_circle_of_files_fails_and_a_marked_import_is_exempt(tmp_path: Path) -> None:
    pkg = tmp_path / "proftune"
    (pkg / "report").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "report" / "__init__.py").write_text("")
    (pkg / "report" / "_a.py").write_text("from ._b import B\n")
    (pkg / "report" / "_b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from ._c import C\n")
    (pkg / "report" / "_c.py").write_text("def f():\n    from . import _a\n")
    assert _circles(pkg) == {"report": [["proftune.report._a", "proftune.report._b", "proftune.report._c"]]}
    (pkg / "report" / "_c.py").write_text("def f():\n    from . import _a  # circle: the test says why\n")
    assert _circles(pkg) == {}


def test_the_parser_sees_lazy_private_and_upward_imports(tmp_path: Path) -> None:
    """The rules can fail: a lazy import of a private module, and one of a unit above."""
    pkg = tmp_path / "proftune"
    (pkg / "search").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "search" / "__init__.py").write_text("")
    (pkg / "search" / "_gate.py").write_text("")
    (pkg / "task.py").write_text("def f():\n    from .search._gate import gate\n    from . import search\n")
    found = [(imp.source, imp.target, imp.module) for imp in _imports(pkg)]
    assert ("task", "search", "proftune.search._gate") in found
    assert ("task", "search", "proftune.search") in found
    assert _layer_of("search") > _layer_of("task")


def test_the_parser_sees_an_import_by_importlib(tmp_path: Path) -> None:
    """A module reached through ``importlib`` by a literal name is imported all the same."""
    pkg = tmp_path / "proftune"
    (pkg / "optimize").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "optimize" / "__init__.py").write_text("")
    (pkg / "optimize" / "_output.py").write_text(
        "import importlib\nimport importlib.util\n\ndef f():\n"
        "    if importlib.util.find_spec('proftune.report') is not None:\n"
        "        return importlib.import_module('proftune.report').write_report\n"
        "    return importlib.import_module(name)\n")
    found = {(imp.source, imp.target, imp.module) for imp in _imports(pkg)}
    assert found == {("optimize", "report", "proftune.report")}
    assert _layer_of("report") > _layer_of("optimize")
