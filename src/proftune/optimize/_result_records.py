"""What ``proftune.optimize`` returns: one frozen, versioned record, and the records it holds.

:class:`OptimizeResult` is built once, at the end of the run; the optimize Run, ``--json`` and
``summary.json`` hold its :meth:`~OptimizeResult.to_dict`, and the report reads it back through
:meth:`~OptimizeResult.from_dict` (a renamed field is a ConfigError there, not a blank cell).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from .._holdout import HoldoutInfo
from .._records import JsonRecord, Reader, each, optional
from ..diagnose import Finding
from ._changes import ParamChange
from ._decide import Comparison
from ._final_records import SearchGap, SeedSummary
from ._layer_value import LayerFinding
from ._records import ModelFigures, StageOutputs
from ._search_records import YellowFlag

__all__ = ["OPTIMIZE_SCHEMA_VERSION", "CompressedModel", "FinalSummary", "OptimizeResult", "SplitComparisons",
           "SplitSummaries", "StageRow", "StageStory", "Story", "StoryLine", "VsBaseline"]

#: Bumped when a field of :class:`OptimizeResult`'s JSON changes meaning. 2 (issue 60): a task
#: without test_data selected on all of validation; ``vs_baseline``'s held-out figures (``final.test``,
#: ``final_test_mean``, ``gain_test``) are then the race's rounds on other partitions or an estimate
#: corrected for the winner's curse (``held_out.source``: "resplits", "estimate"), no longer half of
#: validation ("validation split").
OPTIMIZE_SCHEMA_VERSION = 2

S = TypeVar("S", bound=StageOutputs)


@dataclass(frozen=True, kw_only=True)
class StageRow(JsonRecord):
    """One stage in the result: its status, time, share of the budget and its two numbers."""

    WHAT: ClassVar[str] = "an optimize stage row"
    name: str
    status: str | None = None
    duration_s: float | None = None
    share_s: float | None = None
    #: The stage's Run (its whole outputs); ``outputs`` here are those without their bulk.
    run_id: int | None = None
    metric_before: float | None = None
    metric_after: float | None = None
    #: What "before -> after" means for this stage.
    compares: str | None = None
    gain_vs_baseline: float | None = None
    outputs: dict[str, object] = field(default_factory=dict)

    def record(self, kind: type[S]) -> S:
        """The outputs kept here as the stage's record (``kind``: e.g. ``CompressOutputs``)."""
        if kind.STAGE != self.name:  # a record names its stage (register_stage checks it)
            raise TypeError(f"stage {self.name!r} holds the {self.name!r} stage's record, not {kind.__name__} "
                            f"(the {kind.STAGE!r} stage's)")
        return kind.from_dict(self.outputs)


@dataclass(frozen=True, kw_only=True)
class CompressedModel(ModelFigures):
    """The compressed model that is part of the result: its figures, its file and its load line."""

    WHAT: ClassVar[str] = "a compressed model"
    model: str | None = None
    load: str | None = None


@dataclass(frozen=True, kw_only=True)
class FinalSummary(JsonRecord):
    """The result's configuration and model: params with their evidence, the race's figures."""

    WHAT: ClassVar[str] = "an optimize final"
    READERS: ClassVar[dict[str, Reader]] = {
        "metrics": lambda d: {k: SeedSummary.from_dict(v) for k, v in d.items()},
        "test": SeedSummary.from_dict, "compressed": optional(CompressedModel.from_dict),
        "changes": each(ParamChange.from_dict)}
    params: dict[str, object] = field(default_factory=dict)
    #: Where each param's value came from (task default, computed, searched), in a sentence.
    evidence: dict[str, str] = field(default_factory=dict)
    decision: str = ""
    #: The objective's figures on validation, by its name (``values``: every seed's).
    metrics: dict[str, SeedSummary] = field(default_factory=dict)
    mean: float | None = None
    std: float | None = None
    test: SeedSummary = field(default_factory=SeedSummary)
    seeds: list[int] = field(default_factory=list)
    epochs: int | None = None
    default_epochs: int | None = None
    #: The seed whose model is the result (the chosen configuration's best on validation), and its figures.
    model_seed: int | None = None
    model_val: float | None = None
    model_test: float | None = None
    model: str = ""
    #: Python that rebuilds the model from the output folder, from any directory.
    load: str = ""
    #: The uncompressed model at batch 1 and at the task's batch (``batch_size``), and as saved.
    latency_ms: float | None = None
    latency_batch_ms: float | None = None
    #: The device both latencies (and the compressed model's) were measured on: the run's.
    latency_device: str = ""
    batch_size: int | None = None
    size_bytes: int | None = None
    compressed: CompressedModel | None = None
    #: Every param against the defaults in effect.
    changes: list[ParamChange] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SplitSummaries(JsonRecord):
    """One configuration's figures on the validation and on the held-out data."""

    WHAT: ClassVar[str] = "a figures by split"
    READERS: ClassVar[dict[str, Reader]] = {"val": SeedSummary.from_dict, "test": SeedSummary.from_dict}
    val: SeedSummary = field(default_factory=SeedSummary)
    test: SeedSummary = field(default_factory=SeedSummary)


@dataclass(frozen=True, kw_only=True)
class SplitComparisons(JsonRecord):
    """The leader against the defaults, paired over the seeds, on both splits."""

    WHAT: ClassVar[str] = "a comparisons by split"
    READERS: ClassVar[dict[str, Reader]] = {"val": Comparison.from_dict, "test": Comparison.from_dict}
    val: Comparison | None = None
    test: Comparison | None = None


