"""proftune.search end to end on wine-mlp: gating, faults as data, resume, pruning, Pareto, analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

import proftune
from proftune import ConfigError, RunFailedError, Store
from proftune.search import SearchResult

HERE = Path(__file__).parent
FAULTY = f"{HERE / '_tasks.py'}:FaultyWine"

GATED_SPACE: dict[str, Any] = {"params": {
    "hidden": {"type": "categorical", "choices": [8, 16, 64, 128]},
    "lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True},
}}


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> tuple[SearchResult, str]:
    db = f"sqlite:///{tmp_path_factory.mktemp('gated') / 'p.db'}"
    result = proftune.search("wine-mlp", GATED_SPACE, constraints=["params<2000"], trials=8,
                             epochs=1, sampler="random", study="gated", db=db, seed=1, scan=0)
    return result, db


def test_gated_trials_end_at_once_with_the_measured_reason(gated: tuple[SearchResult, str]) -> None:
    result, db = gated
    states = result.counts()
    assert states["infeasible"] >= 1
    assert states["complete"] >= 1
    budget = result.budget()  # trials counts trained trials; the gated ones come on top
    assert budget["trained"] == 8
    assert len(result.trials) == 8 + budget["gated"]
    assert all(t.gated == (t.state == "infeasible") for t in result.trials)
    for t in result.trials:
        big = t.params["hidden"] >= 64
        assert (t.state == "infeasible") == big
        assert t.metrics["params"] > 0
        if big:
            assert t.steps == 0
            assert t.train_s == 0.0
            assert "params=" in (t.reason or "")
            assert ">= 2000" in (t.reason or "")
            assert t.constraints["params<2000"].ok is False
        else:
            assert t.steps > 0
            assert "accuracy" in t.metrics
    assert result.best is not None
    assert result.best.params["hidden"] in (8, 16)
    # the measured values went to Optuna's constraint interface (Trial.set_constraint)
    study = optuna.load_study(study_name="gated", storage=db)
    for ft in study.trials:
        assert "params<2000" in ft.constraints


#: The keys of a trial's user attr ``proftune`` (``TrialFigures.to_dict``), in order: a gated trial
#: has no curve; the key set is what studies written before hold, so TrialRecord reads both alike.
FIGURES = ["params", "metrics", "constraints", "reason", "steps", "train_s", "gate_s", "anomalies", "stage",
           "run_id", "sampler", "repeat", "seed", "curve", "state", "duration_s"]


def test_a_trials_figures_are_stored_with_the_same_keys_as_before(gated: tuple[SearchResult, str]) -> None:
    result, db = gated
    study = optuna.load_study(study_name="gated", storage=db)
    by_number = {t.number: t for t in result.trials}
    for ft in study.trials:
        figures = ft.user_attrs["proftune"]
        trained = by_number[ft.number].state == "complete"
        assert list(figures) == (FIGURES if trained else [k for k in FIGURES if k != "curve"])
        assert (figures["sampler"], figures["seed"], figures["repeat"]) == ("RandomSampler", 1, 0)
        record = by_number[ft.number]
        assert (record.steps, record.run_id, record.metrics) == (figures["steps"], figures["run_id"],
                                                                 figures["metrics"])
        assert len(record.curve) == (1 if trained else 0)
        assert (ft.constraints["params<2000"] > 0) == (ft.params["hidden"] >= 64)


def test_every_trial_is_a_run_linked_to_its_study(gated: tuple[SearchResult, str]) -> None:
    result, db = gated
    store = Store(db)
    tune = store.get_run(result.run_id)
    assert tune.kind == "tune"
    assert tune.status == "finished"
    assert tune.study == "gated"
    runs = store.list_runs(kind="trial", study="gated")
    assert len(runs) == len(result.trials)  # gated trials are Runs too
    assert {r.parent_id for r in runs} == {result.run_id}
    assert {r.id for r in runs} == {t.run_id for t in result.trials}
    assert all(r.status == "finished" for r in runs)
    assert all(r.data_fingerprint == tune.data_fingerprint for r in runs)


def test_analysis_correlations_importance_and_json(gated: tuple[SearchResult, str]) -> None:
    result, _ = gated
    d = result.to_dict()
    for key in ("study", "best", "trials", "correlations", "importance"):
        assert key in d
    assert set(d["best"]) >= {"params", "values", "metrics"}
    assert {"number", "state", "params", "metrics", "constraints", "reason", "duration_s"} <= set(d["trials"][0])
    # hidden drives the parameter count: measured on every trial, infeasible ones included
    corr = d["correlations"]["hidden"]["params"]
    assert corr["spearman"] > 0.9
    assert corr["n"] == len(result.trials)
    imp = d["importance"]["accuracy"]
    fan = {k: v for k, v in imp["fanova"].items() if k != "error"}
    if fan:
        assert sum(fan.values()) == pytest.approx(1.0, abs=1e-6)


def test_faults_are_data_not_crashes(tmp_path: Path) -> None:
    space = {"params": {"fault": {"type": "categorical", "choices": ["none", "raise", "oom", "nan"]}}}
    result = proftune.search(FAULTY, space, trials=4, sampler="grid", max_steps=3,
                             db=f"sqlite:///{tmp_path / 'p.db'}", study="faults")
    by = {t.params["fault"]: t for t in result.trials}
    assert set(by) == {"none", "raise", "oom", "nan"}
    assert by["none"].state == "complete"
    assert by["raise"].state == "failed"
    assert "user code broke" in (by["raise"].reason or "")
    assert "Traceback" in (by["raise"].traceback or "")
    assert "build_model" in (by["raise"].traceback or "")
    assert by["oom"].state == "infeasible"
    assert "out of memory" in (by["oom"].reason or "")
    assert by["nan"].state == "pruned"
    assert any(a["kind"] == "nan_loss" for a in by["nan"].anomalies)
    failed_run = Store(f"sqlite:///{tmp_path / 'p.db'}").get_run(by["raise"].run_id)
    assert failed_run.status == "failed"
    assert "user code broke" in (failed_run.error or "")


def test_max_failures_stops_the_study(tmp_path: Path) -> None:
    space = {"params": {"fault": {"type": "categorical", "choices": ["raise"]},
                        "hidden": {"type": "int", "low": 4, "high": 8}}}
    with pytest.raises(RunFailedError, match="more than max_failures=1"):
        proftune.search(FAULTY, space, trials=10, sampler="random", max_steps=2, max_failures=1,
                        db=f"sqlite:///{tmp_path / 'p.db'}", study="ff")
    study = optuna.load_study(study_name="ff", storage=f"sqlite:///{tmp_path / 'p.db'}")
    assert len(study.trials) == 2


def test_resume_continues_and_a_different_space_changes_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    space = {"params": {"hidden": {"type": "int", "low": 4, "high": 16}}}
    first = proftune.search("wine-mlp", space, trials=2, max_steps=2, study="r", db=db)
    again = proftune.search("wine-mlp", space, trials=3, max_steps=2, study="r", db=db)
    assert again.resumed
    assert not first.resumed
    assert len(again.trials) == 3
    assert [(t.number, t.params, t.values) for t in again.trials[:2]] == \
           [(t.number, t.params, t.values) for t in first.trials]
    study = optuna.load_study(study_name="r", storage=db)
    attrs_before = dict(study.user_attrs)
    changed = {"params": {"hidden": {"type": "int", "low": 4, "high": 32},
                          "dropout": {"type": "float", "low": 0.0, "high": 0.5}}}
    with pytest.raises(ConfigError) as info:
        proftune.search("wine-mlp", changed, trials=5, max_steps=2, study="r", db=db)
    text = str(info.value)
    assert "different space" in text
    assert "'hidden' changed" in text
    assert "'dropout' is new" in text
    study = optuna.load_study(study_name="r", storage=db)
    assert len(study.trials) == 3
    assert dict(study.user_attrs) == attrs_before
    assert len(Store(db).list_runs(kind="tune", study="r")) == 2


def test_patience_pruner_stops_the_fit_loop(tmp_path: Path) -> None:
    space = {"params": {"lr": {"type": "categorical", "choices": [1e-9]}}, "pruner": {"patience": 1}}
    result = proftune.search("wine-mlp", space, trials=1, epochs=5, pruner="patience",
                             db=f"sqlite:///{tmp_path / 'p.db'}", study="p")
    (t,) = result.trials
    assert t.state == "pruned"
    assert "patience pruner at epoch 2" in (t.reason or "")
    assert t.steps == 2 * 9  # two epochs of 142 samples at batch 16, then stopped


def test_multi_objective_pareto_front(tmp_path: Path) -> None:
    space = {"params": {"hidden": {"type": "int", "low": 2, "high": 64, "log": True}}}
    result = proftune.search("wine-mlp", space, objectives=["accuracy:max", "params:min"], trials=5,
                             epochs=1, sampler="nsga2", db=f"sqlite:///{tmp_path / 'p.db'}", study="mo")
    assert result.pareto
    assert all(t.state == "complete" for t in result.pareto)
    pts = [(t.metrics["accuracy"], t.metrics["params"]) for t in result.pareto]
    for a in pts:  # nobody on the front is dominated by another trial
        for t in result.trials:
            if t.state == "complete":
                b = (t.metrics["accuracy"], t.metrics["params"])
                assert not (b[0] >= a[0] and b[1] <= a[1] and b != a)


@pytest.mark.parametrize(("sampler", "used"), [
    ("tpe", "TPESampler"), ("halton", "QMCSampler(halton)"), ("sobol", "QMCSampler(sobol)"),
    ("random", "RandomSampler"), ("grid", "GridSampler"), ("coarse-to-fine", "CoarseToFineSampler"),
    ("nsga2", "NSGAIISampler"),
])
def test_every_sampler_runs_its_trials(sampler: str, used: str, tmp_path: Path) -> None:
    space = {"params": {"hidden": {"type": "int", "low": 4, "high": 16, "step": 4},
                        "lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}}
    result = proftune.search("wine-mlp", space, trials=3, max_steps=2, sampler=sampler,
                             db=f"sqlite:///{tmp_path / 'p.db'}", study="s")
    assert result.counts()["complete"] == 3
    assert {t.sampler for t in result.trials} == {used}  # the sampler asked for drew every trial
    for t in result.trials:
        assert t.params["hidden"] in (4, 8, 12, 16)
        assert 1e-3 <= t.params["lr"] <= 1e-2


def test_staged_search_fixes_the_best_of_earlier_stages(tmp_path: Path) -> None:
    space = {"params": {
        "hidden": {"type": "categorical", "choices": [4, 32], "tier": "architecture"},
        "lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True, "tier": "training"},
    }}
    result = proftune.search("wine-mlp", space, trials=4, epochs=1, sampler="random", seed=3,
                             db=f"sqlite:///{tmp_path / 'p.db'}", study="tiers")
    arch = [t for t in result.trials if t.stage == "architecture"]
    train = [t for t in result.trials if t.stage == "training"]
    assert len(arch) == 2
    assert len(train) == 2
    assert len({t.params["lr"] for t in arch}) == 1  # lr held at its centre while the architecture is searched
    best_arch = max(arch, key=lambda t: t.metrics["accuracy"]).params["hidden"]
    assert all(t.params["hidden"] == best_arch for t in train)


def test_function_and_subpackage_share_the_name() -> None:
    from proftune.search import Space, search

    assert callable(proftune.search)
    assert proftune.search.search is search  # proftune.search is the subpackage, called as search()
    assert Space.__module__ == "proftune.search._space"


def test_memory_constraint_gates_through_the_profiler(tmp_path: Path) -> None:
    space = {"params": {"hidden": {"type": "categorical", "choices": [4, 1024]}}}
    result = proftune.search("wine-mlp", space, constraints=["peak_memory_bytes<4MB"], trials=2,
                             sampler="grid", max_steps=2, scan=0, db=f"sqlite:///{tmp_path / 'p.db'}", study="m")
    by = {t.params["hidden"]: t for t in result.trials}
    assert by[4].state == "complete"
    assert 0 < by[4].metrics["peak_memory_bytes"] < 4e6
    assert by[1024].state == "infeasible"
    assert by[1024].steps == 0
    assert "peak_memory_bytes=" in (by[1024].reason or "")
    assert by[1024].metrics["peak_memory_bytes"] >= 4e6
    assert by[4].metrics["step_time_ms"] > 0
    assert by[4].metrics["macs"] > 0


def test_a_search_config_is_the_same_call_as_its_keywords(tmp_path: Path) -> None:
    """``config=SearchConfig(...)`` and keywords are one call; keywords beside it override it."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    space = {"params": {"hidden": {"type": "int", "low": 4, "high": 16}}}
    cfg = proftune.SearchConfig(trials=2, max_steps=2, sampler="random", seed=5, study="c")
    by_config = proftune.search("wine-mlp", space, config=cfg, db=db)
    by_keywords = proftune.search("wine-mlp", space, trials=2, max_steps=2, sampler="random", seed=5,
                                  study="k", db=db)
    assert [t.params for t in by_config.trials] == [t.params for t in by_keywords.trials]
    more = proftune.search("wine-mlp", space, config=cfg, trials=3, db=db)  # continues study "c"
    assert more.resumed
    assert len(more.trials) == 3
    assert cfg.trials == 2  # the config itself is left as it was (frozen)
    tune = Store(db).list_runs(kind="tune", study="c")[0]
    assert tune.config["trials"] == 3
    assert tune.config["sampler"] == "random"


