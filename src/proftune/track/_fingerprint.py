"""A fingerprint of a task's training data: MD5 over its batches in a fixed order."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from ..task import Task

#: Batch size used to walk the data; the fingerprint does not depend on the training batch size.
FINGERPRINT_BATCH = 256
FINGERPRINT_SEED = 0


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        if t.dtype == torch.bfloat16:
            t = t.float()
        h.update(t.numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(str(obj.dtype).encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, (tuple, list)):
        h.update(b"[")
        for item in obj:
            _feed(h, item)
        h.update(b"]")
    elif isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=str):
            h.update(str(key).encode())
            _feed(h, obj[key])
        h.update(b"}")
    else:
        h.update(repr(obj).encode())


def data_fingerprint(task: Task, params: dict[str, Any] | None = None) -> str:
    """MD5 hex digest of the task's training data, walked with a fixed seed and batch size.

    The same data gives the same digest; one changed sample gives a different one. The global
    RNG state is restored afterwards, so fingerprinting does not change a seeded run.
    """
    h = hashlib.md5()
    merged = {**task.default_params, **(params or {})}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FINGERPRINT_SEED)
        for batch in task.train_data(FINGERPRINT_BATCH, merged):
            _feed(h, batch)
    return h.hexdigest()


def short_fingerprint(digest: str | None) -> str | None:
    """The first 8 hex digits, as the fingerprint is shown."""
    return digest[:8] if digest else None
