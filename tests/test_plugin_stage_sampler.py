"""A sampler, a pruner, a search backend and an optimize stage added from outside the package, each one class
and its registration; each then shows up where the built-ins do: the CLI, the JSON and the report.

(The other kinds' plug-in tests: a diagnosis check and a metric in ``test_registry.py``, a
compression method in ``compress/test_own_method.py``, a quantization backend and a compiler in
``compress/test_own_backend_compiler.py``.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import optuna
import pytest
from typer.testing import CliRunner

import proftune
from proftune.cli import app
from proftune.exceptions import ConfigError
from proftune.optimize import (
    OPTIMIZE_STAGES,
    SHARES,
    STAGE_RECORDS,
    STAGE_REGISTRY,
    BaseStage,
    StageContext,
    StageOutputs,
    StageResult,
    register_stage,
)
from proftune.search import (
    PRUNER_REGISTRY,
    PRUNERS,
    SAMPLER_REGISTRY,
    SAMPLERS,
    SEARCH_BACKEND_REGISTRY,
    SEARCH_BACKENDS,
    BackendRun,
    BasePrunerMaker,
    BaseSamplerMaker,
    BaseSearchBackend,
    SearchSettings,
    register_backend,
    register_pruner,
    register_sampler,
)

HERE = Path(__file__).resolve().parent
TASKS = HERE / "optimize" / "tasks.py"
SPACE = "params:\n  lr: {type: float, low: 0.001, high: 0.1, log: true}\n"


class EdgesFirst(BaseSamplerMaker):
    """A plug-in's sampler: Optuna's random sampler under a name of its own (its seed from us)."""

    name = "edges-first"
    made: ClassVar[list[int]] = []

    def make(self, settings: SearchSettings, *, seed: int) -> optuna.samplers.BaseSampler:
        EdgesFirst.made.append(seed)
        return optuna.samplers.RandomSampler(seed=seed)


@pytest.fixture
def edges_first() -> Iterator[None]:
    register_sampler(EdgesFirst)
    yield
    SAMPLER_REGISTRY.remove("edges-first")


@pytest.mark.usefixtures("edges_first")
def test_a_registered_sampler_is_a_valid_key_of_tune(tmp_path: Path) -> None:
    assert SAMPLERS[-1] == "edges-first"
    assert "tpe" in SAMPLERS
    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = CliRunner().invoke(app, ["tune", f"{TASKS}:TinyTask", "--space", str(space), "--trials", "3",
                                   "--epochs", "1", "--sampler", "edges-first", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["sampler"] == "edges-first"
    assert out["counts"]["complete"] == 3
    assert EdgesFirst.made  # the plug-in built the sampler the trials used
    tune = proftune.Store(db).list_runs(kind="tune")[0]
    assert tune.config["sampler"] == "edges-first"
    assert "edges-first" in proftune.report.render_report(tune, db=db)


def test_an_unknown_sampler_lists_the_registered_ones(tmp_path: Path) -> None:
    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    res = CliRunner().invoke(app, ["tune", f"{TASKS}:TinyTask", "--space", str(space), "--trials", "1",
                                   "--sampler", "nope", "--db", f"sqlite:///{tmp_path / 'p.db'}"])
    assert res.exit_code == 2
    assert "--sampler 'nope' is unknown" in res.output
    assert "coarse-to-fine" in res.output
    assert "asha" in PRUNERS


class _AfterFirst(optuna.pruners.BasePruner):
    """Keeps the first trial whole and cuts every later one at its first report."""

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return trial.number > 0 and bool(trial.intermediate_values)


class CutAfterFirst(BasePrunerMaker):
    """A plug-in's pruner: built by its maker from the space file's ``pruner:`` options."""

    name = "cut-after-first"
    option_types: ClassVar[dict[str, str]] = {"keep": "int"}  # its own option in the space file's pruner:
    seen: ClassVar[list[dict[str, Any]]] = []

    def make(self, options: dict[str, Any]) -> optuna.pruners.BasePruner:
        CutAfterFirst.seen.append(options)
        return _AfterFirst()


@pytest.fixture
def cut_after_first() -> Iterator[None]:
    register_pruner(CutAfterFirst)
    yield
    PRUNER_REGISTRY.remove("cut-after-first")


@pytest.mark.usefixtures("cut_after_first")
def test_a_registered_pruner_is_a_valid_key_of_tune_and_prunes(tmp_path: Path) -> None:
    assert PRUNERS[-1] == "cut-after-first"
    space = tmp_path / "s.yaml"
    space.write_text(SPACE + "pruner: {keep: 1}\n")
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = CliRunner().invoke(app, ["tune", f"{TASKS}:TinyTask", "--space", str(space), "--trials", "3",
                                   "--epochs", "2", "--pruner", "cut-after-first", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["pruner"] == "cut-after-first"
    assert out["counts"]["complete"] == 1  # the first trial ran whole
    assert out["counts"]["pruned"] == 2  # the plug-in cut the others at their first epoch
    assert CutAfterFirst.seen[-1] == {"keep": 1}  # the space file's options reached the maker
    tune = proftune.Store(db).list_runs(kind="tune")[0]
    assert tune.config["pruner"] == "cut-after-first"
    assert "cut-after-first" in proftune.report.render_report(tune, db=db)


@dataclass(frozen=True, kw_only=True)
class WidthOutputs(StageOutputs):
    """The plug-in stage's record: the defaults' model's parameters per layer."""

    STAGE: ClassVar[str] = "widths"
    params_per_layer: dict[str, int]
    total: int = 0
    #: What the stage read of the loop through the public context (the baseline's epoch, the plan).
    epoch_s: float = 0.0
    search_s: float = 0.0


