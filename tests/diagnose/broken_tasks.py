"""Deliberately broken digits tasks: each has one known fault that ``diagnose`` must name first.

The healthy baseline is sklearn digits with the built-in MLP and SGD (momentum 0.9) at lr 0.1,
the rate a sweep over 0.03..3 picks (10 epochs: 94% accuracy; lr 1.0 ends at chance).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from proftune.examples import TensorBatches
from proftune.examples._digits import DigitsMLP
from proftune.examples._sklearn import load_split

TUNED_LR = 0.1
SGD: dict[str, Any] = {"optimizer": "sgd", "momentum": 0.9, "lr": TUNED_LR, "batch_size": 64}


class HealthySGD(DigitsMLP):
    """The well-tuned baseline."""

    name = "digits-healthy-sgd"
    default_params: ClassVar[dict[str, Any]] = dict(SGD)


class LRTooHigh(HealthySGD):
    """Learning rate 10x the tuned one."""

    name = "digits-lr-10x"
    default_params: ClassVar[dict[str, Any]] = {**SGD, "lr": TUNED_LR * 10}


class LRTooLow(HealthySGD):
    """Learning rate 1000x below the tuned one."""

    name = "digits-lr-1000x-small"
    default_params: ClassVar[dict[str, Any]] = {**SGD, "lr": TUNED_LR / 1000}


class Unshuffled(HealthySGD):
    """Training data sorted by label and never shuffled."""

    name = "digits-unshuffled"

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y, _, _ = load_split("digits")
        order = torch.argsort(y, stable=True)
        return TensorBatches(x[order], y[order], batch_size, shuffle=False)


class BigInit(HealthySGD):
    """The middle hidden layer initialised 100x too large."""

    name = "digits-big-init"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        model = super().build_model(params)
        with torch.no_grad():
            model[3].weight.mul_(100.0)
        return model


class Log(nn.Module):
    """``log(x)``: NaN wherever x < 0 (the bug: it should be ``log1p(relu(x))``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class NaNOp(HealthySGD):
    """An op in the model that turns negative activations into NaN."""

    name = "digits-nan-op"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), Log(), nn.ReLU(), nn.Linear(128, 10)
        )


class DeadReLU(HealthySGD):
    """Hidden biases of -10 put every ReLU in its flat zero region."""

    name = "digits-dead-relu"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        model = super().build_model(params)
        with torch.no_grad():
            model[0].bias.fill_(-10.0)
            model[3].bias.fill_(-10.0)
        return model


BROKEN = {
    "lr_too_high": LRTooHigh,
    "unshuffled_data": Unshuffled,
    "exploding_gradients": BigInit,
    "nan_inf": NaNOp,
    "dead_units": DeadReLU,
    "lr_too_low": LRTooLow,
}
