"""Communication of a DistributedDataParallel step: bytes all-reduced, time, share of the step.

A DDP communication hook wraps the default all-reduce (``default_hooks.allreduce_hook``, so
training is unchanged): it records each bucket's bytes and the moment its all-reduce starts
and completes. Buckets overlap each other and the backward pass; ``allreduce_ms`` is the time
at least one all-reduce was in flight (the union of the intervals), not their sum.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch import nn

from ._records import CommProfile

__all__ = ["CommRecorder", "is_ddp", "unwrap"]


def is_ddp(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP (or DataParallel) wrapper; the model itself otherwise."""
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return model


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total = 0.0
    end = -float("inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total * 1e3


class CommRecorder:
    """Records the all-reduces of a DDP model per step (register before its first forward).

    ``recording`` switches the bookkeeping on and off; the hook itself stays (DDP allows one
    comm hook per model and none can be removed), and costs one Python call per bucket.
    """

    def __init__(self, ddp_model: nn.Module, process_group: Any = None) -> None:
        if not is_ddp(ddp_model):
            raise TypeError(
                f"CommRecorder needs a DistributedDataParallel model, but got {type(ddp_model).__name__}."
            )
        import torch.distributed as dist

        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.backend = str(dist.get_backend(self.process_group))
        self.world_size = int(dist.get_world_size(self.process_group))
        self.recording = True
        self._lock = threading.Lock()
        self._intervals: list[tuple[float, float]] = []
        self._bytes = 0
        self._calls = 0
        #: One dict per finished step: allreduce_bytes, allreduce_ms, allreduce_calls.
        self.steps: list[dict[str, float]] = []
        ddp_model.register_comm_hook(self, CommRecorder._hook)  # type: ignore[operator]

    @staticmethod
    def _hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses a hook whose bucket annotation is not dist.GradBucket (a string here)
        # no annotations: DDP checks them at run time and rejects postponed (string) ones
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if not state.recording:
            return allreduce_hook(state.process_group, bucket)
        buf = bucket.buffer()
        nbytes = int(buf.numel() * buf.element_size())
        start = time.perf_counter()
        fut = allreduce_hook(state.process_group, bucket)

        def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            end = time.perf_counter()
            with state._lock:
                state._intervals.append((start, end))
                state._bytes += nbytes
                state._calls += 1
            return f.value()

        return fut.then(done)

    def end_step(self, step_ms: float | None = None) -> dict[str, float]:
        """Close the step's bookkeeping (call after the optimizer step); its figures.

        ``step_ms``, the wall time of this same step, gives the step's communication share.
        """
        with self._lock:
            rec = {"allreduce_bytes": float(self._bytes), "allreduce_ms": _union_ms(self._intervals),
                   "allreduce_calls": float(self._calls)}
            if step_ms is not None and step_ms > 0:
                rec["share"] = rec["allreduce_ms"] / step_ms
            self._intervals, self._bytes, self._calls = [], 0, 0
        self.steps.append(rec)
        return rec

    def discard_step(self) -> None:
        """Forget what was recorded since the last :meth:`end_step` (warm-up steps)."""
        with self._lock:
            self._intervals, self._bytes, self._calls = [], 0, 0

    def summary(self, step_ms: float) -> CommProfile:
        """Median bytes and time per recorded step, and the time's share of the step.

        The share is the median of each step's own share where the steps' times were given
        (comparing one step's all-reduce with another step's time could exceed 1); otherwise
        the median time over ``step_ms``.
        """
        from ._timing import median

        if not self.steps:
            return CommProfile(backend=self.backend, world_size=self.world_size)
        ms = median([s["allreduce_ms"] for s in self.steps])
        shares = [s["share"] for s in self.steps if "share" in s]
        share = median(shares) if shares else (ms / step_ms if step_ms > 0 else 0.0)
        return CommProfile(backend=self.backend, world_size=self.world_size,
                           allreduce_bytes=int(median([s["allreduce_bytes"] for s in self.steps])), allreduce_ms=ms,
                           allreduce_calls=int(median([s["allreduce_calls"] for s in self.steps])), share=share)
