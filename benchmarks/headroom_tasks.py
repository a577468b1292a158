"""Tasks whose defaults are far from their best configuration (headroom), each with a test split
that no search sees: a small-data regime, noisy labels, a small transformer on a synthetic
sequence task, a breast-cancer MLP with its own ``evaluate()``, and the six of the headroom
benchmark (``benchmarks/headroom.py``, issue 45): a plateau-start CNN whose lr is 30x too low, an
MLP whose lr is 10x too high, a batch too large for small data, few-shot, 20% noisy labels, and
the small transformer.

Data ships with scikit-learn or is generated here (seeded); nothing is downloaded. Every task
splits its data once into train / val / test (fixed seeds), ``val_data`` selects and
``test_data`` reports.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from functools import cache
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

import proftune
from proftune.examples import TensorBatches, resplit_tensors

Split = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _split(x: np.ndarray, y: np.ndarray, *, n_train: int, n_val: int, seed: int) -> Split:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    tr, va, te = order[:n_train], order[n_train:n_train + n_val], order[n_train + n_val:]
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (x[tr], y[tr], x[va], y[va], x[te], y[te])]
    return t[0], t[1], t[2], t[3], t[4], t[5]


class _Split3(proftune.ClassificationTask):
    """Train / val / test tensors; subclasses build them once (``_tensors``)."""

    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 64, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 10

    def _tensors(self) -> Split:
        raise NotImplementedError(f"{type(self).__name__} must implement _tensors().")

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y, *_ = self._tensors()
        return TensorBatches(x, y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        _, _, x, y, _, _ = self._tensors()
        return TensorBatches(x, y, batch_size, shuffle=False)

    def test_data(self, batch_size: int) -> Iterable[Any]:
        *_, x, y = self._tensors()
        return TensorBatches(x, y, batch_size, shuffle=False)

    def resplit(self, index: int) -> proftune.Task | None:
        """Another partition of the training and validation samples (their labels are of one kind);
        the test split stays as it is."""
        x_tr, y_tr, x_va, y_va, x_te, y_te = self._tensors()
        (x_tr, y_tr), (x_va, y_va) = resplit_tensors((x_tr, y_tr), (x_va, y_va), index)
        other = copy.copy(self)
        other._tensors = lambda: (x_tr, y_tr, x_va, y_va, x_te, y_te)  # type: ignore[method-assign]
        return other


def _mlp(n_in: int, n_out: int, params: dict[str, Any], hidden: int = 128) -> nn.Module:
    h = int(params.get("hidden", hidden))
    p = float(params.get("dropout", 0.0))
    return nn.Sequential(nn.Linear(n_in, h), nn.ReLU(), nn.Dropout(p), nn.Linear(h, h), nn.ReLU(),
                         nn.Dropout(p), nn.Linear(h, n_out))


@cache
def _digits(n_train: int, noise: float) -> Split:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    x_tr, y_tr, x_va, y_va, x_te, y_te = _split(x, y, n_train=n_train, n_val=300, seed=1)
    if noise > 0:  # symmetric label noise on the training labels only
        g = torch.Generator().manual_seed(2)
        flip = torch.rand(len(y_tr), generator=g) < noise
        y_tr = torch.where(flip, torch.randint(0, 10, (len(y_tr),), generator=g), y_tr)
    return x_tr, y_tr, x_va, y_va, x_te, y_te


class SmallDigits(_Split3):
    """digits MLP on 150 training samples (val 300, test 1347): the defaults underfit."""

    name = "small-digits"
    description = "sklearn digits, 150 training samples, MLP (hidden=128, dropout=0.0)"

    def _tensors(self) -> Split:
        return _digits(150, 0.0)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _mlp(64, 10, params)


class NoisyDigits(_Split3):
    """digits MLP whose training labels are 40% random (val and test clean): at its defaults
    (AdamW 3e-3, batch 32, 20 epochs) it fits the noise."""

    name = "noisy-digits"
    description = "sklearn digits, 40% symmetric label noise in train, MLP"
    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-3, "batch_size": 32, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 20

    def _tensors(self) -> Split:
        return _digits(900, 0.4)

    def resplit(self, index: int) -> proftune.Task | None:
        return None  # the training labels are noisy, validation's clean: a partition of both mixes them

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _mlp(64, 10, params, hidden=256)


@cache
def _sequences() -> Split:
    """Sequences of 12 tokens over 6 symbols; the label: which of symbols 0 and 1 occurs more
    often (ties go to 0), a counting task attention solves and a bag of embeddings nearly does."""
    rng = np.random.default_rng(3)
    n = 2400
    x = rng.integers(0, 6, size=(n, 12)).astype(np.int64)
    y = ((x == 1).sum(1) > (x == 0).sum(1)).astype(np.int64)
    return _split(x, y, n_train=600, n_val=300, seed=4)


class _SeqModel(nn.Module):
    def __init__(self, d_model: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, d_model)
        self.pos = nn.Parameter(torch.zeros(1, 12, d_model))
        block = nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x) + self.pos)
        return self.head(h.mean(dim=1))  # type: ignore[no-any-return]


class SeqTransformer(_Split3):
    """A 2-layer transformer encoder counting symbols in synthetic sequences (600 train)."""

    name = "seq-transformer"
    description = "synthetic 12-token sequences, which of two symbols is more frequent; transformer"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-4, "batch_size": 64, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 6

    def _tensors(self) -> Split:
        return _sequences()

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        d_model = max(4, 4 * round(int(params.get("d_model", 32)) / 4))  # 4 heads divide it
        return _SeqModel(d_model, int(params.get("layers", 2)),
                         float(params.get("dropout", 0.1)))


@cache
def _cancer() -> Split:
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    x_tr, y_tr, x_va, y_va, x_te, y_te = _split(x, y.astype(np.int64), n_train=300, n_val=120, seed=5)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-6
    return (x_tr - mean) / std, y_tr, (x_va - mean) / std, y_va, (x_te - mean) / std, y_te


class CancerMLP(_Split3):
    """breast cancer (300 train, standardised on train), an MLP with its own evaluate()."""

    name = "cancer-mlp"
    description = "sklearn breast cancer, 300 training samples, MLP with its own evaluate()"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 32, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 6
    metric_directions: ClassVar[dict[str, str]] = {"balanced_accuracy": "max"}

    def _tensors(self) -> Split:
        return _cancer()

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _mlp(30, 2, params, hidden=32)

    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        """Accuracy and balanced accuracy, computed here rather than by the base class."""
        preds, labels = [], []
        for x, y in data:
            preds.append(model(x).argmax(-1))
            labels.append(y)
        p, t = torch.cat(preds), torch.cat(labels)
        recalls = [float((p[t == c] == c).float().mean()) for c in (0, 1) if bool((t == c).any())]
        return {"accuracy": float((p == t).float().mean()), "balanced_accuracy": sum(recalls) / len(recalls)}


@cache
def _digits16(n_train: int) -> Split:
    """digits upsampled to 16x16 (bilinear), one channel: images for a CNN."""
    x_tr, y_tr, x_va, y_va, x_te, y_te = _digits(n_train, 0.0)

    def up(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.interpolate(x.reshape(-1, 1, 8, 8), size=(16, 16), mode="bilinear",
                                         align_corners=False).contiguous()

    return up(x_tr), y_tr, up(x_va), y_va, up(x_te), y_te


class _TanhCNN(nn.Module):
    """Two tanh conv blocks and a linear head, every weight drawn with std 0.01: its loss sits at
    log(10) for its first hundred-odd steps at any small lr (a plateau start)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
                                  nn.Conv2d(width, 2 * width, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(2 * width * 16, 10))
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.normal_(m.weight, std=0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


class PlateauCNN(_Split3):
    """A tanh CNN on upsampled digits (900 train) with a plateau start; its default lr (Adam 3e-5)
    is 30x below the rates that train it in 10 epochs."""

    name = "plateau-cnn"
    description = "sklearn digits at 16x16, tanh CNN with a plateau start, lr 30x too low"
    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-5, "batch_size": 32, "optimizer": "adam"}
    default_epochs: ClassVar[int] = 10

    def _tensors(self) -> Split:
        return _digits16(900)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _TanhCNN(int(params.get("width", 8)))