class Widths(BaseStage):
    """A plug-in stage after ``compute``: counts the defaults' model's parameters per layer."""

    name = "widths"
    share = 0.01
    record = WidthOutputs
    after = "compute"

    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        model = loop.task.build_model(dict(loop.defaults))
        per = {n: sum(p.numel() for p in m.parameters(recurse=False))
               for n, m in model.named_modules() if n and any(True for _ in m.parameters(recurse=False))}
        return StageResult(WidthOutputs(params_per_layer=per, total=sum(per.values()), epoch_s=loop.planner.epoch_s(),
                                        search_s=loop.planner.budget_plan().search_s))


@pytest.fixture
def widths() -> Iterator[None]:
    register_stage(Widths)
    yield
    STAGE_REGISTRY.remove("widths")


@pytest.mark.usefixtures("widths")
def test_a_registered_stage_runs_in_its_place_and_shows_everywhere(tmp_path: Path) -> None:
    order = list(OPTIMIZE_STAGES)
    assert order.index("widths") == order.index("compute") + 1
    assert SHARES["widths"] == 0.01
    assert STAGE_RECORDS["widths"] is WidthOutputs
    out, db = tmp_path / "out", f"sqlite:///{tmp_path / 'p.db'}"
    res = CliRunner().invoke(app, ["optimize", f"{TASKS}:TinyTask", "--budget", "15s", "--goal", "none",
                                   "--out", str(out), "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    names = [s["name"] for s in d["stages"]]
    assert names == order
    row = d["stages"][names.index("widths")]
    assert row["status"] == "finished"
    assert row["outputs"]["total"] == 8 * 16 + 16 + 16 * 2 + 2  # TinyTask's MLP at hidden=16
    # the stage read the loop through StageContext: the baseline's measured epoch, the plan from it
    baseline = d["stages"][names.index("baseline")]["outputs"]
    assert row["outputs"]["epoch_s"] == pytest.approx(max(baseline["epoch_s"] or 1.0, 1e-3))
    assert row["outputs"]["search_s"] > 0
    state = json.loads((out / "state.json").read_text())
    assert WidthOutputs.from_dict(state["stages"]["widths"]["outputs"]).total == row["outputs"]["total"]
    stage_runs = [r for r in proftune.Store(db).list_runs(kind="optimize") if r.config.get("stage") == "widths"]
    assert len(stage_runs) == 1
    assert stage_runs[0].status == "finished"
    page = (out / "report.html").read_text()
    assert "widths" in page


def test_a_bad_stage_is_one_error_naming_each_problem() -> None:
    class Bad(BaseStage):
        name = "bad"
        share = 2.0
        record = WidthOutputs  # its STAGE is "widths", not "bad"
        after = "nowhere"

        def run(self, loop: Any, share: float, end: float) -> StageResult:
            raise AssertionError("never runs")

    with pytest.raises(ConfigError) as e:
        register_stage(Bad)
    text = str(e.value)
    assert "share must be a share of the budget in [0, 1], but got 2.0" in text
    assert "STAGE is 'bad'" in text
    assert "after='nowhere' is no registered stage; valid: baseline, health" in text
    assert "bad" not in OPTIMIZE_STAGES


class CountingBackend(BaseSearchBackend):
    """A plug-in's backend: this machine's, counting the searches it ran and refusing workers > 2."""

    name = "counting"
    ran: ClassVar[list[int]] = []

    def check(self, config: Any, problems: list[str]) -> None:
        if config.workers > 2:
            problems.append(f"workers={config.workers}: the counting backend runs at most 2.")

    def run(self, settings: SearchSettings, config: Any, *, storage: Any, store: Any, deadline: float | None,
            finished: int) -> BackendRun:
        CountingBackend.ran.append(finished)
        local = SEARCH_BACKEND_REGISTRY.get_entry("local").run(
            settings, config, storage=storage, store=store, deadline=deadline, finished=finished)
        # the delegate's details passed on: the search still records this backend's own name
        return BackendRun(stopped=local.stopped, details={**local.details, "backend": "local",
                                                         "counted": len(CountingBackend.ran)})


@pytest.fixture
def counting() -> Iterator[None]:
    register_backend(CountingBackend)
    yield
    SEARCH_BACKEND_REGISTRY.remove("counting")


@pytest.mark.usefixtures("counting")
def test_a_registered_search_backend_runs_the_trials_and_checks_its_options(tmp_path: Path) -> None:
    assert "counting" in SEARCH_BACKENDS
    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = CliRunner().invoke(app, ["tune", f"{TASKS}:TinyTask", "--space", str(space), "--trials", "2",
                                   "--epochs", "1", "--backend", "counting", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["counts"]["complete"] == 2
    assert out["backend"] == {"backend": "counting", "counted": 1}
    assert CountingBackend.ran == [0]
    tune = proftune.Store(db).list_runs(kind="tune")[0]
    assert "counting (counted 1)" in proftune.report.render_report(tune, db=db)  # the study page names it
    bad = CliRunner().invoke(app, ["tune", f"{TASKS}:TinyTask", "--space", str(space), "--trials", "2",
                                   "--backend", "counting", "--workers", "3", "--db", db])
    assert bad.exit_code == 2
    assert "the counting backend runs at most 2" in bad.output
