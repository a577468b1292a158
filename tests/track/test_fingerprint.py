"""The data fingerprint costs a bounded share of a profile: past a budget of bytes hashed whole,
each tensor gives a summary; the same data still gives the same digest and a changed sample a
different one."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import proftune
from proftune.task import load_task
from proftune.track import _fingerprint
from proftune.track._fingerprint import FULL_BYTES, data_fingerprint


class _Big(proftune.Task):
    """A training set of 4 x FULL_BYTES of float32 (64 MiB), in batches as a task gives them."""

    name = "big"
    rows = 4 * FULL_BYTES // (4 * 64)

    def __init__(self, change: int | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(self.rows, 64, generator=g)
        if change is not None:
            self.x[change, 3] += 0.5
        self.y = np.arange(self.rows) % 10

    def build_model(self, params: dict) -> torch.nn.Module:
        return torch.nn.Linear(64, 10)

    def train_data(self, batch_size: int, params: dict) -> Iterator[Any]:
        for i in range(0, self.rows, 4096):
            yield self.x[i:i + 4096], self.y[i:i + 4096]

    def val_data(self, batch_size: int) -> list:
        return []

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return model(batch[0]).sum()


def test_hashing_is_bounded_and_still_tells_data_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    hashed = 0
    real = hashlib.md5

    class Counting:
        def __init__(self) -> None:
            self.h = real()

        def update(self, b: bytes) -> None:
            nonlocal hashed
            hashed += len(b)
            self.h.update(b)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    monkeypatch.setattr(_fingerprint.hashlib, "md5", Counting)
    same = data_fingerprint(_Big())
    data = 4 * FULL_BYTES
    assert hashed < FULL_BYTES + data // 20, (hashed, data)  # before: every byte of it (and the labels)
    assert data_fingerprint(_Big()) == same
    late = _Big.rows - 5  # a sample far past the bytes hashed whole
    assert data_fingerprint(_Big(change=late)) != same
    assert data_fingerprint(_Big(change=1)) != same


def test_small_data_is_hashed_whole_as_before() -> None:
    task = load_task("digits-mlp")
    h = hashlib.md5()
    params = dict(task.default_params)
    torch.manual_seed(_fingerprint.FINGERPRINT_SEED)

    def feed(obj: Any) -> None:  # the digest as it was computed before the budget
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous()
            h.update(str(t.dtype).encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.numpy().tobytes())
        elif isinstance(obj, (tuple, list)):
            h.update(b"[")
            for item in obj:
                feed(item)
            h.update(b"]")
        else:
            h.update(repr(obj).encode())

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_fingerprint.FINGERPRINT_SEED)
        for batch in task.train_data(_fingerprint.FINGERPRINT_BATCH, params):
            feed(batch)
    assert data_fingerprint(task) == h.hexdigest()
