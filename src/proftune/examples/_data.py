"""In-memory batches for the built-in tasks: fast, seeded through torch's global RNG."""

from __future__ import annotations

from collections.abc import Iterator

import torch


class TensorBatches:
    """Batches ``(x[i], y[i])`` of ``batch_size`` rows; shuffled each pass when ``shuffle``.

    The shuffle draws from torch's global RNG, which the fit loop seeds, so a seeded run sees
    the same order every time.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, *, shuffle: bool) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, but got {batch_size=}.")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x and y differ in length: {x.shape[0]} != {y.shape[0]}.")
        self.x, self.y = x, y
        self.batch_size = int(batch_size)
        self.shuffle = shuffle

    def __len__(self) -> int:
        return (self.x.shape[0] + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = self.x.shape[0]
        order = torch.randperm(n) if self.shuffle else torch.arange(n)
        for start in range(0, n, self.batch_size):
            idx = order[start : start + self.batch_size]
            yield self.x[idx], self.y[idx]


def resplit_tensors(train: tuple[torch.Tensor, ...], val: tuple[torch.Tensor, ...],
                    index: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Partition ``index`` of the pooled rows of ``train`` and ``val`` (each a tuple of tensors of
    one length, as ``(x, y)``) into sets of their own sizes, seeded by ``index``; index 0 is
    ``(train, val)`` unchanged. For :meth:`proftune.Task.resplit`."""
    if len(train) != len(val):
        raise ValueError(f"train and val must hold as many tensors; got {len(train)} and {len(val)}.")
    if index == 0:
        return train, val
    n_train = int(train[0].shape[0])
    pooled = [torch.cat([a, b]) for a, b in zip(train, val, strict=True)]
    order = torch.randperm(int(pooled[0].shape[0]), generator=torch.Generator().manual_seed(int(index)))
    first, rest = order[:n_train], order[n_train:]
    return tuple(t[first] for t in pooled), tuple(t[rest] for t in pooled)
