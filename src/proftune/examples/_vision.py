"""ResNet-18 from torchvision, randomly initialised, on random 3x224x224 inputs.

For profiling and pruning a real architecture without weights or data from a hub; its
accuracy is meaningless (random labels) and is reported only so that every task has one.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any, ClassVar, cast

import torch
from torch import nn

from .._optional import require
from ..task import ClassificationTask
from ._data import TensorBatches

_N_TRAIN, _N_VAL, _CLASSES = 64, 16, 1000


@lru_cache(maxsize=2)
def _synthetic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 224, 224, generator=g), torch.randint(0, _CLASSES, (n,), generator=g)


class ResNet18Synthetic(ClassificationTask):
    name = "resnet18-synthetic"
    description = "torchvision ResNet-18, random init, random 3x224x224 inputs (needs torchvision)"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 8, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 1

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        models = require("torchvision.models", feature=f"task {self.name!r}")
        return cast(nn.Module, models.resnet18(weights=None, num_classes=_CLASSES))

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y = _synthetic(_N_TRAIN, 0)
        return TensorBatches(x, y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        x, y = _synthetic(_N_VAL, 1)
        return TensorBatches(x, y, batch_size, shuffle=False)
