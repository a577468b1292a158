"""Objectives (``accuracy:max``) and constraints (``step_time_ms<50``) on task and profile metrics.

A constraint's violation is what Optuna's ``Trial.set_constraint`` takes: <= 0 feasible, > 0
infeasible, scaled by the threshold so that constraints of different units weigh alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._records import JsonRecord, mapping, record_fields
from .._registry import LiveSequence
from .._units import parse_quantity
from ..exceptions import ConfigError, ProblemCollector
from ..metrics import METRICS, is_known, produced_by, resolve_direction

__all__ = [
    "PROFILE_METRICS",
    "Constraint",
    "ConstraintCheck",
    "Objective",
    "parse_constraint",
    "parse_objective",
    "parse_targets",
]

# Read from the registry on each use, never at import: an installed plug-in's metric is loaded
# then (loading it while proftune is half-imported would fail), and one registered later counts.
#: Metrics measured by profiling a configuration (no training needed), from the registry.
PROFILE_METRICS = LiveSequence(lambda: tuple(name for name, m in METRICS.items() if m.is_profile))
#: Metrics the fit loop itself reports after training (the task's evaluate adds its own).
TRAIN_METRICS = LiveSequence(lambda: produced_by("train"))
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|<|>)\s*([-+.0-9][^<>=]*?)\s*$")
_TINY = 1e-9


@dataclass(frozen=True)
class Constraint:
    """``metric op threshold``; hard: a trial that breaks it is infeasible."""

    metric: str
    op: str
    threshold: float
    text: str

    @property
    def key(self) -> str:
        """The constraint's name in Optuna (``Trial.set_constraint``)."""
        return self.text.replace(" ", "")

    @property
    def is_profile(self) -> bool:
        """Checked before training, from the profile of a configuration (the registry says which)."""
        return self.metric in PROFILE_METRICS

    def violation(self, value: float) -> float:
        """<= 0 when ``value`` satisfies the constraint, else how far off, relative to the limit."""
        if not math.isfinite(value):
            return 1.0
        scale = max(abs(self.threshold), _TINY)
        if self.op in ("<", "<="):
            v = (value - self.threshold) / scale
        else:
            v = (self.threshold - value) / scale
        if self.op in ("<", ">") and v == 0.0:
            return _TINY  # a strict bound: on the limit is not inside
        return v

    def satisfied(self, value: float) -> bool:
        return self.violation(value) <= 0

    def reason(self, value: float) -> str:
        """The measured reason a trial broke this constraint."""
        negated = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}[self.op]
        return f"{self.metric}={_fmt(value)} {negated} {_fmt(self.threshold)} (constraint {self.text})"


@dataclass(frozen=True)
class Objective:
    """A metric to optimise and its direction (``maximize`` or ``minimize``)."""

    metric: str
    direction: str

    @property
    def text(self) -> str:
        return f"{self.metric}:{'max' if self.direction == 'maximize' else 'min'}"

    @property
    def is_profile(self) -> bool:
        return self.metric in PROFILE_METRICS


def _fmt(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3e}"


def parse_objective(text: str, problems: ProblemCollector, *, task: Any = None,
                    name: str = "objective") -> Objective | None:
    """``accuracy:max`` / ``val_loss:min`` / ``accuracy`` (direction from the metric registry).

    ``name`` is the caller's argument the text came from, which a problem names
    (``objective='x:up' is malformed``; :func:`proftune.search` passes ``objectives``).
    """
    metric, sep, given = str(text).strip().partition(":")
    metric = metric.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", metric):
        problems.add(f"{name}={text!r} is malformed; give METRIC or METRIC:max|min (e.g. 'accuracy:max').")
        return None
    try:
        d = resolve_direction(metric, given.strip() if sep else None, task=task)
    except ConfigError as exc:
        problems.add(f"{name}={text!r}: {exc.problems[0]}")
        return None
    return Objective(metric, "maximize" if d == "max" else "minimize")


