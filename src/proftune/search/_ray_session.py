"""Connecting to Ray for a study: the lazy import, :class:`RayOptions` (the schedulers a study can
ask for), the session (a local instance kept on loopback, or a cluster's address) and the
experiment's folder (a resumed one, or the next free one)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..exceptions import ConfigError, DependencyError
from ._settings import SearchSettings

__all__ = ["SCHEDULERS", "RayOptions"]


SCHEDULERS = ("fifo", "asha", "pbt")


def _ray() -> Any:
    """Import Ray quietly, usage stats off; a missing install is a :class:`DependencyError`."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # nothing leaves the machine (issue 14)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # intermediate reports carry the per-epoch metric, the last one the objective values
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ray
            from ray import tune  # noqa: F401
    except ImportError as exc:
        raise DependencyError(
            "backend='ray' needs Ray Tune, which is not installed; install the extra: "
            "pip install 'proftune[ray]'.") from exc
    for name in ("ray", "ray.tune", "ray.train", "ray.air", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return ray


class RayOptions:
    """How to run on Ray: where (``address``), how wide (``workers``), which scheduler."""

    def __init__(self, *, address: str | None = None, scheduler: str = "fifo", workers: int = 1,
                 storage_path: str | Path | None = None, max_retries: int = 2,
                 population: int | None = None, perturbation_interval: int = 1,
                 debug: bool = False) -> None:
        if scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler={scheduler!r} is unknown; valid: {', '.join(SCHEDULERS)}.")
        if workers < 1:
            raise ConfigError(f"workers={workers!r} must be >= 1.")
        if address is not None and address != "auto" and ":" not in address:
            raise ConfigError(f"address={address!r} is malformed; give 'auto' or 'HOST:PORT'.")
        self.address, self.scheduler, self.workers = address, scheduler, int(workers)
        self.storage_path = Path(storage_path) if storage_path else None
        self.max_retries, self.population = int(max_retries), population
        self.perturbation_interval, self.debug = int(perturbation_interval), debug


def experiment_dir(settings: SearchSettings, options: RayOptions) -> Path:
    root = options.storage_path or Path(os.environ.get("PROFTUNE_RAY_DIR", "proftune-ray"))
    return (root / settings.study).resolve()


def next_folder(folder: Path) -> Path:
    """``STUDY-2``, ``STUDY-3``, ...: the first beside ``folder`` that holds no experiment."""
    from ray import tune

    n = 2
    while tune.Tuner.can_restore(str(folder.with_name(f"{folder.name}-{n}"))):
        n += 1
    return folder.with_name(f"{folder.name}-{n}")


def _on_loopback(address: str | None) -> bool:
    """A local instance, or a cluster on this machine's loopback (``127.0.0.1:P``)."""
    return address is None or address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")


@contextlib.contextmanager
def _loopback_node_ip() -> Iterator[None]:
    """While Ray starts or joins: this node's address is 127.0.0.1, never the outward one.

    Ray resolves a loopback ``_node_ip_address`` to the machine's outward-facing address unless
    its switch ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is off; that env var is read once, when Ray
    is first imported, so the switch is flipped here for the start only. With the node on
    127.0.0.1, Ray's servers (GCS, raylet, workers, agents) listen on loopback only.
    """
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@contextlib.contextmanager
def ray_session(options: RayOptions) -> Iterator[Any]:
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs: dict[str, object] = {"include_dashboard": False, "log_to_driver": options.debug,
                                  "logging_level": logging.DEBUG if options.debug else logging.ERROR,
                                  "configure_logging": options.debug, "ignore_reinit_error": True}
        if options.address:
            kwargs["address"] = options.address
        else:  # a new instance of our own, even where another cluster runs on this machine
            kwargs["address"] = "local"
            kwargs["num_cpus"] = options.workers
        loopback = _on_loopback(options.address)
        if loopback:
            kwargs["_node_ip_address"] = "127.0.0.1"
        handler = signal.getsignal(signal.SIGTERM)
        with warnings.catch_warnings(), (_loopback_node_ip() if loopback else contextlib.nullcontext()):
            warnings.simplefilter("ignore")
            ray.init(**kwargs)
        if callable(handler) and threading.current_thread() is threading.main_thread():
            # ray.init puts its own SIGTERM handler in (it aborts the driver: exit -6, the trials
            # left running); the caller's (the CLI's: an interrupt) is the one that records them
            signal.signal(signal.SIGTERM, handler)
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()
