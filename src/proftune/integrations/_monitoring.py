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


def validate(every: Any, db: Any, store: Any = None) -> None:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"every must be a positive integer (sample every N-th step), but got {every=}.")
    if db is not None and not isinstance(db, str):
        raise ConfigError(f"db must be a database URL string (sqlite:///proftune.db), but got {db=}.")
    if store is not None and not isinstance(store, (str, Store)):
        raise ConfigError(f"store must be a Store, a database URL or None, but got {store=}.")
    if store is not None and db is not None:
        raise ConfigError(f"give the run store once, as store= or as db=, but got {store=} and {db=}.")


def checks(*, health: bool, adapt: bool) -> list[Callback]:
    """The fit-loop callbacks the Monitor drives: health checks, and the controllers when asked."""
    out: list[Callback] = []
    if health:
        out.append(HealthCheck())
    if adapt:
        out += [GradGuard(), AdaptiveLR()]
    return out


def new_monitor(model: nn.Module, optimizer: Any, *, every: int, callbacks: list[Callback],
                task: str) -> Monitor:
    mon = Monitor(model, optimizer, every=every, callbacks=callbacks, task=task)
    mon.__enter__()
    return mon


def error_findings(mon: Monitor) -> list[Any]:
    return [f for f in mon.findings if getattr(f, "severity", None) == "error"]


def record(mon: Monitor, *, store: Store | str | None = None, db: str | None = None, task: str,
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
