"""A fingerprint of a task's training data: MD5 over its batches in a fixed order.

Its cost is bounded: the first ``FULL_BYTES`` of tensor data are hashed whole; past them each
tensor adds its dtype, shape, the sum of its values and ``SAMPLE`` values spread evenly over it
(a 2 GiB training set hashed whole took 47 s beside a 51 ms step). Any changed value changes a
sum, so a changed sample still changes the digest unless the changes cancel out exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..task import Task

#: Batch size used to walk the data; the fingerprint does not depend on the training batch size.
FINGERPRINT_BATCH = 256
FINGERPRINT_SEED = 0
#: Bytes of tensor data hashed whole before the rest is summarised.
FULL_BYTES = 16 * 2**20
#: Values of each later tensor hashed beside its sum.
SAMPLE = 64


class _Hash:
    """MD5 with a budget of bytes hashed whole."""

    def __init__(self) -> None:
        self.md5 = hashlib.md5()
        self.left = FULL_BYTES

    def tensor(self, t: torch.Tensor) -> None:
        t = t.detach()
        self.md5.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if self._whole(t.numel() * t.element_size()):
            t = t.cpu().contiguous()
            self.md5.update((t.float() if t.dtype == torch.bfloat16 else t).numpy().tobytes())
        else:
            self._summary(t)

    def array(self, a: np.ndarray) -> None:
        self.md5.update(str(a.dtype).encode())
        if self._whole(a.nbytes):
            self.md5.update(np.ascontiguousarray(a).tobytes())
        else:
            self._summary(torch.from_numpy(np.ascontiguousarray(a)))

    def _whole(self, size: int) -> bool:
        """Whether ``size`` bytes are hashed whole (the digest of data within the budget is as
        it was before the budget)."""
        if size <= self.left:
            self.left -= size
            return True
        self.left = 0
        return False

    def _summary(self, t: torch.Tensor) -> None:
        if t.dtype == torch.bool or t.is_complex():
            t = torch.view_as_real(t) if t.is_complex() else t.to(torch.uint8)
        flat = t.reshape(-1)
        step = max(1, flat.numel() // SAMPLE)
        summary = [torch.sum(flat, dtype=torch.float64).reshape(1), flat[::step][:SAMPLE].to(torch.float64)]
        self.md5.update(torch.cat(summary).cpu().numpy().tobytes())

    def feed(self, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            self.tensor(obj)
        elif isinstance(obj, np.ndarray):
            self.array(obj)
        elif isinstance(obj, (tuple, list)):
            self.md5.update(b"[")
            for item in obj:
                self.feed(item)
            self.md5.update(b"]")
        elif isinstance(obj, dict):
            self.md5.update(b"{")
            for key in sorted(obj, key=str):
                self.md5.update(str(key).encode())
                self.feed(obj[key])
            self.md5.update(b"}")
        else:
            self.md5.update(repr(obj).encode())


def data_fingerprint(task: Task, params: Mapping[str, Any] | None = None) -> str:
    """MD5 hex digest of the task's training data, walked with a fixed seed and batch size.

    The same data gives the same digest; one changed sample gives a different one (past the
    first ``FULL_BYTES``, through each tensor's sum). The global RNG state is restored
    afterwards, so fingerprinting does not change a seeded run.
    """
    h = _Hash()
    merged = {**task.default_params, **(params or {})}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FINGERPRINT_SEED)
        for batch in task.train_data(FINGERPRINT_BATCH, merged):
            h.feed(batch)
    return h.md5.hexdigest()


def short_fingerprint(digest: str | None) -> str | None:
    """The first 8 hex digits, as the fingerprint is shown."""
    return digest[:8] if digest else None
