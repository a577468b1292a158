"""Plug-ins from outside the package: one class and its registration each, nothing edited in src/.

A diagnosis check and a metric are added here the way an installed plug-in adds them; each then
shows up where the built-ins do (the valid causes, the checks that run, the findings of a real
diagnose run and its JSON; the metric's direction for objectives and constraints, and as a
``tune --objective`` of a user's task file: the JSON's best and the report).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import proftune
from proftune import metrics
from proftune._registry import Registry
from proftune.cli import app
from proftune.diagnose import CAUSES, CHECKS, BaseCheck, Finding, History, register_check
from proftune.diagnose._causes import CHECK_REGISTRY
from proftune.exceptions import ConfigError


class ShortRun(BaseCheck):
    """A plug-in's own cause: the run had fewer than 1,000 optimizer steps."""

    cause = "short_run"
    explains = ("slow_convergence",)

    def check(self, history: History) -> Finding | None:
        n = len(history.steps)
        if n >= 1000:
            return None
        return Finding(self.cause, "info", f"only {n} optimizer steps", "train for longer",
                       {"steps": n}, 0.4)


@pytest.fixture
def short_run() -> Iterator[None]:
    register_check(ShortRun)
    yield
    CHECK_REGISTRY.remove("short_run")


@pytest.mark.usefixtures("short_run")
def test_a_registered_check_is_a_cause_and_runs_in_diagnose() -> None:
    assert "short_run" in CAUSES
    assert CAUSES[-1] == "short_run"  # after the built-ins, whose order is unchanged
    assert any(isinstance(c, ShortRun) for c in CHECKS)
    result = proftune.diagnose("digits-mlp", epochs=1, record=False)
    found = {f.cause: f for f in result.findings}
    for f in result.findings:
        found.update({c.cause: c for c in f.consequences})
    assert "short_run" in found
    assert found["short_run"].evidence["steps"] < 1000
    assert "short_run" in json.dumps(result.to_dict())


