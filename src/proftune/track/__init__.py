"""Tracking: the run store, the environment and the data fingerprint of every run."""

from __future__ import annotations

from ._database import redact_url, sqlite_pragmas
from ._env import environment
from ._fingerprint import data_fingerprint, short_fingerprint
from ._lock import LOCK_FILE, FolderLock, Holder, StudyLock
from ._outputs import held_until_written, kept_files, not_held
from ._records import RunComparison, RunRecord, RunSummary
from ._run_kinds import RUN_KIND_REGISTRY, RUN_KINDS, register_run_kind
from ._store import DEFAULT_DB, RunHandle, Store, default_db_url, pid_alive, resolve_db_url
from ._tracked import open_store, optional_store, tracked_run

__all__ = [
    "DEFAULT_DB",
    "LOCK_FILE",
    "RUN_KINDS",
    "RUN_KIND_REGISTRY",
    "FolderLock",
    "Holder",
    "RunComparison",
    "RunHandle",
    "RunRecord",
    "RunSummary",
    "Store",
    "StudyLock",
    "data_fingerprint",
    "default_db_url",
    "environment",
    "held_until_written",
    "kept_files",
    "not_held",
    "open_store",
    "optional_store",
    "pid_alive",
    "redact_url",
    "register_run_kind",
    "resolve_db_url",
    "short_fingerprint",
    "sqlite_pragmas",
    "tracked_run",
]