def parse_constraint(text: str, problems: ProblemCollector, *, name: str = "constraints") -> Constraint | None:
    """``step_time_ms<50``, ``step_time_ms<1s`` (1000 ms), ``peak_memory_bytes<=2GiB``, ``accuracy>=0.9``.

    The limit is read in the metric's unit from the registry (:func:`proftune._units.parse_quantity`):
    a time metric takes ``ms``, ``s``, ``min``, a byte metric ``KiB``, ``MB``, ``GiB``, a count ``k``, ``M``.
    ``name`` is the caller's argument the text came from, which a problem names
    (``constraints='step_time_ms<<50' is malformed``).
    """
    m = _CONSTRAINT.match(str(text))
    if not m:
        problems.add(f"{name}={text!r} is malformed; give METRIC<VALUE, <=, > or >= "
                     "(e.g. 'step_time_ms<50', 'peak_memory_bytes<=2GiB').")
        return None
    metric, op, limit = m.groups()
    unit = METRICS[metric].unit if is_known(metric) else ""
    try:
        value = parse_quantity(limit, unit=unit, name=f"{name}={text!r}: limit")
    except ConfigError as exc:
        problems.problems.extend(exc.problems)
        return None
    if not math.isfinite(value):
        problems.add(f"{name}={text!r}: the limit must be finite.")
        return None
    return Constraint(metric, op, value, f"{metric}{op}{limit.replace(' ', '')}")


def parse_targets(
    objectives: Iterable[str],
    constraints: Iterable[str],
    *,
    task_metrics: Sequence[str] | None,
    problems: ProblemCollector,
    task: Any = None,
) -> tuple[list[Objective], list[Constraint]]:
    """Parse every objective and constraint and check that something produces their metrics.

    ``task_metrics`` are the names the task's evaluation returns (None: unknown, not checked);
    ``task`` may declare directions of its own metrics (``metric_directions``).
    """
    objs = [o for o in (parse_objective(t, problems, task=task, name="objectives") for t in objectives) if o]
    cons = [c for c in (parse_constraint(t, problems, name="constraints") for t in constraints) if c]
    produced = produced_metrics(task_metrics)
    for kind, metric, text in ([("objectives", o.metric, o.text) for o in objs]
                               + [("constraints", c.metric, c.text) for c in cons]):
        if task_metrics is not None and metric not in produced:
            problems.add(f"{kind}={text!r}: metric {metric!r} is produced by nothing here; task metrics: "
                         f"{', '.join(task_metrics) or '(none)'}; training: {', '.join(TRAIN_METRICS)}; "
                         f"profile metrics: {', '.join(PROFILE_METRICS)}.")
    seen: set[str] = set()
    for o in objs:
        if o.metric in seen:
            problems.add(f"objectives= names {o.metric!r} twice; give each metric once.")
        seen.add(o.metric)
    return objs, cons


def produced_metrics(task_metrics: Sequence[str] | None) -> tuple[str, ...]:
    """Every metric a trial produces: the profile's (the gate measures each), training's, the task's."""
    return (*PROFILE_METRICS, *TRAIN_METRICS, *(task_metrics or ()))


@dataclass(frozen=True)
class ConstraintCheck(JsonRecord):
    """One constraint as a trial measured it: the metric, its value (None: not measured), the
    limit, the operator, the violation (> 0: broken) and whether it holds."""

    WHAT: ClassVar[str] = "a trial's constraint"

    metric: str
    value: float | None
    limit: float
    op: str
    violation: float | None
    ok: bool | None


def constraint_table(constraints: Sequence[Constraint], metrics: Mapping[str, float]) -> dict[str, ConstraintCheck]:
    """Per constraint (by its text): the measured value, the limit, the violation and whether it holds."""
    out: dict[str, ConstraintCheck] = {}
    for c in constraints:
        value = metrics.get(c.metric)
        v = None if value is None else c.violation(float(value))
        out[c.text] = ConstraintCheck(metric=c.metric, value=None if value is None else float(value), limit=c.threshold,
                                      op=c.op, violation=v, ok=None if v is None else v <= 0)
    return out


def read_checks(table: Any, *, what: str) -> dict[str, ConstraintCheck]:
    """:func:`constraint_table`'s JSON back as records; ``what`` names the record holding it."""
    return {str(k): ConstraintCheck(**record_fields(ConstraintCheck, mapping(c, what=f"{what}'s constraint {k}"),
                                                    what=f"{what}'s constraint {k}"))
            for k, c in mapping(table, what=f"{what}'s constraints").items()}