@pytest.mark.usefixtures("short_run")
def test_a_registered_check_shows_in_the_cli_json_and_the_report(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = CliRunner().invoke(app, ["diagnose", "digits-mlp", "--epochs", "1", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    assert "short_run" in res.stdout
    page = proftune.report.render_report(proftune.Store(db).list_runs(kind="diagnose")[0], db=db)
    assert "short_run" in page


def test_an_unregistered_cause_is_refused_and_removal_puts_the_list_back() -> None:
    before = tuple(CAUSES)
    with pytest.raises(ConfigError, match="short_run"):
        Finding("short_run", "info", "s", "f")
    register_check(ShortRun())
    assert Finding("short_run", "info", "s", "f").cause == "short_run"
    CHECK_REGISTRY.remove("short_run")
    assert tuple(CAUSES) == before


def test_a_bad_check_is_one_error_naming_each_problem() -> None:
    class NoCause(BaseCheck):
        cause = ""
        explains = ["x"]  # type: ignore[assignment]  # noqa: RUF012 - the wrong type on purpose

        def check(self, history: History) -> Finding | None:
            return None

    with pytest.raises(ConfigError) as e:
        register_check(NoCause)
    assert "cause must be a non-empty string" in str(e.value)
    assert "explains must be a tuple" in str(e.value)
    with pytest.raises(ConfigError, match=r"is not a proftune\.diagnose\.BaseCheck"):
        register_check(object())
    # the same class again is the same plug-in (a no-op); another class under its cause is an error
    assert register_check(type(CHECKS[0])) is type(CHECKS[0])
    assert CHECKS[0] is CHECK_REGISTRY[CHECKS[0].cause]
    clash = type("Clash", (type(CHECKS[0]),), {})
    with pytest.raises(ConfigError, match="registered already"):
        register_check(clash)


def test_a_registered_metric_has_its_direction_everywhere() -> None:
    energy = metrics.Metric("energy_j", "min", "J", ("evaluate",), "energy of one evaluation",
                            "Task.evaluate")
    metrics.register_metric(energy)
    try:
        assert metrics.direction("energy_j") == "min"
        assert metrics.split_objective("energy_j") == ("energy_j", "min")
        assert "energy_j" in metrics.produced_by("evaluate")
        assert metrics.better("energy_j", 1.0, 2.0)
    finally:
        metrics.METRICS.remove("energy_j")
    with pytest.raises(ConfigError, match="energy_j"):
        metrics.direction("energy_j")


#: A task file of a user's: TinyTask whose evaluation also reports a metric the package does not know.
ENERGY_TASK = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_tiny_tasks", {tasks!r})
tiny = importlib.util.module_from_spec(spec)
sys.modules["_tiny_tasks"] = tiny
spec.loader.exec_module(tiny)


class EnergyTiny(tiny.TinyTask):
    def evaluate(self, model, data):
        out = super().evaluate(model, data)
        out["energy_j"] = 1e-6 * sum(p.numel() for p in model.parameters())  # grows with hidden
        return out
"""


@pytest.fixture
def energy() -> Iterator[None]:
    metrics.register_metric(metrics.Metric("energy_j", "min", "J", ("evaluate",), "energy of one evaluation",
                                           "Task.evaluate"))
    yield
    metrics.METRICS.remove("energy_j")


@pytest.mark.usefixtures("energy")
def test_a_registered_metric_is_an_objective_on_the_cli_in_the_json_and_the_report(tmp_path: Path) -> None:
    """``--objective energy_j`` with no direction: the registry's (min) is the study's."""
    task = tmp_path / "energy_task.py"
    task.write_text(ENERGY_TASK.format(tasks=str(Path(__file__).parent / "optimize" / "tasks.py")))
    space = tmp_path / "s.yaml"
    space.write_text("params:\n  hidden: {type: int, low: 2, high: 64, log: true}\n")
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = CliRunner().invoke(app, ["tune", f"{task}:EnergyTiny", "--space", str(space), "--trials", "4",
                                   "--epochs", "1", "--objective", "energy_j", "--sampler", "random",
                                   "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["objectives"] == ["energy_j:min"]
    done = [t for t in out["trials"] if t["state"] == "complete"]
    assert len(done) == 4
    assert out["best"]["metrics"]["energy_j"] == min(t["metrics"]["energy_j"] for t in done)  # minimised
    tune = proftune.Store(db).list_runs(kind="tune")[0]
    assert "energy_j" in proftune.report.render_report(tune, db=db)
    unknown = CliRunner().invoke(app, ["tune", f"{task}:EnergyTiny", "--space", str(space), "--trials", "1",
                                       "--objective", "joules", "--db", db])
    assert unknown.exit_code == 2
    assert "energy_j" in unknown.output  # a registered metric is among the valid names


def test_a_bad_metric_names_every_problem() -> None:
    bad = metrics.Metric("odd", "up", "", ("nowhere",), "")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as e:
        metrics.register_metric(bad)
    assert "direction='up'" in str(e.value)
    assert "stages=('nowhere',)" in str(e.value)
    with pytest.raises(ConfigError, match="registered already"):
        metrics.register_metric(metrics.Metric("accuracy", "min", "", ("evaluate",), "a clash"))


def test_registry_lists_valid_names_and_loads_entry_points_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    calls = []

    class EP:
        name, value = "extra", "pkg:Extra"

        def load(self) -> object:
            calls.append(1)
            return "the extra part"

    monkeypatch.setattr(md, "entry_points", lambda group: [EP()] if group == "g" else [])
    reg: Registry[str] = Registry("widget", entry_points="g")
    reg.add("a", name="first")
    assert reg.names() == ("first", "extra")
    assert reg["extra"] == "the extra part"
    assert len(reg) == 2
    assert calls == [1]
    with pytest.raises(ConfigError, match=r"widget 'nope' is unknown; valid: first, extra"):
        reg.get_entry("nope")
