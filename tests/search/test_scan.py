"""Feasibility scan: bounds from profiles only, right within one grid step; nothing when nothing drives."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import proftune
from proftune.search import Space, feasibility_scan, load_space
from proftune.search._gate import _static_metrics
from proftune.search._scan import fit_bounds, restrict_space
from proftune.task import load_task

SPACE: dict[str, Any] = {"params": {
    "hidden": {"type": "int", "low": 8, "high": 256, "step": 8},
    "lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
}}


def _largest_feasible_hidden(limit: float) -> int:
    task = load_task("wine-mlp")
    ok = [h for h in range(8, 264, 8) if _static_metrics(task, {**task.default_params, "hidden": h})["params"] < limit]
    return max(ok)


def test_one_param_alone_driving_the_constraint_gets_its_bound_within_one_grid_step() -> None:
    result = feasibility_scan("wine-mlp", SPACE, constraints=["params<3000"], n=16, device="cpu")
    assert [b.param for b in result.bounds] == ["hidden"]
    bound = result.bounds[0]
    truth = _largest_feasible_hidden(3000)
    assert bound.op == "<="
    assert truth - 8 <= bound.value <= truth
    assert bound.agree == bound.total == result.profiles  # every scanned profile agrees
    assert "hidden <= " in bound.describe()
    assert "params<3000" in bound.describe()
    restricted = restrict_space(load_space(SPACE), result.bounds)
    assert restricted.param("hidden").high == bound.value
    assert restricted.param("lr") == load_space(SPACE).param("lr")


def test_no_param_driving_the_constraint_restricts_nothing() -> None:
    # every configuration meets it
    result = feasibility_scan("wine-mlp", SPACE, constraints=["params<1e9"], n=8, device="cpu")
    assert result.bounds == []
    assert result.feasible_share == 1.0
    assert "nothing to restrict" in result.notes[0]
    # feasibility that follows no param (coin flips): the box learner finds no bound worth it
    space = load_space(SPACE)
    rng = random.Random(0)
    points = [{"params": {"hidden": rng.randrange(8, 264, 8), "lr": 10 ** rng.uniform(-3, -1.5),
                          "dropout": rng.uniform(0, 0.5)}, "feasible": rng.random() < 0.6} for _ in range(40)]
    assert fit_bounds(space, points) == []


def test_two_params_together_make_a_box() -> None:
    space: Space = load_space({"params": {"a": {"type": "int", "low": 0, "high": 10},
                                          "b": {"type": "categorical", "choices": [1, 2, 4]}}})
    points = [{"params": {"a": a, "b": b}, "feasible": a <= 6 and b <= 2} for a in range(11) for b in (1, 2, 4)]
    bounds = {bd.param: bd for bd in fit_bounds(space, points)}
    assert bounds["a"].op == "<="
    assert bounds["a"].value == 6
    assert bounds["b"].value == (1, 2)


def test_trials_count_trained_trials_and_the_scan_keeps_trials_feasible(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    plain = proftune.search("wine-mlp", SPACE, constraints=["params<3000"], trials=4, max_steps=2,
                            sampler="random", scan=0, seed=2, db=db, study="plain")
    budget = plain.budget()
    assert budget["trained"] == 4
    assert budget["gated"] >= 1
    assert plain.scan is None
    assert len(plain.trials) == budget["trained"] + budget["gated"]
    assert all(t.steps == 0 for t in plain.trials if t.gated)
    assert sum(1 for t in plain.trials if t.state == "complete") == 4
    scanned = proftune.search("wine-mlp", SPACE, constraints=["params<3000"], trials=4, max_steps=2,
                              sampler="random", seed=2, db=db, study="scanned")
    assert scanned.scan is not None
    assert scanned.scan.bounds
    assert scanned.budget()["gated"] == 0
    assert scanned.budget()["trained"] == 4
    assert all(t.params["hidden"] <= scanned.scan.bounds[0].value for t in scanned.trials)
    d = scanned.to_dict()
    assert d["scan"]["bounds"][0]["param"] == "hidden"
    assert d["budget"]["trained"] == 4
    assert isinstance(d["strategy"], list)
    # resuming reads the stored scan back instead of scanning again
    again = proftune.search("wine-mlp", SPACE, constraints=["params<3000"], trials=5, max_steps=2,
                            sampler="random", seed=2, db=db, study="scanned")
    assert again.scan is not None
    assert again.scan.to_dict()["bounds"] == d["scan"]["bounds"]
    assert again.budget()["trained"] == 5


def test_max_gated_stops_a_study_that_only_gates(tmp_path: Path) -> None:
    result = proftune.search("wine-mlp", SPACE, constraints=["params<10"], trials=3, max_steps=2,
                             sampler="random", scan=0, max_gated=4, db=f"sqlite:///{tmp_path / 'p.db'}",
                             study="g")
    assert result.budget() == {"trained": 0, "gated": 4, "gated_share": 1.0, "max_gated": 4,
                               "stopped": "max_gated"}


@pytest.mark.parametrize("bad", [-1, True])
def test_scan_option_is_validated(bad: Any, tmp_path: Path) -> None:
    with pytest.raises(proftune.ConfigError, match=r"scan=(-1|True) must be an integer >= 0"):
        proftune.search("wine-mlp", SPACE, constraints=["params<3000"], scan=bad,
                        db=f"sqlite:///{tmp_path / 'p.db'}")


def test_scan_names_one_function() -> None:
    """search.feasibility_scan is the public entry; the private runner it calls has a name of its own."""
    from proftune.search import _scan

    assert not hasattr(_scan, "scan")
    assert feasibility_scan is not _scan.run_scan
