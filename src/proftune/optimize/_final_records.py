"""The final race's records: its plan, each arm and its runs, the outcome, and the figures over
seeds it reports. The final stage (``_final.py``) builds them; the stage's outputs, the result
and the report read them. They import no stage.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from .._records import JsonRecord, Reader, plain, record_fields, stored_version
from .._train_params import TrainParams
from ._decide import Comparison

__all__ = ["SCHEMA_VERSION", "Arm", "ArmRun", "FinalOutcome", "FinalPlan", "HeldOutEstimate", "SearchGap",
           "SeedSummary"]

#: 2 (issue 60): a task without test_data selects on all of validation; a run's ``test`` figure is
#: then its validation figure on a partition the search did not select on (a resplit round), and
#: ``estimate`` holds the figure corrected for the winner's curse where there is no such run.
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class SeedSummary(JsonRecord):
    """A metric over an arm's seeds: mean ± standard deviation of ``n`` runs (the noise figures)."""

    WHAT: ClassVar[str] = "a seed summary"
    mean: float | None = None
    std: float | None = None
    n: int = 0
    #: The values the figures are over, one per seed.
    values: list[float | None] = field(default_factory=list)


@dataclass(frozen=True)
class SearchGap(JsonRecord):
    """What the search measured for the race's leader beside its final validation mean."""

    WHAT: ClassVar[str] = "a search gap"
    arm: str
    search_mean: float | None
    search_std: float | None
    search_n: int
    final_mean: float | None
    #: ``final_mean - search_mean`` (None without both).
    gap: float | None


@dataclass(frozen=True)
class ArmRun(JsonRecord):
    """One training of one arm at one seed: its metric on validation and held-out data."""

    WHAT: ClassVar[str] = "a final race run"

    seed: int
    run_id: int | None
    val: float | None
    test: float | None
    epochs: int
    duration_s: float
    #: Stopped by the time limit before its epochs (not the protocol: left out of comparisons).
    cut: bool
    val_metrics: dict[str, float] = field(default_factory=dict)
    test_metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Arm(JsonRecord):
    """A configuration in the final race: the defaults or one of the search's best."""

    WHAT: ClassVar[str] = "a final race arm"
    READERS: ClassVar[dict[str, Reader]] = {"runs": lambda rs: tuple(ArmRun.from_dict(r) for r in rs)}

    name: str  # "defaults", "search #1", ...
    params: dict[str, object]
    source: str
    #: What the search measured for it (its mean and std over the trials of that configuration).
    search_mean: float | None = None
    search_std: float | None = None
    search_n: int = 0
    epoch_s: float = 1.0
    runs: tuple[ArmRun, ...] = ()
    #: Epochs of this arm's runs (None: the plan's): the defaults train at the task's own epochs.
    epochs: int | None = None
    #: ``params`` as the record validated where the arm was made, which each of its trainings takes
    #: as it is (None: an arm read back from JSON, validated at its first training; not stored).
    train: TrainParams | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "train"}

    def values(self, split: str, seeds: Sequence[int]) -> list[float | None]:
        """This arm's metric at each of ``seeds`` (None where it did not run or was cut)."""
        by_seed = {r.seed: r for r in self.runs if not r.cut}
        return [getattr(by_seed[s], split) if s in by_seed else None for s in seeds]

    def summary(self, split: str) -> SeedSummary:
        """Mean ± std over the runs that were not cut, on ``split`` (``val`` or ``test``)."""
        vals = [v for v in (getattr(r, split) for r in self.runs if not r.cut) if v is not None]
        return SeedSummary(mean=statistics.fmean(vals) if vals else None,
                           std=statistics.stdev(vals) if len(vals) > 1 else None, n=len(vals), values=list(vals))



@dataclass(frozen=True)
class FinalPlan(JsonRecord):
    """What the final stage is asked to do."""

    WHAT: ClassVar[str] = "a final race plan"

    metric: str
    maximize: bool
    epochs: int
    seeds: int
    seed: int
    device: str
    #: The validation samples (the metric's resolution for a ratio metric is one of them).
    val_samples: int | None
    #: The seeds' standard deviation the search measured (for a single seed's decision).
    prior_std: float | None = None
    protocol: str = "the fit loop as the search trials ran it (same epochs, no extra callbacks)"
    #: Round ``r`` of the race trains and judges on the task's partition ``r`` of its training and
    #: validation samples (:meth:`~proftune.Task.resplit`; round 0 on the task's own split).
    resplit: bool = False
    #: Configurations compared on this validation data before the race (the search's trials):
    #: the winner's curse of the held-out estimate grows with them.
    compared: int = 0


