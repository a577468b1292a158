"""A configuration is validated once on its way from the race's arm to the fit loop (issue 64:
it was validated by the race's ``run_train`` and again by ``fit``, each after merging the
task's defaults)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from proftune.optimize import _builtin, _final
from proftune.optimize._final import Arm, FinalPlan
from proftune.track import Store
from proftune.train import TrainParams

from .tasks import TinyTask


def test_the_races_training_validates_its_arms_params_once(validations: list[dict[str, Any]], tmp_path: Path,
                                                           db_url: str) -> None:
    task = TinyTask()
    arm = Arm(name="search #1", params={"lr": 3e-3, "hidden": 8}, source="search", epochs=1)
    plan = FinalPlan(metric="accuracy", maximize=True, epochs=1, seeds=1, seed=0, device="cpu", val_samples=96)
    store = Store(db_url)
    run = _final._train(task, arm, plan=plan, seed=0, limit_s=60.0, store=store, folder=tmp_path)
    assert validations == [{**TinyTask.default_params, **arm.params}]  # once, over the task's defaults
    assert run.epochs == 1
    assert not run.cut
    assert run.val is not None
    assert run.run_id is not None
    assert store.get_run(run.run_id).config["params"] == {**TinyTask.default_params, **arm.params}


def test_the_baseline_trains_the_defaults_as_the_loop_validated_them(validations: list[dict[str, Any]],
                                                                      tmp_path: Path) -> None:
    task = TinyTask()
    record = TrainParams.of(task)  # made once, where the loop is made
    loop = SimpleNamespace(task=task, defaults=record.params, defaults_record=record, dev="cpu", store=None,
                           out=tmp_path, holdout=None, v=SimpleNamespace(metric="accuracy", budget_s=60.0),
                           cfg=SimpleNamespace(seed=0, space=None, ignore_findings=False))
    out = _builtin.Baseline().run(cast(Any, loop), 10.0, 1e12).outputs
    # the loop's record, made above, and not again by the baseline's diagnosis; the no-tricks
    # loop beside it is a configuration of its own (validated by its fit)
    assert validations.count(dict(TinyTask.default_params)) == 1
    assert len(validations) == 2
    assert out.defaults.params == record.params
    assert out.defaults.metrics["accuracy"] is not None


def test_an_arm_made_with_its_record_trains_it_as_made_and_stores_only_its_params(
        validations: list[dict[str, Any]], tmp_path: Path, db_url: str) -> None:
    task = TinyTask()
    record = TrainParams.of(task, {"lr": 3e-3})  # made where the final stage makes the arm
    validations.clear()
    arm = Arm(name="search #1", params=record.params, source="search", epochs=1, train=record)
    plan = FinalPlan(metric="accuracy", maximize=True, epochs=1, seeds=1, seed=0, device="cpu", val_samples=96)
    store = Store(db_url)
    for seed in (0, 1):  # every seed of the race
        run = _final._train(task, arm, plan=plan, seed=seed, limit_s=60.0, store=store, folder=tmp_path)
        assert run.run_id is not None
        assert store.get_run(run.run_id).config["params"] == record.params
    assert validations == []  # not once more at either seed
    d = arm.to_dict()
    assert "train" not in d
    back = Arm.from_dict(d)
    assert back.train is None
    assert back == arm  # the record is not part of what the arm is
