"""The held-out split: fixed, disjoint, the same at every batch size; a task's own test split wins."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from proftune import ClassificationTask
from proftune._holdout import HeldOutTask, with_test_split
from proftune.examples import TensorBatches
from proftune.task import load_task

X = torch.arange(100, dtype=torch.float32).reshape(100, 1)
Y = torch.arange(100) % 2


class Numbered(ClassificationTask):
    name = "numbered"
    default_params: ClassVar[dict[str, Any]] = {"batch_size": 8}

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Linear(1, 2)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return TensorBatches(X, Y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return TensorBatches(X, Y, batch_size, shuffle=False)


class WithTest(Numbered):
    def test_data(self, batch_size: int) -> Iterable[Any]:
        return TensorBatches(X[:10], Y[:10], batch_size, shuffle=False)


def _ids(data: Iterable[Any]) -> list[int]:
    return [int(v) for x, _ in data for v in x.flatten()]


def test_the_split_is_disjoint_complete_and_the_same_at_every_batch_size() -> None:
    task = HeldOutTask(Numbered())
    sel, held = _ids(task.val_data(7)), _ids(task.test_data(7))
    assert sorted(sel + held) == list(range(100))
    assert not set(sel) & set(held)
    assert 40 <= len(held) <= 60
    for bs in (1, 3, 32, 256):
        assert _ids(task.val_data(bs)) == sel
        assert _ids(task.test_data(bs)) == held
    # evenly spread: every window of 20 samples holds some of each side
    for start in range(0, 100, 20):
        window = set(range(start, start + 20))
        assert window & set(held)
        assert window & set(sel)


def test_dict_batches_are_split_row_by_row() -> None:
    class Dicts(Numbered):
        def val_data(self, batch_size: int) -> Iterable[Any]:
            return [{"x": X[i:i + batch_size], "y": Y[i:i + batch_size], "tag": "v"}
                    for i in range(0, 100, batch_size)]

    task = HeldOutTask(Dicts())
    held = [b for b in task.test_data(10)]
    assert all(b["tag"] == "v" for b in held)
    ids = [int(v) for b in held for v in b["x"].flatten()]
    assert ids == _ids(HeldOutTask(Numbered()).test_data(10))


def test_batches_that_cannot_be_split_go_whole_to_one_side() -> None:
    class Opaque(Numbered):
        def val_data(self, batch_size: int) -> Iterable[Any]:
            return [f"batch{i}" for i in range(10)]

    task = HeldOutTask(Opaque())
    sel, held = list(task.val_data(4)), list(task.test_data(4))
    assert sorted(sel + held) == sorted(f"batch{i}" for i in range(10))
    assert sel
    assert held


def test_a_task_with_its_own_test_data_keeps_it() -> None:
    task, info = with_test_split(WithTest())
    assert isinstance(task, WithTest)
    assert info.source == "task.test_data"
    assert info.test_samples == 10
    assert info.val_samples == 100
    wrapped, info2 = with_test_split(Numbered())
    assert isinstance(wrapped, HeldOutTask)
    assert info2.source == "validation split"
    assert info2.val_samples + info2.test_samples == 100
    assert "held out" in info2.describe()


def test_a_shuffled_validation_set_is_noted() -> None:
    class Shuffled(Numbered):
        def val_data(self, batch_size: int) -> Iterable[Any]:
            return TensorBatches(X, Y, batch_size, shuffle=True)

    _, info = with_test_split(Shuffled())
    assert "not in a fixed order" in info.note


def test_a_compressed_file_names_the_task_inside_the_held_out_wrapper() -> None:
    """compress records the spec that rebuilds the model; the wrapper only splits the data."""
    from proftune.compress._checkpoint import task_spec

    inner = load_task("digits-mlp")
    held = HeldOutTask(inner)
    assert task_spec(held, held) == task_spec(inner, inner)
    assert "HeldOutTask" not in str(task_spec(held, held))
