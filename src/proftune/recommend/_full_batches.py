"""A view of a task whose training batches always hold exactly the asked number of samples.

Memory is a property of the batch's size, not of its content: to measure one step at batch B
the finder needs full batches, even past the end of an epoch (the last, partial batch) or
beyond the size of a small dataset (samples are then repeated). Everything else is the task's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._device import batch_size_of
from .._train_params import TrainParams
from ..task import Task, TaskWrapper


def _cat(parts: list[Any]) -> Any:
    """Concatenate batches of the same structure along the sample dimension."""
    flat = [tree_flatten(p) for p in parts]
    spec = flat[0][1]
    leaves = []
    for i, leaf in enumerate(flat[0][0]):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            leaves.append(torch.cat([f[0][i] for f in flat], dim=0))
        else:
            leaves.append(leaf)
    return tree_unflatten(leaves, spec)


def _slice(batch: Any, samples: slice) -> Any:
    leaves, spec = tree_flatten(batch)
    return tree_unflatten([t[samples] if isinstance(t, torch.Tensor) and t.dim() > 0 else t for t in leaves], spec)


class FullBatchTask(TaskWrapper):
    """``inner`` with training batches of exactly ``batch_size`` samples (cycling the data)."""

    #: Epochs of the inner data to cycle through, at most, to fill one epoch of full batches.
    max_cycles = 64

    def example_batch(self, batch_size: int) -> Any:
        """The inner task's example batch when it is full, else the first full training batch."""
        batch = self.inner.example_batch(batch_size)
        if batch_size_of(batch) == batch_size:
            return batch
        for full in self.train_data(batch_size, dict(self.default_params)):
            return full
        return batch

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterator[Any]:
        """Full batches from (at least) one pass over the data: at least two batches."""
        pending: list[Any] = []
        held = yielded = 0
        for _cycle in range(self.max_cycles):
            got_any = False
            for batch in self.inner.train_data(batch_size, params):
                n = batch_size_of(batch)
                if n == 0:
                    continue
                got_any = True
                pending.append(batch)
                held += n
                while held >= batch_size:
                    full = _cat(pending) if len(pending) > 1 else pending[0]
                    yield _slice(full, slice(None, batch_size))
                    yielded += 1
                    rest = held - batch_size
                    pending = [_slice(full, slice(batch_size, None))] if rest else []
                    held = rest
            if not got_any or yielded >= 2:
                return


def samples_per_epoch(task: Task, params: TrainParams, *, batch_size: int, stop_after: int) -> int:
    """Samples in one pass of ``task.train_data`` (counting stops once past ``stop_after``)."""
    total = 0
    for batch in task.train_data(batch_size, params.params):
        total += batch_size_of(batch)
        if total > stop_after:
            break
    return total
