"""The record of one compress run: the measured baseline and candidates, the selection, the file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._checkpoint import LOAD_LINES, runs_no_user_code
from ._pipeline import Candidate

__all__ = ["CompressReport"]


@dataclass
class CompressReport:
    """The measured baseline and candidates, the selection and where it was saved."""

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
    profile: dict[str, Any]
    plan: list[str]
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    run_id: int | None = None
    #: The spec that rebuilds the model (the load line names it unless it is a built-in task).
    task_spec: str | None = None

    @property
    def load_line(self) -> str | None:
        """The one line that loads the saved selection (no code from the file runs, and none
        that it names: a task of the user's is named in the line itself)."""
        if self.selected is None or not self.output:
            return None
        named = self.selected.format == "state" and not runs_no_user_code(self.task_spec) and self.task_spec
        return LOAD_LINES[self.selected.format].format(path=self.output,
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
            "notes": self.notes, "plots": self.plots, "run_id": self.run_id,
        }
