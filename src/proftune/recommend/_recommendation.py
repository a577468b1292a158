"""The Recommendation record: one decision, the measured numbers it came from, and its effect."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The names a recommendation can have, in the order ``recommend`` returns them.
RECOMMENDATION_NAMES = (
    "batch_size", "lr", "lr_scaling", "critical_batch_size", "grad_accumulation", "precision",
    "data_loading", "bottleneck", "optimizer",
)
#: Names present only where they apply: ``embedding_dim`` for a model with embedding tables,
#: ``ddp_batch_size`` when ``recommend`` is asked about DDP (``ddp=N``); they follow the others.
CONDITIONAL_NAMES = ("embedding_dim", "ddp_batch_size")
CONFIDENCES = ("high", "medium", "low")


@dataclass(frozen=True)
class Recommendation:
    """A training parameter computed from measurements.

    ``value`` is what to set (None when the measurements do not allow a value; ``reason``
    says why). ``evidence`` holds the measured numbers it came from, ``effect`` the effect it
    predicts. ``confidence``: high (measured and verified), medium (derived from measurements
    through a model that holds under stated assumptions), low (a rule of thumb, or thin data).
    """

    name: str
    value: Any
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    confidence: str = "medium"
    effect: str = ""

    def __post_init__(self) -> None:
        if self.name not in RECOMMENDATION_NAMES + CONDITIONAL_NAMES:
            raise ValueError(f"Recommendation name={self.name!r} is unknown; valid: "
                             f"{', '.join(RECOMMENDATION_NAMES + CONDITIONAL_NAMES)}.")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"confidence={self.confidence!r} is unknown; valid: {', '.join(CONFIDENCES)}.")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "reason": self.reason,
                "evidence": self.evidence, "confidence": self.confidence, "effect": self.effect}


class Recommendations(list[Recommendation]):
    """What ``recommend`` returns: a list of :class:`Recommendation`, plus the Profile it read
    and the id of the Run it was recorded as."""

    def __init__(self, items: list[Recommendation], *, profile: Any = None, run_id: int | None = None,
                 curves: dict[str, list[dict[str, Any]]] | None = None) -> None:
        super().__init__(items)
        self.profile = profile
        self.run_id = run_id
        #: The measured curves behind the values (``lr_range``: the LR range test, ``noise_scale``:
        #: the gradient noise scale per step), recorded with the Run for the report.
        self.curves = dict(curves or {})

    def get(self, name: str) -> Recommendation:
        """The recommendation called ``name``."""
        for rec in self:
            if rec.name == name:
                return rec
        raise KeyError(f"no recommendation {name!r}; present: {', '.join(r.name for r in self)}.")

    def to_dict(self) -> dict[str, Any]:
        return {"recommendations": [r.to_dict() for r in self], "run_id": self.run_id,
                "profile": {"batch_size": getattr(self.profile, "batch_size", None),
                            "device": getattr(self.profile, "device", None),
                            "metrics": self.profile.metrics() if self.profile is not None else None}}
