"""A training's params as one record, validated once where it is made (issue 64): ``fit`` and
``run_train`` take the record as it is, and a dict as before, checked once at the entry."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

import proftune
from proftune._api import run_train
from proftune.exceptions import ConfigError
from proftune.train import LOOP_PARAMS, TrainParams, fit


def test_the_loops_params_are_fields_and_the_tasks_a_mapping_beside_them() -> None:
    record = TrainParams({"hidden": 8, "lr": "0.1", "optimizer": "SGD", "batch_size": 16.0})
    assert tuple(f.name for f in dataclasses.fields(TrainParams))[:len(LOOP_PARAMS)] == LOOP_PARAMS
    assert (record.lr, record.optimizer, record.batch_size) == (0.1, "sgd", 16)
    assert isinstance(record.batch_size, int)
    assert record.grad_clip is None  # not given: the loop's default applies
    assert record.task_params == {"hidden": 8}
    assert list(record.params) == ["hidden", "lr", "optimizer", "batch_size"]  # the order given
    assert record.params == {"hidden": 8, "lr": 0.1, "optimizer": "sgd", "batch_size": 16}
    record.params["lr"] = 1.0  # a new dict each time: the record does not change
    assert record.lr == 0.1
    assert pickle.loads(pickle.dumps(record)) == record
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.lr = 1.0  # type: ignore[misc]


def test_made_over_the_tasks_defaults_and_refused_with_every_problem_at_once() -> None:
    task = proftune.load_task("wine-mlp")
    record = TrainParams.of(task, {"lr": 0.5}, hidden=4)
    assert record.params == {**task.default_params, "lr": 0.5, "hidden": 4}
    with pytest.raises(ConfigError) as info:
        TrainParams.of(task, {"lr": "abc", "optimizer": "rmsprop", "batch_size": 0, "grad_clip": None})
    text = str(info.value)
    for part in ("lr='abc'", "rmsprop", "batch_size=0", "grad_clip=None must be a number"):
        assert part in text
    with pytest.raises(ConfigError, match=r"param batch_size=0 must be >= 1"):
        record.with_params(batch_size=0)  # a change is validated as a new record is


def test_fit_with_a_dict_validates_once_and_trains_as_with_the_record(validations: list[dict[str, Any]]) -> None:
    task = proftune.load_task("wine-mlp")
    given = {"lr": "1e-2", "optimizer": "SGD", "hidden": 8}
    by_dict = fit(task, given, max_steps=4, device="cpu", seed=3, threads=1, evaluate=False)
    assert validations == [{**task.default_params, **given}]  # merged with the defaults, checked once
    record = TrainParams.of(task, given)
    validations.clear()
    by_record = fit(task, record, max_steps=4, device="cpu", seed=3, threads=1, evaluate=False)
    assert validations == []  # taken as it is
    assert by_record.params == by_dict.params == {**record.params, "batch_size": by_dict.params["batch_size"]}
    assert by_dict.params["lr"] == 1e-2
    assert by_dict.params["optimizer"] == "sgd"
    assert [p["loss"] for p in by_record.curves["step"]] == [p["loss"] for p in by_dict.curves["step"]]
    with pytest.raises(ConfigError) as info:  # the same message as before the record
        fit(task, {"lr": "abc", "optimizer": "rmsprop", "batch_size": 0}, epochs=1)
    assert "param lr='abc' must be a number." in str(info.value)
    assert "param batch_size=0 must be >= 1." in str(info.value)


def test_a_batch_size_given_to_fit_is_validated_over_a_record() -> None:
    task = proftune.load_task("wine-mlp")
    result = fit(task, TrainParams.of(task, {"lr": 1e-2}), max_steps=1, device="cpu", batch_size=8, evaluate=False)
    assert result.params["batch_size"] == 8
    with pytest.raises(ConfigError, match=r"param batch_size=0 must be >= 1"):
        fit(task, TrainParams.of(task), max_steps=1, device="cpu", batch_size=0)


def test_run_train_validates_once_and_records_the_params(validations: list[dict[str, Any]], db_url: str) -> None:
    task = proftune.load_task("wine-mlp")
    rep = run_train(task, {"lr": 1e-2}, max_steps=2, batch_size=16, device="cpu", threads=1, store=db_url)
    assert len(validations) == 1
    assert rep.params["batch_size"] == 16
    assert rep.params["lr"] == 1e-2
    run = proftune.Store(db_url).get_run(rep.run_id)
    assert run.config["params"] == {**task.default_params, "lr": 1e-2, "batch_size": 16}
