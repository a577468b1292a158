"""Built-in task on scikit-learn's wine data: an MLP on 13 standardised features."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from torch import nn

from ..task import ClassificationTask
from ._data import TensorBatches
from ._sklearn import load_split


class WineMLP(ClassificationTask):
    name = "wine-mlp"
    description = "sklearn wine, 13 features, 3 classes, MLP (params: hidden=64, dropout=0.0)"
    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-3, "batch_size": 16, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 30

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        hidden = int(params.get("hidden", 64))
        dropout = float(params.get("dropout", 0.0))
        return nn.Sequential(
            nn.Linear(13, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 3),
        )

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y, _, _ = load_split("wine")
        return TensorBatches(x, y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        _, _, x, y = load_split("wine")
        return TensorBatches(x, y, batch_size, shuffle=False)
