"""A diagnosis: one :class:`Finding` per suspected cause, and the ranking that puts the root first.

A finding carries its evidence (the measured numbers, the step and the layer), a severity and a
fix. Ranking is by likelihood: each check gives a confidence, and a finding whose symptoms another
finding explains (a NaN that followed exploding gradients, a plateau behind dead ReLUs) is
demoted below it, so the first finding is the root cause an engineer should fix first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..exceptions import ConfigError

__all__ = ["CAUSES", "SEVERITIES", "Finding", "rank_findings"]

#: Every cause a check can name, in the order an engineer follows them for a bad loss curve.
CAUSES = (
    "lr_too_high",
    "unshuffled_data",
    "exploding_gradients",
    "vanishing_gradients",
    "dead_units",
    "nan_inf",
    "overfitting",
    "lr_too_low",
    "batchnorm_small_batch",
)
SEVERITIES = ("info", "warning", "error")
_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: Which causes can produce the symptoms of which: ``explains[a]`` are the causes whose findings
#: a finding of ``a`` can account for when they started no earlier than it did.
_EXPLAINS: dict[str, tuple[str, ...]] = {
    "lr_too_high": ("exploding_gradients", "nan_inf", "dead_units", "lr_too_low", "overfitting"),
    "unshuffled_data": ("lr_too_high", "exploding_gradients", "dead_units", "lr_too_low",
                        "overfitting", "nan_inf"),
    "exploding_gradients": ("lr_too_high", "nan_inf", "dead_units", "lr_too_low"),
    "nan_inf": ("lr_too_high", "exploding_gradients", "dead_units", "lr_too_low"),
    "dead_units": ("vanishing_gradients", "lr_too_low"),
    "vanishing_gradients": ("lr_too_low",),
    "batchnorm_small_batch": ("lr_too_high", "overfitting"),
    "lr_too_low": (),
    "overfitting": (),
}
#: Demotion factor of the confidence of an explained finding.
_EXPLAINED_FACTOR = 0.5


@dataclass(frozen=True)
class Finding:
    """One suspected cause of bad training, with the measurements behind it.

    ``confidence`` (0..1) is the check's belief that this is a real cause; ``step`` is the
    optimizer step at which the symptom was first seen (its onset) and ``layer`` the module path
    it points at, when it points at one.
    """

    cause: str
    severity: str
    summary: str
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    confidence: float = 0.5
    step: int | None = None
    layer: str | None = None
    explained_by: str | None = None
    #: The check saw a root cause of this run (it explains other findings whatever their
    #: confidence); not part of the record, only of the ranking.
    root: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = []
        if self.cause not in CAUSES:
            problems.append(f"cause={self.cause!r} is unknown; valid: {', '.join(CAUSES)}.")
        if self.severity not in SEVERITIES:
            problems.append(f"severity={self.severity!r} is unknown; valid: {', '.join(SEVERITIES)}.")
        if not 0.0 <= self.confidence <= 1.0:
            problems.append(f"confidence must be in [0, 1], but got confidence={self.confidence}.")
        if problems:
            raise ConfigError(problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause, "severity": self.severity, "summary": self.summary,
            "evidence": {**self.evidence, "step": self.step, "layer": self.layer},
            "fix": self.fix, "confidence": round(self.confidence, 3), "explained_by": self.explained_by,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        evidence = dict(d.get("evidence", {}))
        step, layer = evidence.pop("step", None), evidence.pop("layer", None)
        return cls(cause=d["cause"], severity=d["severity"], summary=d.get("summary", ""),
                   fix=d.get("fix", ""), evidence=evidence, confidence=float(d.get("confidence", 0.5)),
                   step=step, layer=layer, explained_by=d.get("explained_by"))


def _onset(f: Finding) -> float:
    return float(f.step) if f.step is not None else math.inf


def rank_findings(findings: Iterable[Finding], *, roots: Sequence[str] = ()) -> list[Finding]:
    """Most likely cause first; one finding per cause (the most confident one).

    A finding is *explained* when another, at least as confident (before demotion) and with an
    onset no later than its own, is a cause that can produce it; ``roots`` names causes known to be
    root causes for this run (e.g. a layer initialised far off scale), which explain regardless of
    confidence. Explained findings keep their severity but lose half their confidence and say by
    what they are explained.
    """
    best: dict[str, Finding] = {}
    for f in findings:
        if f.cause not in best or f.confidence > best[f.cause].confidence:
            best[f.cause] = f
    items = list(best.values())
    out: list[Finding] = []
    for f in items:
        explainer: Finding | None = None
        for g in items:
            if g is f or f.cause not in _EXPLAINS.get(g.cause, ()):
                continue
            if g.cause in roots and f.cause not in roots:
                explainer = g if explainer is None or g.confidence > explainer.confidence else explainer
                continue
            if f.cause in roots:
                continue
            if _onset(g) <= _onset(f) and g.confidence >= f.confidence and _SEVERITY_RANK[g.severity] >= 1:
                if f.cause in _EXPLAINS.get(g.cause, ()) and g.cause in _EXPLAINS.get(f.cause, ()) \
                        and _onset(g) == _onset(f) and g.confidence == f.confidence:
                    continue  # a tie that explains both ways settles on the order of checks
                explainer = g if explainer is None or g.confidence > explainer.confidence else explainer
        if explainer is not None:
            f = replace(f, confidence=f.confidence * _EXPLAINED_FACTOR, explained_by=explainer.cause)
        out.append(f)
    order = {c: i for i, c in enumerate(CAUSES)}
    out.sort(key=lambda f: (f.explained_by is not None, -f.confidence, -_SEVERITY_RANK[f.severity],
                            _onset(f), order[f.cause]))
    return out