class HotDigits(_Split3):
    """digits MLP (900 train) whose default lr (AdamW 0.1) is 10x too high: it trains, badly."""

    name = "lr-too-high"
    description = "sklearn digits, MLP, AdamW lr 0.1 (10x too high)"
    default_params: ClassVar[dict[str, Any]] = {"lr": 0.1, "batch_size": 32, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 8

    def _tensors(self) -> Split:
        return _digits(900, 0.0)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _mlp(64, 10, params)


class BigBatchDigits(_Split3):
    """digits MLP on 300 training samples at batch 256: two optimizer steps an epoch, and it
    underfits in its 10 epochs (the batch is too large for the data)."""

    name = "big-batch"
    description = "sklearn digits, 300 training samples, MLP, batch 256 (two steps an epoch)"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 256, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 10

    def _tensors(self) -> Split:
        return _digits(300, 0.0)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _mlp(64, 10, params)


class FewShotDigits(_Split3):
    """digits MLP on 50 training samples (about five a class), SGD-like defaults too slow for it."""

    name = "few-shot"
    description = "sklearn digits, 50 training samples, MLP"
    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-4, "batch_size": 16, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 10

    def _tensors(self) -> Split:
        return _digits(50, 0.0)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _mlp(64, 10, params)


class Noisy20Digits(NoisyDigits):
    """digits MLP whose training labels are 20% random (val and test clean); its defaults fit the noise."""

    name = "noisy-labels"
    description = "sklearn digits, 20% symmetric label noise in train, MLP"

    def _tensors(self) -> Split:
        return _digits(900, 0.2)


HEADROOM = {t.name: t for t in (SmallDigits, NoisyDigits, SeqTransformer, CancerMLP, PlateauCNN, HotDigits,
                                BigBatchDigits, FewShotDigits, Noisy20Digits)}
#: The six tasks of ``benchmarks/headroom.py``: one per way defaults are far from their best.
HEADROOM_BENCH = ("plateau-cnn", "lr-too-high", "big-batch", "few-shot", "noisy-labels", "seq-transformer")
