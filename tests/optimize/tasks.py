"""Tiny seeded tasks for the optimize tests: each trains in well under a second."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from proftune import ClassificationTask
from proftune.examples import TensorBatches


def _data(n: int = 192, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x, y


X_TRAIN, Y_TRAIN = _data(192, 0)
X_VAL, Y_VAL = _data(96, 1)


class TinyTask(ClassificationTask):
    """Two Gaussian classes split by a plane; an MLP with ``hidden`` units."""

    name = "tiny"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-2, "batch_size": 32, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 2

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        h = int(params.get("hidden", 16))
        return nn.Sequential(nn.Linear(8, h), nn.ReLU(), nn.Dropout(float(params.get("dropout", 0.0))),
                             nn.Linear(h, 2))

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return TensorBatches(X_TRAIN, Y_TRAIN, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return TensorBatches(X_VAL, Y_VAL, batch_size, shuffle=False)


class _Scaled(nn.Module):
    def __init__(self, inner: nn.Module, factor: float) -> None:
        super().__init__()
        self.inner, self.factor = inner, factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.factor


class NaNAboveLR(TinyTask):
    """Its model emits NaN whenever it is built for lr above ``LIMIT``: a region of the space."""

    name = "tiny-nan-above-lr"
    LIMIT: ClassVar[float] = 0.05

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        model = super().build_model(params)
        return _Scaled(model, float("nan")) if float(params.get("lr", 0.0)) > self.LIMIT else model


class AlwaysNaN(TinyTask):
    """A model that emits NaN at its defaults: the health stage must stop the loop."""

    name = "tiny-always-nan"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _Scaled(super().build_model(params), float("nan"))


class Flat(TinyTask):
    """Every configuration scores the same: a search over it is flat."""

    name = "tiny-flat"

    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        return {"val_loss": 0.5, "accuracy": 0.5}


class TooSlowLR(TinyTask):
    """TinyTask whose default rate is 1000x too low for its two epochs: any searched rate wins."""

    name = "tiny-slow-lr"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-5, "batch_size": 32, "optimizer": "adamw"}


class WithTestSplit(TooSlowLR):
    """TooSlowLR with a test split of its own (the held-out figures come from it)."""

    name = "tiny-with-test"

    def test_data(self, batch_size: int) -> Iterable[Any]:
        return TensorBatches(X_TEST, Y_TEST, batch_size, shuffle=False)


X_TEST, Y_TEST = _data(128, 2)


class SlowDefaults(TinyTask):
    """TinyTask whose own protocol is 30 epochs of batches that wait 0.05 s (~9 s a run): more
    than a 20 s budget holds beside a search."""

    name = "tiny-slow-defaults"
    default_epochs: ClassVar[int] = 30

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        import time

        for batch in super().train_data(batch_size, params):
            time.sleep(0.05)
            yield batch


class LoadedMidRun(TinyTask):
    """TinyTask whose batches wait ``DELAY`` s (0 at first): a test raises it mid-run, the machine
    becoming loaded after the baseline measured its pace."""

    name = "tiny-loaded"
    DELAY: ClassVar[float] = 0.0

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        import time

        for batch in super().train_data(batch_size, params):
            if LoadedMidRun.DELAY > 0:
                time.sleep(LoadedMidRun.DELAY)
            yield batch


class StepClock:
    """Injected time (``time.monotonic``): every reading is ``step`` seconds after the one before."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 1000.0, step

    def monotonic(self) -> float:
        self.t += self.step
        return self.t
