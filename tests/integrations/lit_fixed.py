"""A LightningModule with its own dataloaders and no batch_size anywhere (a fixed batch of 32)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class FixedBatch(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(128, 8, generator=g), torch.randint(0, 2, (128,), generator=g))

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"loss": nn.functional.cross_entropy(self.layer(x), y)}

    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.parameters(), lr=0.1)]

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=32)
