"""A configuration is validated once on its way from the race's arm to the fit loop (issue 64:
it was validated by the race's ``run_train`` and again by ``fit``, each after merging the
task's defaults)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proftune.optimize import _final
from proftune.optimize._final import Arm, FinalPlan
from proftune.track import Store

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
