"""Plain modules as a user writes them: a timm factory, a conv net that does not say its input
size, an MLP (its first Linear does), instances and annotated factories."""

from __future__ import annotations

import timm
import torch
from torch import nn


def make():  # no annotation, as users write it: the task calls it to see what it builds
    return timm.create_model("resnet10t", pretrained=False, num_classes=10)


def make_vit() -> nn.Module:
    return timm.create_model("test_vit", pretrained=False, num_classes=4, img_size=32)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).relu().mean((2, 3)))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


mlp = MLP()
