"""One way for every command to record itself as a Run: environment, fingerprint, status."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch

from ..exceptions import ConfigError
from ..task import Task
from ._env import environment
from ._fingerprint import data_fingerprint
from ._store import RunHandle, Store


def open_store(store: Store | str | None = None, *, db: str | None = None) -> Store:
    """The Store that a public function records to, resolved one way everywhere.

    ``store`` is a :class:`Store` (used as is), a database URL (opened), or None for the default
    store (``$PROFTUNE_DB``, else ``sqlite:///proftune.db``). ``db`` is the older spelling of a
    URL, still accepted; giving both is an error.
    """
    if store is not None and db is not None:
        raise ConfigError(f"give the run store once, as store= or as db=, but got {store=} and {db=}.")
    if isinstance(store, Store):
        return store
    if store is not None and not isinstance(store, str):
        raise ConfigError(f"store must be a Store, a database URL or None, but got {store=}.")
    return Store(store if store is not None else db)


def optional_store(store: Store | str | None, *, db: str | None = None) -> Store | None:
    """For functions that record only when asked: neither given stays None, else :func:`open_store`
    (``db`` the older spelling of ``store``, as there)."""
    return None if store is None and db is None else open_store(store, db=db)


@contextlib.contextmanager
def tracked_run(
    kind: str,
    task: Task,
    *,
    config: Mapping[str, object],
    device: torch.device | str | None = None,
    store: Store | str | None = None,
    db: str | None = None,
    fingerprint: bool = True,
    parent_id: int | None = None,
    study: str | None = None,
) -> Iterator[RunHandle]:
    """Open a Run of ``kind`` for ``task`` that is marked finished, or failed with its error.

    Records the environment and (unless ``fingerprint=False``) the data fingerprint; ``store``
    and ``db`` as in :func:`open_store`.
    """
    store = open_store(store, db=db)
    params = config.get("params")
    digest = data_fingerprint(task, params if isinstance(params, Mapping) else None) if fingerprint else None
    name = task.name or type(task).__name__
    with store.track(
        kind, name, config=config, env=environment(device), data_fingerprint=digest,
        parent_id=parent_id, study=study,
    ) as handle:
        yield handle
