"""A study's trials handed to ``SearchConfig.on_trial`` as they end, in the process that called
:func:`proftune.search` (a W&B sink, a dashboard): each trial Run once, as soon as the Store
holds it ended, whichever process or machine trained it.

A backend calls :func:`notify_ended` when trials may have ended (the local one after each trial
in this process, about every second while worker processes run); the search calls it once more
when the backend returns, so a backend that never calls it still hands every trial over, late.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..track import RunRecord, Store
from ._config import SearchConfig

__all__ = ["TrialFeed", "notify_ended"]

#: Seconds between looks at the Store while worker processes run.
POLL_S = 1.0


class TrialFeed:
    """``on_trial`` called with each trial Run of one tune Run once; repeats are dropped."""

    def __init__(self, on_trial: Callable[[RunRecord], Any]) -> None:
        self.on_trial = on_trial
        self.seen: set[int] = set()

    def __call__(self, record: RunRecord) -> None:
        if record.id in self.seen:
            return
        self.seen.add(record.id)
        self.on_trial(record)


def notify_ended(config: SearchConfig, store: Store, tune_run_id: int | None) -> None:
    """Hand every ended trial Run of tune Run ``tune_run_id`` to ``config.on_trial``, oldest first
    (under :func:`proftune.search` it is a :class:`TrialFeed`, which drops those it had)."""
    if config.on_trial is None or tune_run_id is None:
        return
    seen = config.on_trial.seen if isinstance(config.on_trial, TrialFeed) else set()
    # the listing reads summary columns only; a new trial's whole record is read once
    ended = [r.id for r in store.list_runs(kind="trial", parent_id=tune_run_id, summary=True)
             if r.status != "running" and r.id not in seen]
    for run_id in sorted(ended):
        config.on_trial(store.get_run(run_id))
