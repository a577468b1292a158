"""Objectives (``accuracy:max``) and constraints (``step_time_ms<50``) on task and profile metrics.

A constraint's violation is what Optuna's ``Trial.set_constraint`` takes: <= 0 feasible, > 0
infeasible, scaled by the threshold so that constraints of different units weigh alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..exceptions import ProblemCollector

__all__ = [
    "PROFILE_METRICS",
    "Constraint",
    "Objective",
    "parse_constraint",
    "parse_objective",
    "parse_targets",
]

#: Metrics measured by profiling a configuration for a few steps (no training needed).
PROFILE_METRICS = (
    "step_time_ms", "peak_memory_bytes", "throughput", "grad_var", "grad_norm",
    "params", "macs", "flops", "latency_ms", "size_bytes",
)
#: Profile metrics that need no step at all: counted from the model.
STATIC_METRICS = ("params", "macs", "flops", "size_bytes")
_MIN_WORDS = ("loss", "error", "latency", "perplexity")
_MIN_ENDINGS = ("_ms", "_s", "_bytes", "time", "params", "macs", "flops", "_var", "_norm")
_UNITS = {
    "": 1.0, "k": 1e3, "m": 1e6, "g": 1e9,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30,
    "ms": 1.0, "s": 1.0,
}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*([A-Za-z]*)\s*$")
_OPS = ("<", "<=", ">", ">=")
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
        """Checked before training, from the profile of a few steps."""
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


def default_direction(metric: str) -> str:
    """``minimize`` for losses, times, sizes and counts; ``maximize`` otherwise (accuracy, ...)."""
    low = metric.lower()
    if low == "throughput":
        return "maximize"
    if any(w in low for w in _MIN_WORDS) or low.endswith(_MIN_ENDINGS):
        return "minimize"
    return "maximize"


def parse_objective(text: str, problems: ProblemCollector) -> Objective | None:
    """``accuracy:max`` / ``val_loss:min`` / ``accuracy`` (direction from the name)."""
    name, sep, direction = str(text).strip().partition(":")
    name = name.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name):
        problems.add(f"--objective {text!r} is malformed; give METRIC or METRIC:max|min (e.g. accuracy:max).")
        return None
    if not sep:
        return Objective(name, default_direction(name))
    d = direction.strip().lower()
    if d in ("max", "maximize", "maximise"):
        return Objective(name, "maximize")
    if d in ("min", "minimize", "minimise"):
        return Objective(name, "minimize")
    problems.add(f"--objective {text!r}: direction {direction!r} is unknown; valid: max, min.")
    return None


def parse_constraint(text: str, problems: ProblemCollector) -> Constraint | None:
    """``step_time_ms<50``, ``peak_memory_bytes<=2GiB``, ``accuracy>=0.9``."""
    m = _CONSTRAINT.match(str(text))
    if not m:
        problems.add(f"--constraint {text!r} is malformed; give METRIC<VALUE, <=, > or >= "
                     "(e.g. step_time_ms<50, peak_memory_bytes<=2GiB).")
        return None
    metric, op, number, unit = m.groups()
    try:
        value = float(number)
    except ValueError:
        problems.add(f"--constraint {text!r}: {number!r} is not a number.")
        return None
    factor = _UNITS.get(unit.lower())
    if factor is None:
        problems.add(f"--constraint {text!r}: unit {unit!r} is unknown; valid: "
                     "k, M, G, KB, MB, GB, KiB, MiB, GiB (or none).")
        return None
    if not math.isfinite(value):
        problems.add(f"--constraint {text!r}: the limit must be finite.")
        return None
    return Constraint(metric, op, value * factor, f"{metric}{op}{number}{unit}")


def parse_targets(
    objectives: Iterable[str],
    constraints: Iterable[str],
    *,
    task_metrics: Sequence[str] | None,
    problems: ProblemCollector,
) -> tuple[list[Objective], list[Constraint]]:
    """Parse every objective and constraint and check their metrics exist.

    ``task_metrics`` are the names the task's evaluation returns (None: unknown, not checked).
    """
    objs = [o for o in (parse_objective(t, problems) for t in objectives) if o]
    cons = [c for c in (parse_constraint(t, problems) for t in constraints) if c]
    known = list(PROFILE_METRICS) + list(task_metrics or [])
    for kind, metric, text in ([("--objective", o.metric, o.text) for o in objs]
                               + [("--constraint", c.metric, c.text) for c in cons]):
        if task_metrics is not None and metric not in known:
            problems.add(f"{kind} {text!r}: metric {metric!r} does not exist; task metrics: "
                         f"{', '.join(task_metrics) or '(none)'}; profile metrics: {', '.join(PROFILE_METRICS)}.")
    seen: set[str] = set()
    for o in objs:
        if o.metric in seen:
            problems.add(f"--objective {o.metric!r} is given twice.")
        seen.add(o.metric)
    return objs, cons


def constraint_table(constraints: Sequence[Constraint], metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per constraint: the measured value, the limit, the violation and whether it holds."""
    out: dict[str, dict[str, Any]] = {}
    for c in constraints:
        value = metrics.get(c.metric)
        if value is None:
            out[c.text] = {"metric": c.metric, "value": None, "limit": c.threshold, "op": c.op,
                           "violation": None, "ok": None}
            continue
        v = c.violation(float(value))
        out[c.text] = {"metric": c.metric, "value": float(value), "limit": c.threshold, "op": c.op,
                       "violation": v, "ok": v <= 0}
    return out
