"""Shared fixtures: a throwaway run store per test, never ./proftune.db."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist, never called
def pytest_configure_node(node: Any) -> None:
    """xdist, in the controller: hand each worker this run's $COLUMNS (or its absence)."""
    node.workerinput["proftune_columns"] = os.environ.get("COLUMNS")


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, $COLUMNS as the run had it: a worker starts with COLUMNS=80 set, which
    the CLI's piped tables (100 columns unless $COLUMNS says otherwise) would take as their width."""
    given = getattr(config, "workerinput", {}).get("proftune_columns", "unset")
    if given is None:
        os.environ.pop("COLUMNS", None)
    elif given != "unset":
        os.environ["COLUMNS"] = given


#: Session fixtures that train or start something: the tests using one run on one xdist worker,
#: so that it is made once.
_SHARED_FIXTURES = ("optimize_run",)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``--dist loadgroup`` (pyproject's addopts): a test that uses a shared session
    fixture goes with the others that use it; a test that uses a module-scoped fixture (a Ray
    instance, a built site, a trained model) goes with its file, so that the fixture is made on one
    worker only, as in a serial run; every other test goes to whichever worker is free."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        shared = [name for name in _SHARED_FIXTURES if name in defs]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
        elif any(d and d[-1].scope in ("module", "package", "class") for d in defs.values()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the default store at a temp file so no test writes ./proftune.db."""
    monkeypatch.setenv("PROFTUNE_DB", f"sqlite:///{tmp_path / 'proftune.db'}")


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The params of every call of ``validate_params`` from now on, wherever a module of proftune
    imported it (each binding is replaced by one counting wrapper)."""
    from proftune import _train_params

    original = _train_params.validate_params
    calls: list[dict[str, Any]] = []

    def counted(params: dict[str, Any]) -> dict[str, Any]:
        calls.append(dict(params))
        return original(params)

    for name, module in list(sys.modules.items()):
        ours = name == "proftune" or name.startswith("proftune.")
        if ours and getattr(module, "validate_params", None) is original:
            monkeypatch.setattr(module, "validate_params", counted)
    return calls


@pytest.fixture(autouse=True, scope="session")
def _threads() -> None:
    # One intra-op thread: CI runs beside a busy loop on 2 cores, where a second thread waits on a
    # descheduled one at every op (tests/cli/test_profile_cli.py beside a busy loop: 131-147 s at 1
    # thread, 162-210 s at 2). Tests of thread behaviour set their own count; fits still choose
    # theirs (up to the cores) as the library does.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def optimize_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One real ``proftune optimize`` of a tiny task, piped as a script would run it, with
    compression on (60 s of budget: every stage gets time): what the terminal printed, the
    result, the store and the output folder. Shared by the terminal and the report tests."""
    import json

    from typer.testing import CliRunner

    from proftune.cli import app

    folder = tmp_path_factory.mktemp("optimize")
    db = f"sqlite:///{folder / 'runs.db'}"
    spec = f"{Path(__file__).parent / 'optimize' / 'tasks.py'}:TooSlowLR"
    res = CliRunner().invoke(app, ["optimize", spec, "--budget", "60", "--out", str(folder / "out"), "--db", db,
                                   "--device", "cpu", "--report", str(folder / "story.html")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    summary = json.loads((folder / "out" / "summary.json").read_text())
    return {"output": res.stdout, "result": summary, "db": db, "out": folder / "out", "report": folder / "story.html"}
