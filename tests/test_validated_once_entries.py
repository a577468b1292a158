"""Each entry point that trains validates its configuration once, where it is made (issue 64: a
dict was validated by the entry, merged with the task's defaults, and validated again by ``fit``)."""

from __future__ import annotations

from typing import Any

from proftune.compress import compress
from proftune.diagnose import bandit, diagnose
from proftune.diagnose._bandit import Arm
from proftune.profile import profile
from proftune.recommend import lr_find, recommend

from .optimize.tasks import TinyTask


def test_diagnose_validates_its_params_once_over_the_tasks_defaults(validations: list[dict[str, Any]]) -> None:
    result = diagnose(TinyTask(), {"hidden": 8}, epochs=1, lr_test=False, probes=False, record=False)
    assert validations == [{**TinyTask.default_params, "hidden": 8}]
    assert result.params["hidden"] == 8
    assert result.epochs == 1


def test_profile_validates_its_params_once_with_the_batch_size_given(validations: list[dict[str, Any]]) -> None:
    prof = profile(TinyTask(), params={"hidden": 8}, batch_size=16, steps=2, warmup=1, detail="time")
    assert validations == [{**TinyTask.default_params, "hidden": 8, "batch_size": 16}]
    assert prof.config["params"]["batch_size"] == 16


def test_bandit_validates_each_arm_once_with_the_defaults_not_at_every_pull(validations: list[dict[str, Any]],
                                                                          db_url: str) -> None:
    arms = [Arm("a", {"lr": 1e-2}), Arm("b", {"lr": 3e-3})]
    result = bandit(TinyTask(), arms, rounds=4, epochs=1, store=db_url)
    assert len(result.pulls) == 4
    checked = [{"lr": 1e-2}, {"lr": 3e-3}]  # the arms as given (their names and params checked)
    assert validations == checked + [{**TinyTask.default_params, **p} for p in checked]


def test_compress_validates_its_params_once_for_the_baseline_and_the_finetuning(
        validations: list[dict[str, Any]], tmp_path: Any, db_url: str) -> None:
    report = compress(TinyTask(), prune="unstructured", ratios=(0.5,), sensitivity=False, finetune_epochs=1,
                      baseline_epochs=1, out=str(tmp_path / "out"), layer_times=False, latency_rounds=1,
                      store=db_url)
    # the task's params once (the baseline and the fine-tuning train them as made); then the
    # inference profile of the trained model, a bare module at its example's batch
    assert validations == [dict(TinyTask.default_params), {"batch_size": TinyTask.default_params["batch_size"]}]
    assert report.candidates


def test_lr_find_validates_its_params_once_for_the_range_test(validations: list[dict[str, Any]]) -> None:
    result = lr_find(TinyTask(), {"hidden": 8}, steps=20, ladder_steps=0)
    assert validations == [{**TinyTask.default_params, "hidden": 8}]
    assert len(result.lrs) > 0


def test_recommend_validates_the_tasks_configuration_once_across_its_measurements(
        validations: list[dict[str, Any]]) -> None:
    recs = recommend(TinyTask(), lr_steps=20, ladder_steps=0, noise_steps=4, optimizer_budget_s=0,
                     embedding_budget_s=0, precision_check=False)
    # the profile, the range test and the threads' measurement train the task's own configuration,
    # made once; every other training is a configuration of its own (another rate, batch or optimizer)
    assert validations.count(dict(TinyTask.default_params)) == 1
    assert recs.get("batch_size").value == TinyTask.default_params["batch_size"]  # no budget on cpu: kept
