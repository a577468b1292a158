"""What ``search`` returns: :class:`SearchResult`, a frozen, versioned record (its tune Run holds
``to_dict(trials=False)``; the report reads it back through ``from_dict``), and the
:class:`TrialTally` it keeps. A trial's own record is ``_records.TrialRecord``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .._records import record_fields, stored_version
from ..exceptions import ConfigError, ProblemCollector
from ..metrics import split_objective
from ..track import redact_url
from ._analysis import Correlation
from ._constraints import Constraint, Objective, parse_constraint
from ._records import TrialRecord
from ._reeval import Selection
from ._scan import ScanResult
from ._strategy import Statement

__all__ = ["SEARCH_SCHEMA_VERSION", "SearchResult", "TrialTally"]


#: Bumped when a field of :class:`SearchResult`'s JSON changes meaning.
SEARCH_SCHEMA_VERSION = 2  # 2: selection (noise-aware best); a version-1 record reads with None


#: The keys of :meth:`SearchResult.to_dict` that :class:`TrialTally` (and two fields) are read from.
_TALLY_KEYS = ("counts", "budget", "compute")


class Budget(TypedDict):
    """Trials that trained (what ``trials`` counts) beside those gated before training, the gated
    ones' share of all, the gated allowed, and why the workers stopped."""

    trained: int
    gated: int
    gated_share: float
    max_gated: int | None
    stopped: str | None


@dataclass(frozen=True)
class TrialTally:
    """What a study's trials add up to: by state, trained beside gated, and the seconds they took.

    Taken from the trials when the search ends and kept in :class:`SearchResult`, so that a
    result read back without its trials (a tune Run) still has them.
    """

    states: dict[str, int]
    #: Trials that trained (complete, pruned or failed in user code): what ``trials`` counts.
    trained: int
    #: Trials ended before training (the profile gate, a forbid rule).
    gated: int
    train_s: float = 0.0
    gate_s: float = 0.0
    steps: float = 0.0
    infeasible_s: float = 0.0
    infeasible_train_s: float = 0.0
    trials_s: float = 0.0

    @classmethod
    def of(cls, trials: Sequence[TrialRecord]) -> TrialTally:
        states = dict.fromkeys(("complete", "pruned", "infeasible", "failed", "running"), 0)
        for t in trials:
            states[t.state] = states.get(t.state, 0) + 1
        return cls(
            states=states, trained=sum(1 for t in trials if not t.gated and t.state != "running"),
            gated=sum(1 for t in trials if t.gated), train_s=sum(t.train_s for t in trials),
            gate_s=sum(t.gate_s for t in trials), steps=float(sum(t.steps for t in trials)),
            infeasible_s=sum(t.duration_s or 0.0 for t in trials if t.state == "infeasible"),
            infeasible_train_s=sum(t.train_s for t in trials if t.state == "infeasible"),
            trials_s=sum(t.duration_s or 0.0 for t in trials))

    @classmethod
    def read(cls, counts: Any, budget: Any, compute: Any) -> TrialTally:
        """The tally from ``to_dict``'s ``counts``, ``budget`` and ``compute``."""
        if not all(isinstance(x, Mapping) for x in (counts, budget, compute)):
            raise ConfigError("a search result's counts, budget and compute must be JSON objects, but got "
                              f"{type(counts).__name__}, {type(budget).__name__}, {type(compute).__name__}.")
        tallied = {k: budget[k] for k in ("trained", "gated") if k in budget}
        return cls(**record_fields(cls, {"states": dict(counts), **tallied, **compute}, what="a search tally",
                                   derived=("scan_s",)))


