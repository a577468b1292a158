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
from proftune.examples._digits import DigitsMLP, DigitsTransformer
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


class DeepReLU3xHe(HealthySGD):
    """Eight ReLU layers initialised at 3x He scale, trained with plain SGD: it explodes in 3 steps."""

    name = "digits-deep-relu-3x-he"
    default_params: ClassVar[dict[str, Any]] = {"optimizer": "sgd", "lr": 0.05, "batch_size": 64}

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        layers: list[nn.Module] = []
        width = 64
        for _ in range(8):
            lin = nn.Linear(width, 128)
            nn.init.normal_(lin.weight, std=3 * (2 / width) ** 0.5)
            nn.init.zeros_(lin.bias)
            layers += [lin, nn.ReLU()]
            width = 128
        return nn.Sequential(*layers, nn.Linear(width, 10))


class Memorise(HealthySGD):
    """A 512-wide MLP on 80 training images (train loss -> 0.001, validation accuracy ~0.88)."""

    name = "digits-memorise-80"
    default_params: ClassVar[dict[str, Any]] = {"optimizer": "adamw", "lr": 3e-3, "batch_size": 16,
                                                "weight_decay": 0.0, "hidden": 512}

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y, _, _ = load_split("digits")
        return TensorBatches(x[:80], y[:80], batch_size, shuffle=True)


class TanhRawFeatures(HealthySGD):
    """A tanh MLP on breast-cancer features as they come (areas in the thousands): saturated."""

    name = "breast-cancer-tanh-raw"
    default_params: ClassVar[dict[str, Any]] = {**SGD, "batch_size": 32}

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        from sklearn import datasets

        b = datasets.load_breast_cancer()
        x = torch.tensor(b.data, dtype=torch.float32)
        y = torch.tensor(b.target, dtype=torch.long)
        g = torch.Generator().manual_seed(0)
        order = torch.randperm(len(y), generator=g)
        return x[order[:455]], y[order[:455]], x[order[455:]], y[order[455:]]

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Sequential(nn.Linear(30, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y, _, _ = self._tensors()
        return TensorBatches(x, y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        _, _, x, y = self._tensors()
        return TensorBatches(x, y, batch_size, shuffle=False)


class SlowSGD(HealthySGD):
    """Plain SGD (no momentum) at lr 0.05: after 10 epochs the loss has only halved."""

    name = "digits-slow-sgd"
    default_params: ClassVar[dict[str, Any]] = {"optimizer": "sgd", "lr": 0.05, "batch_size": 64}


class NoDecay(HealthySGD):
    """SGD at lr 0.05 over batches of 8, never decayed: the loss sits on a noisy floor."""

    name = "digits-no-decay"
    default_params: ClassVar[dict[str, Any]] = {**SGD, "lr": 0.05, "batch_size": 8}


class PostLNTransformer(nn.Module):
    """Rows as tokens through a post-LayerNorm encoder (the layout that needs warm-up)."""

    def __init__(self, d_model: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d_model)
        self.pos = nn.Parameter(torch.zeros(1, 8, d_model))
        block = nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=0.0, batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(self.embed(x) + self.pos).mean(dim=1))
        return out


class PostLNNoWarmup(DigitsTransformer):
    """A post-LN Transformer at AdamW lr 0.01 from step 1 (with 20 steps of warm-up it trains)."""

    name = "digits-post-ln-no-warmup"
    default_params: ClassVar[dict[str, Any]] = {"optimizer": "adamw", "lr": 1e-2, "batch_size": 64}

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return PostLNTransformer()