@dataclass(frozen=True, kw_only=True)
class VsBaseline(JsonRecord):
    """The result against the task's defaults: the decision, both splits' figures, the noise."""

    WHAT: ClassVar[str] = "an optimize result against the defaults"
    READERS: ClassVar[dict[str, Reader]] = {
        "defaults": SplitSummaries.from_dict, "final": SplitSummaries.from_dict,
        "leader_vs_defaults": SplitComparisons.from_dict, "search_gap": SearchGap.from_dict,
        "held_out": optional(HoldoutInfo.from_dict), "leader_changes": each(ParamChange.from_dict)}
    metric: str = ""
    #: ``chosen`` (a configuration beat the defaults beyond noise) or ``defaults`` (kept them).
    decision: str = "defaults"
    defaults_params: dict[str, object] = field(default_factory=dict)
    #: The decision in one line with its numbers.
    summary: str = ""
    defaults: SplitSummaries = field(default_factory=SplitSummaries)
    final: SplitSummaries = field(default_factory=SplitSummaries)
    baseline: float | None = None
    baseline_test: float | None = None
    final_mean: float | None = None
    final_std: float | None = None
    final_test_mean: float | None = None
    final_test_std: float | None = None
    #: The best challenger of the race (compared with the defaults), adopted or not.
    leader: str | None = None
    leader_vs_defaults: SplitComparisons = field(default_factory=SplitComparisons)
    beyond_noise: bool = False
    search_gap: SearchGap | None = None
    race_note: str = ""
    held_out: HoldoutInfo | None = None
    held_out_source: str = ""
    #: The baseline stage's single runs: no tricks, and the defaults with the health checks.
    no_tricks: float | None = None
    baseline_run: float | None = None
    gain: float | None = None
    gain_test: float | None = None
    #: What the leader would have changed, when it was not adopted.
    leader_changes: list[ParamChange] = field(default_factory=list)
    #: The compress stage's verdict, or why it was skipped.
    compression: str | None = None
    compressed_metric: float | None = None
    compressed_test_metric: float | None = None
    latency_speedup: float | None = None
    latency_batch_speedup: float | None = None
    size_ratio: float | None = None

    @property
    def adopted(self) -> bool:
        """A configuration replaced the defaults: better beyond noise, or a shorter protocol at
        their metric (``decision == "shorter"``: a time gain)."""
        return self.decision in ("chosen", "shorter")


@dataclass(frozen=True)
class StoryLine(JsonRecord):
    """A question a newcomer asks, and the run's answer."""

    WHAT: ClassVar[str] = "a story line"
    label: str
    text: str


@dataclass(frozen=True)
class StageStory(JsonRecord):
    """A stage in a few words: its two numbers, labelled, and what it did."""

    WHAT: ClassVar[str] = "a stage story"
    stage: str
    status: str | None
    time: str
    share: str
    numbers: str = ""
    did: str = ""


@dataclass(frozen=True)
class Story(JsonRecord):
    """The result in sentences, from the result's own numbers."""

    WHAT: ClassVar[str] = "an optimize story"
    READERS: ClassVar[dict[str, Reader]] = {"lines": each(StoryLine.from_dict), "stages": each(StageStory.from_dict)}
    headline: str = ""
    decision: str = ""
    adopted: bool = False
    notes: list[str] = field(default_factory=list)
    lines: list[StoryLine] = field(default_factory=list)
    stages: list[StageStory] = field(default_factory=list)

    def answer(self, label: str) -> str:
        """The answer to the question ``label`` ("did it help", ...), "" when it was not asked."""
        return next((x.text for x in self.lines if x.label == label), "")


@dataclass(frozen=True, kw_only=True)
class OptimizeResult(JsonRecord):
    """What the loop produced: each stage's row, the final configuration and model, the gain.

    A frozen, versioned record, built once at the end of the run: the optimize Run, ``--json``
    and ``summary.json`` hold :meth:`to_dict`; the report reads it back through :meth:`from_dict`.
    """

    task: str
    study: str
    run_id: int
    out: str
    objective: str
    budget_s: float
    elapsed_s: float
    #: Why the run ended when it did (the budget, an early end of the search, ...).
    stop_reason: str = ""
    #: How ``proftune.load_task`` finds the task again (its spec, or its name).
    spec: str = ""
    stages: list[StageRow] = field(default_factory=list)
    final: FinalSummary = field(default_factory=FinalSummary)
    vs_baseline: VsBaseline = field(default_factory=VsBaseline)
    flags: list[YellowFlag] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    layer_findings: list[LayerFinding] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    #: The result in sentences: what the terminal summary and the report print.
    story: Story = field(default_factory=Story)
    schema_version: int = OPTIMIZE_SCHEMA_VERSION

    WHAT: ClassVar[str] = "an optimize result"
    SCHEMA: ClassVar[int | None] = OPTIMIZE_SCHEMA_VERSION
    READERS: ClassVar[dict[str, Reader]] = {
        "stages": each(StageRow.from_dict), "final": FinalSummary.from_dict, "vs_baseline": VsBaseline.from_dict,
        "flags": each(YellowFlag.from_dict), "warnings": each(Finding.from_dict),
        "layer_findings": each(LayerFinding.from_dict), "story": Story.from_dict}

    @property
    def metric(self) -> str:
        """The objective's metric (``accuracy`` of ``accuracy:max``)."""
        return self.objective.split(":")[0]

    def stage(self, name: str) -> StageRow | None:
        return next((s for s in self.stages if s.name == name), None)
