"""Where a search's trials run: each a registered :class:`BaseSearchBackend` (this machine's
processes, a Ray cluster). A user's own backend registers the same way (``@register_backend``,
or the ``proftune.search_backends`` entry point group), and its name is then valid for
``tune --backend`` and ``search(backend=)``."""

from __future__ import annotations

import abc
import multiprocessing as mp
import multiprocessing.connection as mp_connection
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from .._registry import LiveSequence, Registry
from ..exceptions import RunFailedError
from ..track import Store
from ._config import SearchConfig
from ._feed import POLL_S, notify_ended
from ._settings import SearchSettings
from ._study import run_worker

__all__ = ["SEARCH_BACKENDS", "SEARCH_BACKEND_REGISTRY", "BackendRun", "BaseSearchBackend", "register_backend"]


@dataclass(frozen=True)
class BackendRun:
    """What a backend's run did: why its workers stopped, and what the search's result records
    of it (``SearchResult.backend``: at least ``{"backend": name}``)."""

    stopped: str
    details: dict[str, Any] = field(default_factory=dict)


class BaseSearchBackend(abc.ABC):
    """Runs the study's remaining trials; every trial lands in the study (Optuna's storage on the
    Store's database) and the Store, as ``run_worker`` does them.

    A backend that can say when trials have ended calls ``proftune.search.notify_ended(config,
    store, settings.tune_run_id)`` then (in the process that called the search): ``config.on_trial``
    gets each trial as it ends; otherwise the search hands them over when ``run`` returns."""

    #: The key ``--backend`` and ``search(backend=)`` take.
    name: ClassVar[str] = ""

    def check(self, config: SearchConfig, problems: list[str]) -> None:  # noqa: B027  (optional hook)
        """Add what this backend cannot do with ``config`` to ``problems`` (before any work)."""

    @abc.abstractmethod
    def run(self, settings: SearchSettings, config: SearchConfig, *, storage: Any, store: Store,
            deadline: float | None, finished: int) -> BackendRun:
        """Run trials until ``settings`` says stop or ``deadline`` (``time.time()``) passes;
        ``finished``: trials the study holds already."""


#: Every backend by name.
SEARCH_BACKEND_REGISTRY: Registry[BaseSearchBackend] = Registry(
    "search backend", key=lambda b: b.name, entry_points="proftune.search_backends")
#: The valid ``--backend`` keys, read from the registry.
SEARCH_BACKENDS = LiveSequence(lambda: SEARCH_BACKEND_REGISTRY.names())

B = TypeVar("B")


def register_backend(backend: B) -> B:
    """Register a :class:`BaseSearchBackend` subclass (built with no arguments) or instance; usable
    as a class decorator."""
    return SEARCH_BACKEND_REGISTRY.add_named(backend, base=BaseSearchBackend, arg="backend",
                        public="proftune.search.BaseSearchBackend")


@register_backend
class _Local(BaseSearchBackend):
    """This machine: the trials in this process, or ``workers`` processes sharing the study."""

    name = "local"

    def run(self, settings: SearchSettings, config: SearchConfig, *, storage: Any, store: Store,
            deadline: float | None, finished: int) -> BackendRun:
        def ended() -> None:
            notify_ended(config, store, settings.tune_run_id)

        if config.workers == 1:
            stopped = str(run_worker(settings, 0, deadline, storage=storage, after_trial=ended)["stopped"])
        else:
            stopped = _run_processes(settings, config.workers, deadline, poll=ended)
        return BackendRun(stopped=stopped, details={"backend": self.name})


@register_backend
class _Ray(BaseSearchBackend):
    """A Ray cluster (``RayOptions``: address, scheduler, PBT)."""

    name = "ray"

    def run(self, settings: SearchSettings, config: SearchConfig, *, storage: Any, store: Store,
            deadline: float | None, finished: int) -> BackendRun:
        from ._ray import RayOptions, run_ray

        def ended() -> None:
            notify_ended(config, store, settings.tune_run_id)

        out = run_ray(settings, config.ray or RayOptions(workers=config.workers), storage=storage,
                      store=store, deadline=deadline, finished=finished, on_ended=ended)
        return BackendRun(stopped="ray", details=out)


def _worker_entry(settings: SearchSettings, worker: int, deadline: float | None, threads: int) -> None:
    import torch

    from .._threads import limit_threads

    torch.set_num_threads(threads)
    limit_threads(threads)  # the fit loop computes its count within this worker's share of the cores
    run_worker(settings, worker, deadline)


def _run_processes(settings: SearchSettings, workers: int, deadline: float | None, *,
                   poll: Callable[[], None] | None = None) -> str:
    """``workers`` processes on this machine share the study through the database; ``poll`` is
    called here about every ``POLL_S`` seconds while they run, and once when they have ended."""
    ctx = mp.get_context("spawn")
    from .._threads import share_cores

    threads = share_cores(workers)  # each worker's part of the cores this process may use
    procs = [ctx.Process(target=_worker_entry, args=(settings, i, deadline, threads), daemon=False)
             for i in range(workers)]
    for p in procs:
        p.start()
    running = list(procs)
    try:
        while running:
            mp_connection.wait([p.sentinel for p in running], timeout=POLL_S if poll is not None else None)
            running = [p for p in running if p.is_alive()]
            if poll is not None:
                poll()
    except Exception:  # the observer's error ends the search: its workers too
        for p in running:
            p.terminate()
            p.join()
        raise
    for p in procs:
        p.join()
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise RunFailedError(f"search workers ended with errors: {bad} (worker, exit code); the "
                             "finished trials are in the study, run the same command to continue.")
    return "workers_done"
