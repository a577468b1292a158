"""Where a search's trials run: each a registered :class:`BaseSearchBackend` (this machine's
processes, a Ray cluster). A user's own backend registers the same way (``@register_backend``,
or the ``proftune.search_backends`` entry point group), and its name is then valid for
``tune --backend`` and ``search(backend=)``."""

from __future__ import annotations

import abc
import functools
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from .._machine import available_memory_bytes, cores, resident_bytes, worker_bound
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
    of it (``SearchResult.backend``: ``details`` under ``{"backend": name}``, the name the backend
    is registered under, even where it ran another backend and passed on that one's details)."""

    stopped: str
    details: Mapping[str, object] = field(default_factory=dict)


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


SEARCH_BACKEND_REGISTRY.loads_through(register_backend)


@register_backend
class _Local(BaseSearchBackend):
    """This machine: the trials in this process, or ``workers`` processes sharing the study."""

    name = "local"

    def check(self, config: SearchConfig, problems: list[str]) -> None:
        """``workers`` processes must fit this machine's memory and cores (the figures measured now)."""
        if config.workers > 1:
            why = worker_bound(config.workers, rss=resident_bytes(), available=available_memory_bytes(),
                               n_cores=cores())
            if why:
                problems.append(f"workers={config.workers} does not fit this machine: {why}.")

    def run(self, settings: SearchSettings, config: SearchConfig, *, storage: Any, store: Store,
            deadline: float | None, finished: int) -> BackendRun:
        ended = functools.partial(notify_ended, config, store, settings.tune_run_id)
        if config.workers == 1:
            stopped = str(run_worker(settings, 0, deadline, storage=storage, store=store,
                                        after_trial=ended)["stopped"])
        else:
            stopped = _run_processes(settings, config.workers, deadline, poll=ended)
        return BackendRun(stopped=stopped)


@register_backend
class _Ray(BaseSearchBackend):
    """A Ray cluster (``RayOptions``: address, scheduler, PBT)."""

    name = "ray"

    def run(self, settings: SearchSettings, config: SearchConfig, *, storage: Any, store: Store,
            deadline: float | None, finished: int) -> BackendRun:
        from ._ray import run_ray
        from ._ray_session import RayOptions

        ended = functools.partial(notify_ended, config, store, settings.tune_run_id)
        out = run_ray(settings, config.ray or RayOptions(workers=config.workers), storage=storage,
                      store=store, deadline=deadline, finished=finished, on_ended=ended)
        return BackendRun(stopped="ray", details=out)


#: Seconds a worker has to end after SIGTERM (the trial it is in is left as Optuna left it) before
#: it is killed; and how often a worker checks that the process that started it is alive.
GRACE_S = 5.0
PARENT_CHECK_S = 0.5


def _watch_parent(parent: int) -> None:
    """End this worker once the process that started it is gone (killed, even by SIGKILL): a worker
    re-parented to init would otherwise run every trial left of the search on its own."""
    import os
    import signal
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_S)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="proftune-parent-watch", daemon=True).start()


def _worker_entry(settings: SearchSettings, worker: int, deadline: float | None, threads: int,
                  parent: int | None = None) -> None:
    import torch

    from .._threads import limit_threads

    if parent is not None:
        _watch_parent(parent)
    torch.set_num_threads(threads)
    limit_threads(threads)  # the fit loop computes its count within this worker's share of the cores
    run_worker(settings, worker, deadline)


def _stop(procs: list[Any]) -> None:
    """SIGTERM every worker still running (none starts another trial), then SIGKILL the ones that
    have not ended within ``GRACE_S`` seconds; returns once all have ended."""
    import time

    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + GRACE_S
    for p in started:
        p.join(max(0.0, end - time.monotonic()))
    for p in started:
        if p.is_alive():
            p.kill()
            p.join()


def _record_interrupted(settings: SearchSettings, pids: list[int]) -> None:
    """The trials the stopped workers ``pids`` were running, recorded interrupted (their Runs and
    their Optuna trials: ``interrupt_trials``). A store that cannot be reached now leaves them to
    the next run's reaping."""
    import contextlib

    import optuna

    from ._storage import fail_interrupted, interrupt_trials, open_storage

    with contextlib.suppress(Exception):
        store = Store(settings.db)
        runs = store.list_runs(kind="trial", study=settings.study)
        mine = [r for r in runs if r.status == "running" and r.pid in pids]
        study = optuna.load_study(study_name=settings.study, storage=open_storage(settings.db))
        if mine:
            interrupt_trials(study, store, mine,
                             why="the search was interrupted (Ctrl-C or SIGTERM): its worker was stopped mid-trial")
        # a worker stopped between Optuna's start of a trial and its Run (or between its Run's end
        # and Optuna's tell) leaves the Optuna trial RUNNING with no running Run: failed as
        # interrupted too where its Run was a stopped worker's, or where it has none and no other
        # tune shares the study (another's trial may be at that moment of its own)
        by_number = {n: r for r in runs if isinstance(n := r.config.get("trial"), int)}
        alone = not [r for r in store.list_runs(kind="tune", study=settings.study, status="running")
                     if r.id != settings.tune_run_id]
        orphans = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                   if (t.number in by_number and by_number[t.number].pid in pids)
                   or (t.number not in by_number and alone)]
        if orphans:
            fail_interrupted(study, [t._trial_id for t in orphans])


def _run_processes(settings: SearchSettings, workers: int, deadline: float | None, *,
                   poll: Callable[[], None] | None = None) -> str:
    """``workers`` processes on this machine share the study through the database; ``poll`` is
    called here about every ``POLL_S`` seconds while they run, and once when they have ended."""
    ctx = mp.get_context("spawn")
    from .._threads import share_cores

    threads = share_cores(workers)  # each worker's part of the cores this process may use
    procs = [ctx.Process(target=_worker_entry, args=(settings, i, deadline, threads, os.getpid()), daemon=False)
             for i in range(workers)]
    running = list(procs)
    try:
        for p in procs:
            p.start()
        while running:
            mp_connection.wait([p.sentinel for p in running], timeout=POLL_S if poll is not None else None)
            running = [p for p in running if p.is_alive()]
            if poll is not None:
                poll()
    except BaseException as exc:  # an error, Ctrl-C or SIGTERM here ends the search: its workers too
        _stop(running)
        if isinstance(exc, KeyboardInterrupt):
            _record_interrupted(settings, [p.pid for p in procs if p.pid is not None])
        raise
    for p in procs:
        p.join()
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise RunFailedError(f"search workers ended with errors: {bad} (worker, exit code); the "
                             "finished trials are in the study, run the same command to continue.")
    return "workers_done"