@dataclass(frozen=True)
class HeldOutEstimate(JsonRecord):
    """The result's figure on new data where no data is left that nothing selected on (no
    ``test_data``, no resplit rounds): its gain over the defaults on validation less the sampling
    error expected of the best of ``compared`` configurations on the same samples,
    ``sampling_std * sqrt(2 ln compared)`` (the expected maximum of that many draws of its noise;
    conservative: it takes them all as equal). The defaults were not selected: their figure is
    their validation mean."""

    WHAT: ClassVar[str] = "a held-out estimate"
    defaults: float | None
    chosen: float | None
    #: The result's gain over the defaults on validation, and after the correction (positive: better).
    gain_val: float | None
    gain: float | None
    bias: float | None
    compared: int
    sampling_std: float | None
    val_samples: int | None

    def describe(self) -> str:
        if self.bias is None:
            return ("no estimate: the metric's sampling noise on the validation data is not known (a ratio "
                    "metric's is binomial), so the validation figures are the only ones")
        return (f"gain {self.gain_val:+.4g} on validation less {self.bias:.3g} (one figure's sampling noise "
                f"{self.sampling_std:.3g} on {self.val_samples} samples x sqrt(2 ln {self.compared}) for the best "
                f"of {self.compared} configurations compared on them): {self.gain:+.4g} expected on new data")


@dataclass(frozen=True)
class FinalOutcome:
    """The race's result: every arm's runs, the paired comparisons and what was kept."""

    plan: FinalPlan
    arms: list[Arm]
    seeds: list[int]
    #: "chosen" (a configuration beat the defaults beyond noise), "shorter" (a shorter protocol
    #: reached the defaults' metric: the same result in less training time) or "defaults".
    decision: str
    chosen: str  # the arm whose model is the result
    leader: str | None  # the best challenger on validation (compared with the defaults)
    comparison: Comparison | None  # leader vs defaults on validation (the decision)
    comparison_test: Comparison | None  # the same pairs on held-out data (the report)
    #: The seed whose model is the result: the chosen configuration's seed best on validation.
    model_seed: int | None
    note: str
    schema_version: int = SCHEMA_VERSION
    #: The result's held-out figure as an estimate, where no run of it has one (see the class).
    estimate: HeldOutEstimate | None = None

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    @property
    def kept_defaults(self) -> bool:
        return self.decision == "defaults"

    @property
    def shorter(self) -> bool:
        """The result is a shorter protocol at the defaults' metric (a time gain, not a gain)."""
        return self.decision == "shorter"

    def model_run(self) -> ArmRun | None:
        """The run whose model is the result."""
        return next((r for r in self.arm(self.chosen).runs if r.seed == self.model_seed), None)

    def search_gap(self) -> SearchGap | None:
        """The search's estimate of the leader beside its final validation mean."""
        if self.leader is None:
            return None
        arm = self.arm(self.leader)
        final = arm.summary("val").mean
        gap = (final - arm.search_mean) if final is not None and arm.search_mean is not None else None
        return SearchGap(arm=arm.name, search_mean=arm.search_mean, search_std=arm.search_std,
                         search_n=arm.search_n, final_mean=final, gap=gap)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = plain(asdict(self))  # the runs' tuple as a JSON list
        d["comparison"] = self.comparison.to_dict() if self.comparison else None
        d["comparison_test"] = self.comparison_test.to_dict() if self.comparison_test else None
        gap = self.search_gap()
        d["search_gap"] = gap.to_dict() if gap else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FinalOutcome:
        """The race back from :meth:`to_dict`'s JSON (a final stage's Run, ``state.json``)."""
        stored_version(d, what="a final race", current=SCHEMA_VERSION)
        kw = record_fields(cls, d, what="a final race", derived=("search_gap",))
        return cls(**{**kw, "plan": FinalPlan.from_dict(kw["plan"]), "arms": [Arm.from_dict(a) for a in kw["arms"]],
                      "seeds": list(kw["seeds"]),
                      "comparison": Comparison.from_dict(kw["comparison"]) if kw.get("comparison") else None,
                      "comparison_test": (Comparison.from_dict(kw["comparison_test"])
                                          if kw.get("comparison_test") else None),
                      "note": str(kw.get("note") or ""),
                      "estimate": HeldOutEstimate.from_dict(kw["estimate"]) if kw.get("estimate") else None})
