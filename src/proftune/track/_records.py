"""A run as the Store holds it: :class:`RunRecord`, read from a row of the runs table, and the
statuses a run can have."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

__all__ = ["RUN_STATUSES", "RunComparison", "RunRecord", "RunSummary"]


#: ``interrupted``: ended by Ctrl-C or SIGTERM (the CLI handles both alike), not by an error.
RUN_STATUSES = ("running", "finished", "failed", "interrupted")


class RunSummary(TypedDict):
    """The columns of a run a listing shows (:meth:`RunRecord.summary`); the data fingerprint's
    first 8 characters."""

    run_id: int
    kind: str
    task: str
    status: str
    started_at: str
    duration_s: float | None
    data_fingerprint: str | None
    metrics: dict[str, object]
    study: str | None
    parent_id: int | None


class Pair(TypedDict):
    """A key's value in two runs, ``a`` and ``b`` (None: the run has no such key)."""

    a: object
    b: object


class MetricDelta(Pair):
    """A metric in two runs and ``b - a`` (None: either is not a number)."""

    delta: float | None


class TaskPair(TypedDict):
    a: str
    b: str
    same: bool


class FingerprintPair(TypedDict):
    a: str | None
    b: str | None
    match: bool


class RunComparison(TypedDict):
    """Two runs compared (:meth:`Store.compare`): their ids and tasks, the config and environment
    keys that differ (the environment's flattened, ``packages.torch``), the first 8 characters of
    their data fingerprints (``match``: the same data) and every metric with its delta."""

    a: int
    b: int
    task: TaskPair
    config: dict[str, Pair]
    env: dict[str, Pair]
    data_fingerprint: FingerprintPair
    metrics: dict[str, MetricDelta]


@dataclass
class RunRecord:
    """One run as stored; its JSON columns as read back (values of any JSON type: readers check)."""

    id: int
    kind: str
    task: str
    status: str
    started_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    error: str | None = None
    host: str | None = None
    pid: int | None = None
    parent_id: int | None = None
    study: str | None = None
    env: dict[str, object] = field(default_factory=dict)
    data_fingerprint: str | None = None
    config: dict[str, object] = field(default_factory=dict)
    metrics: dict[str, object] = field(default_factory=dict)
    curves: dict[str, object] = field(default_factory=dict)
    anomalies: list[object] = field(default_factory=list)
    artifacts: dict[str, object] = field(default_factory=dict)
    result: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["run_id"] = d["id"]
        fp = d.pop("data_fingerprint")
        d["data_fingerprint"] = fp[:8] if fp else None
        d["data_md5"] = fp
        return d

    def curve(self, name: str) -> list[Mapping[str, Any]]:
        """The points of the curve ``name`` that are JSON objects (a step's, an epoch's row); [] for none."""
        points = self.curves.get(name)
        return [p for p in points if isinstance(p, Mapping)] if isinstance(points, list) else []

    def summary(self) -> RunSummary:
        """The columns a listing shows."""
        return {
            "run_id": self.id, "kind": self.kind, "task": self.task, "status": self.status,
            "started_at": self.started_at, "duration_s": self.duration_s,
            "data_fingerprint": self.data_fingerprint[:8] if self.data_fingerprint else None,
            "metrics": self.metrics, "study": self.study, "parent_id": self.parent_id,
        }


def record_from_row(row: Any) -> RunRecord:
    def js(value: Any, default: Any) -> Any:
        if value is None:
            return default
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value

    return RunRecord(
        id=row["id"], kind=row["kind"], task=row["task"], status=row["status"],
        started_at=row["started_at"], ended_at=row.get("ended_at"), duration_s=row.get("duration_s"),
        error=row.get("error"), host=row.get("host"), pid=row.get("pid"), parent_id=row.get("parent_id"),
        study=row.get("study"), env=js(row.get("env"), {}), data_fingerprint=row.get("data_fingerprint"),
        config=js(row.get("config"), {}), metrics=js(row.get("metrics"), {}),
        curves=js(row.get("curves"), {}), anomalies=js(row.get("anomalies"), []),
        artifacts=js(row.get("artifacts"), {}), result=js(row.get("result"), {}),
    )


def flatten_dict(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_dict(v, key + "."))
        else:
            out[key] = v
    return out


def diff_dicts(a: Mapping[str, object], b: Mapping[str, object]) -> dict[str, Pair]:
    """Keys whose values differ: ``{key: {"a": ..., "b": ...}}`` (missing is None)."""
    return {k: {"a": a.get(k), "b": b.get(k)} for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
