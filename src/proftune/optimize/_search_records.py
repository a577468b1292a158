"""The search stage's records: a yellow flag, a configuration's group of trials, a trial as the
report draws it. The search stage (``_search.py``) builds them; the stage's outputs, the result
and the report read them. They import no stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

from .._records import JsonRecord
from ..search import EnqueuedTrial, TrialRecord

__all__ = ["ARM_TAG", "Bound", "ConfigGroup", "KeptRun", "TrialLog", "YellowFlag", "arm_of",
           "defaults_outside_race", "enqueued"]

#: Tag of an enqueued trial: where its configuration came from.
ARM_TAG = "arm"
#: A param's part of a flagged region: its choices (``in``) or its range (``low``, ``high``).
Bound = TypedDict("Bound", {"in": list[object], "low": float, "high": float}, total=False)


def arm_of(t: TrialRecord | EnqueuedTrial) -> str:
    """Where the trial's configuration came from (its enqueue tag; ``tpe`` for a sampled one)."""
    return str(t.tags.get(ARM_TAG, "tpe"))


def enqueued(arm: str, params: Mapping[str, Any], repeat: int = 0) -> EnqueuedTrial:
    """A configuration of the search stage for ``proftune.search``'s queue, tagged with its ``arm``;
    ``repeat``: its evaluations before this one (a new seed)."""
    return EnqueuedTrial(params, tags={ARM_TAG: arm}, repeat=repeat)


@dataclass(frozen=True)
class YellowFlag(JsonRecord):
    """Several trials failed for the same cause in one region; that region is paused."""

    WHAT: ClassVar[str] = "a yellow flag"
    DERIVED: ClassVar[tuple[str, ...]] = ("action",)
    cause: str
    trials: list[int]
    region: dict[str, Bound]
    evidence: list[str]

    def contains(self, params: Mapping[str, Any]) -> bool:
        for name, bound in self.region.items():
            if name not in params:
                continue
            v = params[name]
            if "in" in bound:
                if v not in bound["in"]:
                    return False
            elif not (bound["low"] <= float(v) <= bound["high"]):
                return False
        return True

    #: What the search does about it (said in every flag's JSON).
    action: ClassVar[str] = "region paused: no more samples there; the search goes on elsewhere"


@dataclass(frozen=True)
class ConfigGroup(JsonRecord):
    """The complete trials of one configuration: its metric's mean ± std over their seeds."""

    WHAT: ClassVar[str] = "a search group"
    params: dict[str, object]
    values: list[float]
    trials: list[int]
    #: The arm of each trial (``centre``, ``defaults``, ``local``, ``tpe``).
    arms: list[str]
    mean: float
    std: float | None
    n: int
    #: Median seconds of its trials.
    trial_s: float = 0.0


@dataclass(frozen=True)
class TrialLog(JsonRecord):
    """One search trial as the report draws it: its arm, state, value and why it ended."""

    WHAT: ClassVar[str] = "a search trial log"
    number: int
    state: str
    value: float | None = None
    arm: str = "tpe"
    reason: str | None = None
    duration_s: float | None = None

    @classmethod
    def of(cls, t: TrialRecord) -> TrialLog:
        """The search's trial record as the stage keeps it (the few fields its chart reads)."""
        return cls(number=t.number, state=t.state, value=t.value, arm=arm_of(t), reason=t.reason,
                   duration_s=t.duration_s)


@dataclass(frozen=True)
class KeptRun(JsonRecord):
    """A complete search trial at the race's first seed whose model the search kept: the race takes
    it as that configuration's first training at its epochs (not trained again)."""

    WHAT: ClassVar[str] = "a kept search training"
    trial: int
    run_id: int | None
    seed: int
    val: float
    epochs: int
    duration_s: float
    metrics: dict[str, float]
    #: The model's state dict, relative to the loop's output folder.
    model: str
    params: dict[str, object]


def defaults_outside_race(group: ConfigGroup | None, full: bool) -> list[float]:
    """The search's evaluations of the defaults where its trials ran the full protocol: trainings
    of them that nothing selected, beside the race's (the baseline's, their first race seed, is
    left out: it is in the race already)."""
    if group is None or not full:
        return []
    return [float(v) for v, arm in zip(group.values, group.arms, strict=False) if arm != "baseline"]