def test_an_unknown_search_option_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        proftune.search("wine-mlp", {"params": {"hidden": {"type": "int", "low": 4, "high": 16}}}, trails=3)
    text = str(info.value)
    assert "'trails'" in text
    assert "trials" in text
    assert "max_steps" in text


def test_problems_name_the_search_config_fields_not_flags(tmp_path: Path) -> None:
    """A Python caller reads the keyword it passed (``trials=0``), never the CLI's ``--trials``."""
    import re

    from proftune.search import RayOptions

    space = {"params": {"hidden": {"type": "int", "low": 4, "high": 16}}}
    with pytest.raises(ConfigError) as info:
        proftune.search("wine-mlp", space, objectives=["x y", "accuracy", "accuracy"],
                        constraints=["step_time_ms<<50", "f1>0.3"], params={"hidden": 8}, sampler="coarse-to-fine",
                        pruner="median", backend="nope", scan=-1, trials=0, max_gated=-1, workers=0,
                        max_failures=-1, timeout=0, epochs=0, db=f"sqlite:///{tmp_path / 'p.db'}")
    text = str(info.value)
    for needle in ("'hidden' is fixed to 8 by params= and also searched", "objectives='x y' is malformed",
                   "constraints='step_time_ms<<50' is malformed", "constraints='f1>0.3': metric 'f1' is produced",
                   "objectives= names 'accuracy' twice", "backend='nope' is unknown", "scan=-1 must be",
                   "pruner='median' needs one objective", "sampler='coarse-to-fine' ranks trials by one objective",
                   "trials=0 must be >= 1", "max_gated=-1 must be >= 0", "workers=0 must be >= 1",
                   "max_failures=-1 must be >= 0", "timeout=0 must be > 0", "epochs=0 must be >= 1"):
        assert needle in text, (needle, text)
    assert not re.search(r"(?<![\w-])--[a-z]", text), text
    assert not (tmp_path / "p.db").exists()
    for bad, needle in (({"scheduler": "nope"}, "scheduler='nope' is unknown"),
                        ({"address": "foo"}, "address='foo' is malformed"), ({"workers": 0}, "workers=0")):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            RayOptions(**bad)


