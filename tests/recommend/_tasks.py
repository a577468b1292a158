"""Small tasks with known answers for the recommend tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn

import proftune


class LinearRegressionTask(proftune.Task):
    """y = x·w* + ε with x ~ N(0, I_d), ε ~ N(0, σ²); loss ½·mean((x·w − y)²); w starts at w*+δ.

    The per-sample gradient is g = x(x·δ − ε), so (Isserlis' theorem for Gaussian x)
        G = E[g] = δ,                       |G|² = |δ|²,
        Σ = E[g gᵀ] − G Gᵀ = (|δ|² + σ²)·I + δ δᵀ,
        tr(Σ) = d·(|δ|² + σ²) + |δ|²,
        B_simple = tr(Σ)/|G|² = d·(1 + σ²/|δ|²) + 1.
    Each epoch draws fresh samples (the population, not a finite set), and a tiny SGD lr keeps
    w (so δ) fixed while the estimates accumulate.
    """

    name = "linreg-synthetic"
    dim: ClassVar[int] = 16
    sigma: ClassVar[float] = 1.0
    delta_sq: ClassVar[float] = 1.0
    batches_per_epoch: ClassVar[int] = 400
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-12, "optimizer": "sgd", "batch_size": 8}

    @classmethod
    def true_trace_sigma(cls) -> float:
        return cls.dim * (cls.delta_sq + cls.sigma**2) + cls.delta_sq

    @classmethod
    def true_b_simple(cls) -> float:
        return cls.true_trace_sigma() / cls.delta_sq

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        model = nn.Linear(self.dim, 1, bias=False)
        gen = torch.Generator().manual_seed(1234)
        delta = torch.randn(1, self.dim, generator=gen)
        delta *= (self.delta_sq ** 0.5) / delta.norm()
        with torch.no_grad():
            model.weight.copy_(delta)  # w* = 0, so w − w* = δ
        return model

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterator[Any]:
        for _ in range(self.batches_per_epoch):
            x = torch.randn(batch_size, self.dim)
            y = self.sigma * torch.randn(batch_size)
            yield x, y

    def val_data(self, batch_size: int) -> list[Any]:
        gen = torch.Generator().manual_seed(7)
        return [(torch.randn(batch_size, self.dim, generator=gen), torch.randn(batch_size, generator=gen))]

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return 0.5 * (model(x).squeeze(-1) - y).pow(2).mean()
