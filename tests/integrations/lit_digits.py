"""A LightningModule and LightningDataModule on sklearn's digits, as users write them."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class DigitsData(L.LightningDataModule):
    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x / 16.0, dtype=torch.float32)
        y = torch.tensor(y)
        self.train_set = TensorDataset(x[:1400], y[:1400])
        self.val_set = TensorDataset(x[1400:], y[1400:])

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


class LitModel(L.LightningModule):
    def __init__(self, hidden: int = 64, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("accuracy", (logits.argmax(-1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.99)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
