"""Tracking: the run store, the environment and the data fingerprint of every run."""

from __future__ import annotations

from ._env import environment
from ._fingerprint import data_fingerprint, short_fingerprint
from ._store import DEFAULT_DB, RUN_KINDS, RunHandle, RunRecord, Store, default_db_url
from ._tracked import tracked_run

__all__ = [
    "DEFAULT_DB",
    "RUN_KINDS",
    "RunHandle",
    "RunRecord",
    "Store",
    "data_fingerprint",
    "default_db_url",
    "environment",
    "short_fingerprint",
    "tracked_run",
]
