"""Built-in tasks on scikit-learn's digits: an MLP, a CNN and a small Transformer encoder."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, cast

import torch
from torch import nn

from ..task import ClassificationTask
from ._data import TensorBatches
from ._sklearn import load_split


class _DigitsTask(ClassificationTask):
    """Shared data handling; subclasses say how an 8x8 image is shaped for their model."""

    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 64, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 10
    input_shape: ClassVar[tuple[int, ...]] = (64,)

    def _tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x_tr, y_tr, x_va, y_va = load_split("digits")
        shape = self.input_shape
        return x_tr.reshape(-1, *shape), y_tr, x_va.reshape(-1, *shape), y_va

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y, _, _ = self._tensors()
        return TensorBatches(x, y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        _, _, x, y = self._tensors()
        return TensorBatches(x, y, batch_size, shuffle=False)


class DigitsMLP(_DigitsTask):
    name = "digits-mlp"
    description = "sklearn digits, MLP (params: hidden=128, depth=2, dropout=0.0)"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        hidden = int(params.get("hidden", 128))
        depth = int(params.get("depth", 2))
        dropout = float(params.get("dropout", 0.0))
        layers: list[nn.Module] = []
        width_in = 64
        for _ in range(depth):
            layers += [nn.Linear(width_in, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width_in = hidden
        layers.append(nn.Linear(width_in, 10))
        return nn.Sequential(*layers)


class DigitsCNN(_DigitsTask):
    name = "digits-cnn"
    description = "sklearn digits as 1x8x8 images, CNN (params: width=16, dropout=0.0)"
    input_shape = (1, 8, 8)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        w = int(params.get("width", 16))
        dropout = float(params.get("dropout", 0.0))

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

        return nn.Sequential(
            *block(1, w),
            *block(w, 2 * w),
            nn.MaxPool2d(2),  # 4x4
            *block(2 * w, 4 * w),
            nn.MaxPool2d(2),  # 2x2
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(16 * w, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block; attention runs through scaled_dot_product_attention."""

    def __init__(self, d_model: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Linear(ff, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        # need_weights=False sends MultiheadAttention through F.scaled_dot_product_attention
        attn, _ = self.attn(h, h, h, need_weights=False)
        x = x + self.drop(attn)
        return cast(torch.Tensor, x + self.drop(self.ff(self.norm2(x))))


class RowTransformer(nn.Module):
    """Each 8x8 image as a sequence of 8 row tokens: embed, encode, mean-pool, classify."""

    def __init__(self, *, d_model: int, heads: int, layers: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d_model)
        self.pos = nn.Parameter(torch.zeros(1, 8, d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(d_model, heads, ff, dropout) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.embed(x) + self.pos)
        return cast(torch.Tensor, self.head(self.norm(h).mean(dim=1)))


class DigitsTransformer(_DigitsTask):
    name = "digits-transformer"
    description = (
        "sklearn digits, rows as tokens, Transformer encoder "
        "(params: d_model=32, heads=4, layers=2, ff=64, dropout=0.0)"
    )
    input_shape = (8, 8)
    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-3, "batch_size": 64, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 15

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return RowTransformer(
            d_model=int(params.get("d_model", 32)),
            heads=int(params.get("heads", 4)),
            layers=int(params.get("layers", 2)),
            ff=int(params.get("ff", 64)),
            dropout=float(params.get("dropout", 0.0)),
        )
