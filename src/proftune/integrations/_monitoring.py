"""What both trainer callbacks share: the Monitor and its checks, and the ``profile`` Run they leave."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..diagnose import AdaptiveLR, GradGuard, HealthCheck
from ..exceptions import ConfigError
from ..profile import Monitor
from ..track import Store, environment, open_store
from ..train import Callback

log = logging.getLogger("proftune")


def _validate(every: Any, db: Any, store: Any = None) -> None:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"every must be a positive integer (sample every N-th step), but got {every=}.")
    if db is not None and not isinstance(db, str):
        raise ConfigError(f"db must be a database URL string (sqlite:///proftune.db), but got {db=}.")
    if store is not None and not isinstance(store, (str, Store)):
        raise ConfigError(f"store must be a Store, a database URL or None, but got {store=}.")
    if store is not None and db is not None:
        raise ConfigError(f"give the run store once, as store= or as db=, but got {store=} and {db=}.")


def _checks(*, health: bool, adapt: bool) -> list[Callback]:
    """The fit-loop callbacks the Monitor drives: health checks, and the controllers when asked."""
    out: list[Callback] = []
    if health:
        out.append(HealthCheck())
    if adapt:
        out += [GradGuard(), AdaptiveLR()]
    return out


def _record_run(mon: Monitor, *, store: Store | str | None = None, db: str | None = None, task: str,
           config: dict[str, Any], device: torch.device) -> tuple[int, dict[str, float]]:
    """Record the Monitor's profile and findings as a Run of kind ``profile``; its id and metrics."""
    store = open_store(store, db=db)
    run_id = store.start_run("profile", task, config=config, env=environment(device))
    findings = [f.to_dict() for f in mon.findings]
    for f in mon.findings:
        log.warning("proftune [%s] %s: %s (fix: %s)", f.severity, f.cause, f.summary, f.fix)
    if mon.samples == 0:
        store.finish_run(run_id, result={"findings": findings}, anomalies=findings,
                         config={**config, "note": f"no step sampled: the run had {mon.state.step} "
                                 f"step(s) and every={mon.every}"})
        return run_id, {}
    p = mon.profile
    metrics = p.metrics()
    store.finish_run(run_id, metrics=metrics, result={**p.to_dict(), "findings": findings},
                     anomalies=findings)
    return run_id, metrics


class MonitoringCallback:
    """What both trainer callbacks hold and do around their trainer's hooks: the Monitor they open
    at the start, each optimizer step, each evaluation, and the ``profile`` Run recorded at the end."""

    def __init__(self, every: int = 50, health: bool = True, adapt: bool = False, db: str | None = None,
                 *, store: Store | str | None = None, stop_on_error: bool = False) -> None:
        _validate(every, db, store)
        self.every, self.health, self.adapt, self.db, self.store = every, health, adapt, db, store
        self.stop_on_error = stop_on_error
        self.monitor: Any = None
        self.run_id: int | None = None
        self.metrics: dict[str, float] = {}
        self._open = False

    @property
    def findings(self) -> list[Any]:
        return [] if self.monitor is None else self.monitor.findings

    def _start(self, model: nn.Module, optimizer: Any) -> None:
        self.monitor = Monitor(model, optimizer, every=self.every, task=type(model).__name__,
                               callbacks=_checks(health=self.health, adapt=self.adapt))
        self.monitor.__enter__()
        self._open = True

    def _step(self, loss: torch.Tensor | None) -> bool:
        """One optimizer step seen; whether it should stop the run (``stop_on_error`` and an error found)."""
        mon = self.monitor
        mon.step(loss)
        return self.stop_on_error and mon.state.step % self.every == 0 and any(
            getattr(f, "severity", None) == "error" for f in mon.findings)

    def _evaluated(self, metrics: dict[str, float], epoch: int) -> None:
        mon = self.monitor
        mon.state.metrics, mon.state.epoch = metrics, epoch
        for cb in mon.callbacks:
            cb.on_epoch_end(mon.state)

    def _close(self, exc: BaseException | None = None) -> bool:
        """Close the Monitor once (False: not open); the Run is recorded by :meth:`_record` after it."""
        if self.monitor is None or not self._open:
            return False
        self._open = False
        self.monitor.__exit__(type(exc) if exc else None, exc, None)
        return True

    def _record(self, *, source: str, task: str, device: torch.device, **config: Any) -> None:
        mon = self.monitor
        self.run_id, self.metrics = _record_run(mon, store=self.store, db=self.db, task=task, device=device, config={
            "every": self.every, "health": self.health, "adapt": self.adapt, "source": source,
            "steps_seen": mon.state.step, **config})