def test_one_objective_or_constraint_as_text_is_a_sequence_of_one() -> None:
    """``objectives="accuracy:max"`` is one objective, not eleven one-character ones."""
    cfg = proftune.SearchConfig(objectives="accuracy:max", constraints="params<1e6")  # type: ignore[arg-type]
    assert cfg.objectives == ("accuracy:max",)
    assert cfg.constraints == ("params<1e6",)
    assert proftune.SearchConfig(objectives=["a:max", "b:min"]).objectives == ["a:max", "b:min"]


def test_keep_models_leaves_the_leading_trials_models_and_they_are_the_trials_own(tmp_path: Path) -> None:
    """``keep_models``: the models of the best trials so far (at most KEEP_MODELS a runner), each
    its trial's own training: loaded into the task's model it scores the trial's metric again."""
    from proftune.examples._wine import WineMLP
    from proftune.search._trial import KEEP_MODELS
    from proftune.train import evaluate_model

    space = {"params": {"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}}}
    folder = tmp_path / "kept"
    result = proftune.search(WineMLP(), space, trials=6, sampler="random", epochs=2, seed=3,
                             db=f"sqlite:///{tmp_path / 'p.db'}", study="keep", keep_models=folder)
    files = sorted(folder.glob("trial-*.pt"))
    assert 1 <= len(files) <= KEEP_MODELS
    best = max((t for t in result.trials if t.value is not None), key=lambda t: t.value or 0.0)
    path = folder / f"trial-{best.number}.pt"
    assert path.is_file()
    task = WineMLP()
    model = task.build_model({**task.default_params, **best.params})
    model.load_state_dict(torch.load(path, weights_only=True))
    again = evaluate_model(task, model, torch.device("cpu"), int(task.default_params.get("batch_size", 32)))
    assert again["accuracy"] == pytest.approx(best.metrics["accuracy"])
    with pytest.raises(ConfigError, match="keep_models=3 must be a folder"):
        proftune.search(WineMLP(), space, trials=1, db=f"sqlite:///{tmp_path / 'p.db'}", keep_models=3)