@dataclass(frozen=True)
class SearchResult:
    """What a search found: the best trial(s), every trial, and the analysis.

    A frozen, versioned record: :func:`search` builds it once its workers stop, its tune Run
    holds ``to_dict(trials=False)`` (every trial is its own ``trial`` Run and in the study:
    :func:`study_trials`), and the report reads it back through :meth:`from_dict`.
    """

    study: str
    run_id: int
    db: str
    objectives: list[Objective]
    constraints: list[Constraint]
    trials: list[TrialRecord]
    best: TrialRecord | None
    pareto: list[TrialRecord]
    #: ``{param: {target: Correlation}}`` and ``{objective: {method: {param: share}}}`` (:mod:`._analysis`).
    correlations: dict[str, dict[str, Correlation]]
    importance: dict[str, dict[str, dict[str, float | str]]]
    space_hash: str
    sampler: str
    pruner: str
    duration_s: float
    resumed: bool
    #: What the trials add up to (taken from ``trials``; kept when they are not).
    tally: TrialTally
    plots: list[str] = field(default_factory=list)
    #: The feasibility scan that restricted the space before the study (None: no scan).
    scan: ScanResult | None = None
    #: What the study says to do with each param and which param drives each constraint.
    strategy: list[Statement] = field(default_factory=list)
    #: Gated trials (ended before training) allowed before the study stops.
    max_gated: int | None = None
    #: Why the workers stopped (trials, timeout, max_gated, max_failures, grid_exhausted).
    stopped: str | None = None
    #: Under ``backend="ray"``: scheduler, experiment folder, retries, PBT schedules.
    backend: dict[str, object] = field(default_factory=lambda: {"backend": "local"})
    #: The best by its mean over repeated evaluations (None: ``reevaluate`` off, the best draw).
    selection: Selection | None = None
    schema_version: int = SEARCH_SCHEMA_VERSION

    def counts(self) -> dict[str, int]:
        """Trials by state (complete, pruned, infeasible, failed, running)."""
        return dict(self.tally.states)

    def budget(self) -> Budget:
        """Trials that trained (what ``trials`` counts) beside those gated before training."""
        total = sum(self.tally.states.values())
        return {"trained": self.tally.trained, "gated": self.tally.gated,
                "gated_share": self.tally.gated / total if total else 0.0,
                "max_gated": self.max_gated, "stopped": self.stopped}

    def compute(self) -> dict[str, float]:
        """Seconds spent training and profiling, and what went to infeasible trials."""
        t = self.tally
        return {"train_s": t.train_s, "gate_s": t.gate_s, "steps": t.steps, "infeasible_s": t.infeasible_s,
                "infeasible_train_s": t.infeasible_train_s, "trials_s": t.trials_s,
                "scan_s": self.scan.duration_s if self.scan else 0.0}

    def to_dict(self, *, trials: bool = True) -> dict[str, object]:
        """The record as JSON; ``trials=False`` leaves every trial out (the tune Run's form)."""
        return {
            "study": self.study,
            "run_id": self.run_id,
            "db": redact_url(self.db) if self.db else self.db,
            "objectives": [o.text for o in self.objectives],
            "constraints": [c.text for c in self.constraints],
            "sampler": self.sampler,
            "pruner": self.pruner,
            "space_hash": self.space_hash,
            "resumed": self.resumed,
            "best": self.best.to_dict() if self.best else None,
            "pareto": [t.to_dict() for t in self.pareto],
            "counts": self.counts(),
            "budget": self.budget(),
            "compute": self.compute(),
            "scan": self.scan.to_dict() if self.scan else None,
            "strategy": [st.to_dict() for st in self.strategy],
            **({"trials": [t.to_dict() for t in self.trials]} if trials else {}),
            "correlations": self.correlations,
            "importance": self.importance,
            "duration_s": self.duration_s,
            "plots": self.plots,
            "backend": self.backend,
            "selection": self.selection.to_dict() if self.selection else None,
            "schema_version": self.schema_version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchResult:
        """The record back from :meth:`to_dict`'s JSON (a tune Run's result: ``trials`` is then
        ``[]``, the tally and the best trials are there)."""
        stored_version(d, what="a search result", current=SEARCH_SCHEMA_VERSION)
        kw = record_fields(cls, d, what="a search result", derived=(*_TALLY_KEYS, "trials"),
                           exclude=("tally", "trials"))
        missing = [k for k in _TALLY_KEYS if k not in d]
        if missing:
            raise ConfigError(f"a search result has no {', '.join(missing)}, which its tally is read from.")
        problems = ProblemCollector()
        objectives = [Objective(*_objective(text)) for text in kw["objectives"]]
        constraints = [parse_constraint(text, problems) for text in kw["constraints"]]
        problems.raise_if_any(header="the search result record's constraints cannot be read:")
        return cls(**{
            **kw, "objectives": objectives, "constraints": [c for c in constraints if c is not None],
            "trials": [TrialRecord.from_dict(t) for t in d.get("trials") or []],
            "best": TrialRecord.from_dict(kw["best"]) if kw["best"] else None,
            "pareto": [TrialRecord.from_dict(t) for t in kw["pareto"] or []],
            "tally": TrialTally.read(d["counts"], d["budget"], d["compute"]),
            "scan": ScanResult.from_dict(kw["scan"]) if kw.get("scan") else None,
            "selection": Selection.from_dict(kw["selection"]) if kw.get("selection") else None,
            "strategy": [Statement.from_dict(x) for x in kw.get("strategy") or []],
            "max_gated": d["budget"].get("max_gated"), "stopped": d["budget"].get("stopped"),
            "plots": list(kw.get("plots") or [])})


def _objective(text: str) -> tuple[str, str]:
    """``accuracy:max`` -> ``("accuracy", "maximize")``: an objective as its record writes it."""
    name, direction = split_objective(text)
    return name, "maximize" if direction == "max" else "minimize"
