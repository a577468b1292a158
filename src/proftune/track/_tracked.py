"""One way for every command to record itself as a Run: environment, fingerprint, status."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..task import Task
from ._env import environment
from ._fingerprint import data_fingerprint
from ._store import RunHandle, Store


@contextlib.contextmanager
def tracked_run(
    kind: str,
    task: Task,
    *,
    config: dict[str, Any],
    device: torch.device | str | None = None,
    store: Store | None = None,
    db: str | None = None,
    fingerprint: bool = True,
    parent_id: int | None = None,
    study: str | None = None,
) -> Iterator[RunHandle]:
    """Open a Run of ``kind`` for ``task`` that is marked finished, or failed with its error.

    Records the environment and (unless ``fingerprint=False``) the data fingerprint.
    """
    store = store or Store(db)
    digest = data_fingerprint(task, config.get("params")) if fingerprint else None
    name = task.name or type(task).__name__
    with store.track(
        kind, name, config=config, env=environment(device), data_fingerprint=digest,
        parent_id=parent_id, study=study,
    ) as handle:
        yield handle
