"""Where the figures a user reads come from: data nothing selected on, or an honest estimate.

Selection (the search, the final race, compression) reads all of ``val_data``. The figures a
user reads come from the task's own ``test_data`` where it has one; else from the race's rounds
on the task's other partitions of its samples (:meth:`~proftune.Task.resplit`) where validation
is small and the task offers them; else from an estimate corrected for the winner's curse.
Halving a small validation set cost the selection more than the figure gained (issue 60: on
few-shot digits a choice +0.04 on its half was +0.001 on test).

:class:`HeldOutTask` (a fixed part of the validation data as ``test_data``) stays for callers
that need a test split to judge a run by from outside (benchmarks, tests); ``optimize`` does
not halve.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ._device import batch_size_of, has_rows, take_rows
from ._records import JsonRecord
from .task import Task, TaskWrapper

__all__ = ["HOLDOUT_FRACTION", "RESPLIT_BELOW", "HeldOutTask", "HoldoutInfo", "count_samples", "held_out_info",
           "with_test_split"]

#: Share of the validation samples :class:`HeldOutTask` holds out.
HOLDOUT_FRACTION = 0.5
#: The final race trains and judges on partitions of their own (where the task offers them) when
#: validation has fewer samples than this: one split's sampling noise, and the search's choice on
#: it, weigh on the decision; and its rounds after the first give the held-out figures.
RESPLIT_BELOW = 2000
#: The golden ratio's fractional part: position i is held out when frac(i * PHI) < fraction,
#: an evenly spread, deterministic choice (every window of k samples holds ~k * fraction).
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def held_out(position: int, fraction: float) -> bool:
    """Whether the sample at ``position`` of the validation order is held out."""
    return (position * _PHI) % 1.0 < fraction


@dataclass(frozen=True)
class HoldoutInfo(JsonRecord):
    """Where the held-out figures come from, and how many samples each side has."""

    WHAT: ClassVar[str] = "the held-out figures' source"

    #: "task.test_data", "resplits", "estimate" ("validation split": a record written before
    #: issue 60, when half of a small validation set was held out).
    source: str
    fraction: float | None
    val_samples: int | None
    test_samples: int | None
    note: str = ""

    @classmethod
    def from_dict(cls, d: Any) -> HoldoutInfo:
        return cls(source=str(d["source"]), fraction=d.get("fraction"), val_samples=d.get("val_samples"),
                   test_samples=d.get("test_samples"), note=str(d.get("note") or ""))

    def describe(self) -> str:
        if self.source == "task.test_data":
            return f"the task's test_data ({self.test_samples} samples)"
        if self.source == "resplits":
            return (f"the final race's rounds on the task's other partitions of its training and validation "
                    f"samples (Task.resplit; the task has no test_data): the search selected on its own split; "
                    f"selection used all {self.val_samples} validation samples")
        if self.source == "estimate":
            return (f"an estimate corrected for the winner's curse (the task has no test_data and no resplit): "
                    f"the result's gain over the defaults less the sampling error expected of the best of the "
                    f"configurations compared on the same {self.val_samples} validation samples; selection used "
                    "all of them")
        return (f"{self.test_samples} of the validation samples held out by a fixed rule (the task has no "
                f"test_data); selection used the other {self.val_samples}")


class _Split:
    """The selecting (``held=False``) or held-out (``held=True``) samples of validation batches."""

    def __init__(self, data: Iterable[Any], fraction: float, *, held: bool) -> None:
        self.data, self.fraction, self.held = data, fraction, held

    def __iter__(self) -> Iterator[Any]:
        position = 0
        for i, batch in enumerate(self.data):
            n = batch_size_of(batch)
            if n > 1 and has_rows(batch, n):
                mask = torch.tensor([held_out(position + j, self.fraction) == self.held for j in range(n)])
                position += n
                if bool(mask.any()):
                    yield take_rows(batch, mask.nonzero().flatten(), n)
            else:  # a batch whose rows cannot be taken apart goes whole to one side
                position += n
                if held_out(i, self.fraction) == self.held:
                    yield batch


class HeldOutTask(TaskWrapper):
    """``inner`` with its validation samples split: ``val_data`` selects, ``test_data`` reports."""

    def __init__(self, inner: Task, fraction: float = HOLDOUT_FRACTION) -> None:
        super().__init__(inner)
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction must be in (0, 1), but got {fraction=}.")
        self.fraction = float(fraction)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return _Split(self.inner.val_data(batch_size), self.fraction, held=False)

    def test_data(self, batch_size: int) -> Iterable[Any] | None:
        return _Split(self.inner.val_data(batch_size), self.fraction, held=True)


def count_samples(data: Iterable[Any] | None) -> int | None:
    """Samples in one pass of ``data`` (None for no data)."""
    if data is None:
        return None
    return sum(batch_size_of(b) for b in data)


def _fingerprint(data: Iterable[Any], batches: int = 3) -> str:
    h = hashlib.sha1()
    for i, batch in enumerate(data):
        if i >= batches:
            break
        stack = [batch]
        while stack:
            item = stack.pop()
            if isinstance(item, torch.Tensor):
                h.update(item.detach().cpu().contiguous().numpy().tobytes()[:65536])
            elif isinstance(item, (tuple, list)):
                stack.extend(item)
            elif isinstance(item, dict):
                stack.extend(item[k] for k in sorted(item, key=str))
    return h.hexdigest()


def held_out_info(task: Task, *, batch_size: int = 64, resplit_below: int = RESPLIT_BELOW) -> HoldoutInfo:
    """Where ``optimize``'s held-out figures of ``task`` come from: its ``test_data``; else its
    resplits (validation below ``resplit_below`` samples and :meth:`~proftune.Task.resplit`
    given); else an estimate corrected for the winner's curse. Selection uses all of validation."""
    val = count_samples(task.val_data(batch_size))
    own = task.test_data(batch_size)
    if own is not None:
        return HoldoutInfo("task.test_data", None, val, count_samples(own))
    if val is not None and val < resplit_below and task.resplit(1) is not None:
        return HoldoutInfo("resplits", None, val, None)
    return HoldoutInfo("estimate", None, val, None)


def with_test_split(task: Task, *, batch_size: int = 64,
                    fraction: float = HOLDOUT_FRACTION) -> tuple[Task, HoldoutInfo]:
    """``task`` itself when it has ``test_data``, else :class:`HeldOutTask` around it; and where
    the held-out figures will come from. For a caller that judges a run from outside (a
    benchmark, a test); ``optimize`` selects on all of validation (:func:`held_out_info`)."""
    own = task.test_data(batch_size)
    if own is not None:
        return task, HoldoutInfo("task.test_data", None, count_samples(task.val_data(batch_size)),
                                 count_samples(own))
    note = ""
    if _fingerprint(task.val_data(batch_size)) != _fingerprint(task.val_data(batch_size)):
        note = ("val_data is not in a fixed order (two passes differ), so the held-out samples change "
                "between passes: the held-out figures are not independent of the selection; give the "
                "task a test_data() or an unshuffled val_data()")
    split = HeldOutTask(task, fraction)
    return split, HoldoutInfo("validation split", fraction, count_samples(split.val_data(batch_size)),
                              count_samples(split.test_data(batch_size)), note)
