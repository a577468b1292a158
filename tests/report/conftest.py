"""A run store holding one recorded run of every kind (real runs of the built-in tasks, their
step curves trimmed), so report tests render real shapes without training anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proftune.track import Store

from ._chromium import chromium_missing as chromium_missing  # where the browser tests import it from

RUNS = Path(__file__).with_name("runs.json")


def load_runs(store: Store, *, task: str | None = None) -> dict[str, int]:
    """Insert the recorded runs into ``store``; returns the new id of the first run of each kind."""
    records: list[dict[str, Any]] = json.loads(RUNS.read_text())
    ids: dict[int, int] = {}
    first: dict[str, int] = {}
    for r in records:
        new = store.start_run(r["kind"], task or r["task"], config=r["config"], env=r["env"],
                              data_fingerprint=r["data_fingerprint"], study=r["study"],
                              parent_id=ids.get(r["parent_id"]) if r["parent_id"] else None)
        ids[r["id"]] = new
        store.update_run(new, status=r["status"], started_at=r["started_at"], ended_at=r["ended_at"],
                         duration_s=r["duration_s"], metrics=r["metrics"], curves=r["curves"],
                         anomalies=r["anomalies"], artifacts=r["artifacts"], result=r["result"], error=r["error"])
        first.setdefault(r["kind"], new)
    return first


@pytest.fixture
def store(db_url: str) -> Store:
    return Store(db_url)


@pytest.fixture
def runs(store: Store) -> dict[str, int]:
    return load_runs(store)

