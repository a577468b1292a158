"""The Recommendation record: one decision, the measured numbers it came from, and its effect."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, overload

from .._records import JsonRecord, record_fields, stored_version
from ..exceptions import ConfigError

#: The names a recommendation can have, in the order ``recommend`` returns them.
RECOMMENDATION_NAMES = (
    "batch_size", "lr", "lr_scaling", "critical_batch_size", "grad_accumulation", "precision",
    "data_loading", "bottleneck", "optimizer", "threads",
)
#: Names present only where they apply: ``embedding_dim`` for a model with embedding tables,
#: ``ddp_batch_size`` when ``recommend`` is asked about DDP (``ddp=N``); they follow the others.
CONDITIONAL_NAMES = ("embedding_dim", "ddp_batch_size", "num_workers")
CONFIDENCES = ("high", "medium", "low")


@dataclass(frozen=True)
class Recommendation(JsonRecord):
    """A training parameter computed from measurements.

    ``value`` is what to set (None when the measurements do not allow a value; ``reason``
    says why). ``evidence`` holds the measured numbers it came from, ``effect`` the effect it
    predicts. ``confidence``: high (measured and verified), medium (derived from measurements
    through a model that holds under stated assumptions), low (a rule of thumb, or thin data).
    """

    WHAT: ClassVar[str] = "a recommendation"

    name: str
    value: Any
    reason: str
    evidence: Mapping[str, object] = field(default_factory=dict)
    confidence: str = "medium"
    effect: str = ""

    def __post_init__(self) -> None:
        if self.name not in RECOMMENDATION_NAMES + CONDITIONAL_NAMES:
            raise ValueError(f"Recommendation name={self.name!r} is unknown; valid: "
                             f"{', '.join(RECOMMENDATION_NAMES + CONDITIONAL_NAMES)}.")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"confidence={self.confidence!r} is unknown; valid: {', '.join(CONFIDENCES)}.")

    @classmethod
    def from_dict(cls, d: Any) -> Recommendation:
        """One recommendation back from :meth:`to_dict`'s JSON."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"a recommendation must be a JSON object, but got {type(d).__name__}.")
        kw = record_fields(cls, d, what="a recommendation")
        kw["evidence"] = dict(kw.get("evidence") or {})
        try:
            return cls(**kw)
        except ValueError as exc:  # an unknown name or confidence
            raise ConfigError(str(exc)) from exc


@dataclass(frozen=True)
class MeasuredEffect(JsonRecord):
    """What a recommended value did where it was tried beside the current one: ``metric`` at the
    current value and at the proposed one, its direction, and ``tie``, the difference (in metric
    units) within which the two are equal (the measurement's noise or resolution)."""

    WHAT: ClassVar[str] = "a measured effect"

    metric: str
    current: float
    proposed: float
    maximize: bool
    tie: float = 0.0

    @property
    def worse_by(self) -> float:
        """How much worse the proposed value measured (negative: better); inf when it gave no figure."""
        if not math.isfinite(self.proposed):
            return math.inf
        return (self.current - self.proposed) if self.maximize else (self.proposed - self.current)

    @property
    def worse(self) -> bool:
        """Worse beyond the tie: the current value is better (a current value without a figure
        cannot be compared, and then nothing is worse)."""
        return math.isfinite(self.current) and self.worse_by > self.tie

    def text(self) -> str:
        return (f"{self.metric} {self.proposed:.4g} against {self.current:.4g} at the current value "
                f"({'higher' if self.maximize else 'lower'} is better; a tie within {self.tie:.2g})")


