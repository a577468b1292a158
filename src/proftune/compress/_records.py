"""The record of one compress run: the measured baseline and candidates, the selection, the file."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._jsonsafe import json_safe
from .._records import stored_version
from ..exceptions import ConfigError
from ._checkpoint import runs_no_user_code
from ._compile import load_line_of
from ._pipeline import Candidate

__all__ = ["COMPRESS_SCHEMA_VERSION", "CompressResult"]

#: Bumped when a field of :class:`CompressResult`'s JSON changes meaning.
COMPRESS_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class CompressResult:
    """The measured baseline and candidates, the selection and where it was saved.

    A frozen, versioned record: :func:`proftune.compress` builds it, its Run holds
    :meth:`to_dict`, and the report reads it back through :meth:`from_dict`.
    """

    task: str
    metric: str
    goal: str
    max_accuracy_drop: float
    device: str
    threads: int | None
    baseline: Candidate
    candidates: list[Candidate]
    selected: Candidate | None
    output: str | None
    #: The profile's summary (totals, top layers, shares by type) as JSON.
    profile: dict[str, object]
    plan: list[str]
    #: One row per layer: layer, params, ratio, drop, module (none in a record from before it).
    sensitivity: list[Mapping[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    run_id: int | None = None
    #: The spec that rebuilds the model (the load line names it unless it is a built-in task).
    task_spec: str | None = None
    schema_version: int = COMPRESS_SCHEMA_VERSION

    @property
    def load_line(self) -> str | None:
        """The one line that loads the saved selection (no code from the file runs, and none
        that it names: a task of the user's is named in the line itself)."""
        if self.selected is None or not self.output:
            return None
        named = self.selected.format == "state" and not runs_no_user_code(self.task_spec) and self.task_spec
        return load_line_of(self.selected.format).format(path=self.output,
                                                       task=f", task={self.task_spec!r}" if named else "")

    def to_dict(self) -> dict[str, Any]:
        def cand(c: Candidate | None) -> dict[str, Any] | None:
            if c is None:
                return None
            d = c.to_dict()
            d.pop("path", None)
            return d

        return {
            "task": self.task, "metric": self.metric, "goal": self.goal,
            "max_accuracy_drop": self.max_accuracy_drop, "device": self.device,
            "threads": self.threads, "baseline": cand(self.baseline),
            "candidates": [cand(c) for c in self.candidates],
            "selected": cand(self.selected), "output": self.output, "load": self.load_line,
            "profile": self.profile, "plan": self.plan, "sensitivity": self.sensitivity,
            "notes": self.notes, "plots": self.plots, "run_id": self.run_id, "task_spec": self.task_spec,
            "schema_version": self.schema_version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompressResult:
        """The record back from :meth:`to_dict`'s JSON (a ``compress`` Run's result)."""
        # Runs recorded before the record had a version hold the same fields: version 1
        version = stored_version(d, what="a compression report", current=COMPRESS_SCHEMA_VERSION)
        if "baseline" not in d:
            raise ConfigError(f"this JSON is not a proftune compression report: schema_version={version!r}, "
                              f"keys {sorted(d)[:12]}.")
        known = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        kw["baseline"] = _candidate(d["baseline"])
        kw["candidates"] = [_candidate(c) for c in d.get("candidates") or []]
        kw["selected"] = _candidate(d["selected"]) if d.get("selected") else None
        for key in ("plan", "sensitivity", "notes", "plots"):
            kw[key] = list(d.get(key) or [])
        return cls(**kw)


def _candidate(d: Mapping[str, object]) -> Candidate:
    """A candidate from its JSON: every field it has (a missing required one is a TypeError)."""
    known = {f.name for f in dataclasses.fields(Candidate)}
    return Candidate(**{k: v for k, v in json_safe(d).items() if k in known})