def keep_unless_better(rec: Recommendation, current: Any, *, effect: MeasuredEffect | None = None,
                       inconclusive: str | None = None, would_decide: str = "") -> Recommendation:
    """The one rule of every recommendation: ``rec`` stands only where its value's own measured
    effect is no worse than the current value's and the measurement could decide. A measured-worse
    value (``effect.worse``) or an ``inconclusive`` measurement (a training stopped by its time
    budget, a spectrum that is still noise: the text says which) gives the current value instead,
    its reason saying why, with the numbers, and ``would_decide``: the time or data that would."""
    if inconclusive is None and (effect is None or not effect.worse):
        return rec
    if rec.value == current:
        why = inconclusive if inconclusive is not None else ""
    elif inconclusive is not None:
        why = f"the measurement is inconclusive: {inconclusive}"
    else:
        assert effect is not None
        why = f"its own measured effect is worse: {effect.text()}"
    head = f"keep the current value {_shown(current)}" + (
        f", not {_shown(rec.value)}" if rec.value != current else "")
    reason = f"{head}: {why.rstrip('.')}." if why else f"{head}."
    if would_decide:
        reason += f" What would decide it: {would_decide.rstrip('.')}."
    reason += f" Measured: {rec.reason}"
    evidence = {**rec.evidence, "proposed": rec.value, "current": current,
                "kept_current": "inconclusive" if inconclusive is not None else "measured worse",
                "would_decide": would_decide or None}
    if effect is not None:
        evidence["measured_effect"] = effect.to_dict()
    if evidence.get("params_to_set"):  # what the proposal would set: nothing is set now
        evidence["proposed_params"], evidence["params_to_set"] = evidence["params_to_set"], {}
    return Recommendation(rec.name, current, reason, evidence, "low",
                          f"none: the current value is kept ({rec.effect})" if rec.effect else
                          "none: the current value is kept")


def _shown(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


#: Bumped when a field of :class:`Recommendations`'s JSON changes meaning.
RECOMMEND_SCHEMA_VERSION = 1


class MeasuredProfile(TypedDict):
    """What a set of recommendations says of the profile it read (``Recommendations.measured``)."""

    batch_size: int | None
    device: str | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class Recommendations(Sequence[Recommendation]):
    """What ``recommend`` returns: the :class:`Recommendation` rows in order (a sequence: index,
    iterate, ``len``), the Profile it read and the id of the Run it was recorded as.

    A frozen, versioned record: :func:`proftune.recommend.recommend` builds it once, its
    ``recommend`` Run holds :meth:`to_dict`, and the report reads it back through
    :meth:`from_dict`. ``profile`` (the Profile object) and ``curves`` stay in memory (the Run
    keeps the curves as its own); ``measured`` is what the record says of the profile: batch
    size, device and metrics.
    """

    items: tuple[Recommendation, ...]
    profile: Any = field(default=None, compare=False, repr=False)
    run_id: int | None = None
    #: The measured curves behind the values (``lr_range``: the LR range test, ``noise_scale``:
    #: the gradient noise scale per step), recorded with the Run for the report.
    curves: dict[str, list[dict[str, float]]] = field(default_factory=dict, compare=False, repr=False)
    #: The profile's batch size, device and metrics (from ``profile`` when not given).
    measured: MeasuredProfile | None = None
    schema_version: int = RECOMMEND_SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", tuple(self.items))
        object.__setattr__(self, "curves", dict(self.curves or {}))
        if self.measured is None and self.profile is not None:
            object.__setattr__(self, "measured", {"batch_size": getattr(self.profile, "batch_size", None),
                                                  "device": getattr(self.profile, "device", None),
                                                  "metrics": self.profile.metrics()})

    @overload
    def __getitem__(self, index: int) -> Recommendation: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Recommendation, ...]: ...

    def __getitem__(self, index: int | slice) -> Recommendation | tuple[Recommendation, ...]:
        return self.items[index]

    def __len__(self) -> int:
        return len(self.items)

    def get(self, name: str) -> Recommendation:
        """The recommendation called ``name``."""
        for rec in self.items:
            if rec.name == name:
                return rec
        raise KeyError(f"no recommendation {name!r}; present: {', '.join(r.name for r in self.items)}.")

    def to_dict(self) -> dict[str, object]:
        return {"recommendations": [r.to_dict() for r in self.items], "run_id": self.run_id,
                "profile": self.measured, "schema_version": self.schema_version}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Recommendations:
        """The record back from :meth:`to_dict`'s JSON (a ``recommend`` Run's result; one recorded
        before the record had a version holds the recommendations alone)."""
        what = "a set of recommendations"
        stored_version(d, what=what, current=RECOMMEND_SCHEMA_VERSION)
        known = {**d, "items": d.get("recommendations") or []}
        known.pop("recommendations", None)
        if "profile" in known:
            known["measured"] = known.pop("profile")
        kw = record_fields(cls, known, what=what, exclude=("profile", "curves"))
        kw["items"] = tuple(Recommendation.from_dict(x) for x in kw["items"])
        return cls(**kw)
