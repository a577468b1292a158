"""What each optimize stage hands the stages after it: one frozen, versioned record per stage.

A stage builds its record; the stages after it, the outputs (``config.yaml``, the plots), the
result and the report read its fields, never a dict's keys. ``to_dict`` is what ``state.json``
and the stage's Run in the Store hold (the keys ``--json``, ``summary.json`` and the report have
always read); ``from_dict`` reads them back on resume, a ``state.json`` written before records
had a ``schema_version`` included. ``schema_version`` changes when a field changes meaning.

A nested value that is a concept is a record of its own, made where it is built (a finding,
a layer's value, a group of search trials, a yellow flag, the race): the stage's record holds
the record, its JSON the record's ``to_dict()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, TypeVar

from .._holdout import HoldoutInfo
from .._records import JsonRecord, Reader, each, optional, record_fields
from ..diagnose import Finding
from ..exceptions import ConfigError
from ._budget_plan import BudgetPlan
from ._computed import ComputedValues, LrCheck
from ._final_records import FinalOutcome, SeedSummary
from ._layer_value import LayerFinding, LayerValue
from ._search_plan import SearchPlan
from ._search_records import ConfigGroup, KeptRun, TrialLog, YellowFlag

__all__ = [
    "SCHEMA_VERSION",
    "BaselineOutputs",
    "CompressOutputs",
    "ComputeOutputs",
    "FinalOutputs",
    "HealthOutputs",
    "LayerValueOutputs",
    "ModelFigures",
    "SearchStageOutputs",
    "StageOutputs",
    "TrainedRun",
]

SCHEMA_VERSION = 1

R = TypeVar("R", bound="StageOutputs")


class RecommendationRow(TypedDict):
    """A recommendation as the compute stage's record holds it (its evidence in the recommend Run)."""

    name: str
    value: object
    reason: str
    confidence: str
    effect: str


@dataclass(frozen=True, kw_only=True)
class StageOutputs(JsonRecord):
    """The base of every stage's record: versioned, JSON-shaped, read back from ``state.json``
    (``to_dict``: the record as ``state.json`` and the Store hold it, records in it as their dicts)."""

    #: The stage this record belongs to (a class constant, not stored).
    STAGE: ClassVar[str] = ""
    #: How ``from_dict`` reads the fields that hold records (field -> reader of its JSON).
    READERS: ClassVar[dict[str, Reader]] = {}
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def from_dict(cls: type[R], d: Any) -> R:
        """The record from its dict; missing keys take their defaults (a stage that was skipped, a
        ``state.json`` of an older proftune); a key it does not define (a renamed field) is a
        ConfigError naming it."""
        d = dict(d or {})
        version = int(d.get("schema_version") or 1)  # no version: written before records had one
        if version > SCHEMA_VERSION:
            raise ConfigError(f"the {cls.STAGE or cls.__name__} stage's outputs have schema_version={version}, "
                              f"newer than this proftune reads ({SCHEMA_VERSION}); upgrade proftune or "
                              "start a new run in another out= folder.")
        kw = record_fields(cls, d, what=f"the {cls.STAGE or cls.__name__} stage's outputs")
        return cls(**{k: cls.READERS[k](v) if k in cls.READERS and v is not None else v for k, v in kw.items()})


@dataclass(frozen=True)
class TrainedRun(JsonRecord):
    """One training of the baseline stage: its params, metrics, epochs and seconds."""

    WHAT: ClassVar[str] = "a baseline run"
    params: dict[str, object] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    epochs: int | None = None
    steps: int | None = None
    duration_s: float | None = None
    #: The ``diagnose`` Run of the defaults' training (the no-tricks run records none).
    run_id: int | None = None
    stop_reason: str | None = None


@dataclass(frozen=True)
class ModelFigures(JsonRecord):
    """A model as the compress stage measured it: the uncompressed one, a candidate, the choice."""

    WHAT: ClassVar[str] = "a compressed model figures"
    #: ``structured+dynamic``, ``static``, ... (None: the uncompressed model).
    method: str | None = None
    ratio: float | None = None
    metric: float | None = None
    #: The metric lost against the uncompressed model (negative: fine-tuning gained some).
    metric_drop: float | None = None
    #: The metric on the held-out data (the selection only).
    test_metric: float | None = None
    latency_ms: float | None = None
    latency_batch_ms: float | None = None
    #: Bytes of the file as saved.
    size_bytes: int | None = None
    params: int | None = None
    macs: int | None = None
    batch_size: int | None = None
    format: str | None = None
    within_budget: bool | None = None


@dataclass(frozen=True, kw_only=True)
class BaselineOutputs(StageOutputs):
    """The task's defaults trained with the health checks, and a no-tricks run beside them."""

    STAGE: ClassVar[str] = "baseline"
    READERS: ClassVar[dict[str, Reader]] = {
        "defaults": TrainedRun.from_dict, "no_tricks": TrainedRun.from_dict,
        "held_out": optional(HoldoutInfo.from_dict), "findings": each(Finding.from_dict)}
    defaults: TrainedRun = field(default_factory=TrainedRun)
    no_tricks: TrainedRun = field(default_factory=TrainedRun)
    #: |defaults' metric - no-tricks' metric|: how much the task's own choices matter.
    spread: float | None = None
    #: Seconds per epoch of the plain fit loop (the health checks slow the defaults' run).
    epoch_s: float | None = None
    held_out: HoldoutInfo | None = None
    #: The health checks' findings.
    findings: list[Finding] = field(default_factory=list)
    #: The defaults' trained weights in ``--out`` (a file name), when the fit kept a model.
    model: str | None = None
    #: The objective's metric of the untrained model (the defaults' seed), and after each epoch of
    #: the defaults' training: where the curve separates from its start is the first epoch that ranks.
    start_metric: float | None = None
    curve: list[float | None] = field(default_factory=list)

    def metric(self, run: str, name: str) -> float | None:
        """The metric ``name`` of the ``defaults`` or ``no_tricks`` run (None when absent)."""
        return (self.defaults if run == "defaults" else self.no_tricks).metrics.get(name)


@dataclass(frozen=True, kw_only=True)
class HealthOutputs(StageOutputs):
    """The baseline's findings by severity and the profile of its step."""

    STAGE: ClassVar[str] = "health"
    READERS: ClassVar[dict[str, Reader]] = {"errors": each(Finding.from_dict), "warnings": each(Finding.from_dict)}
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    #: Error findings the search does not tune were there and ``--ignore-findings`` went on anyway.
    ignored: bool = False
    #: The causes of error findings the search tunes (the loop went on without ``--ignore-findings``).
    searched: list[str] = field(default_factory=list)
    profile: str | None = None  # the Profile's file in --out
    step_time_ms: float | None = None
    peak_memory_bytes: int | None = None
    params: int | None = None
    macs: int | None = None
    throughput: float | None = None


@dataclass(frozen=True, kw_only=True)
class ComputeOutputs(StageOutputs):
    """What ``recommend`` computed: the values the search centres on, and their reasons."""

    STAGE: ClassVar[str] = "compute"
    READERS: ClassVar[dict[str, Reader]] = {"computed": ComputedValues.from_dict, "lr_check": LrCheck.from_dict}
    #: The values computed (its JSON: only those, by name).
    computed: ComputedValues = field(default_factory=ComputedValues)
    max_batch_size: int | None = None
    run_id: int | None = None
    #: The steps (and seconds, ``*_s``; milliseconds, ``*_ms``) each measurement got from the stage's share.
    steps: dict[str, float] = field(default_factory=dict)
    recommendations: list[RecommendationRow] = field(default_factory=list)
    #: The computed lr's short run against the defaults' (None: no lr computed, or not checked);
    #: where it did not win, ``computed`` holds no lr and the search centres on the defaults'.
    lr_check: LrCheck | None = None
    #: Why nothing was measured (None: the stage measured): its share held too few training steps.
    not_measured: str | None = None
    #: The JSON as it was before them: nothing where nothing was checked.
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("lr_check", "not_measured")

    def reasons(self) -> dict[str, str]:
        """Each recommendation's reason by its name."""
        return {str(r["name"]): str(r.get("reason") or "") for r in self.recommendations}


@dataclass(frozen=True, kw_only=True)
class LayerValueOutputs(StageOutputs):
    """Each layer's cost beside its measured contribution; the layers compression must keep."""

    STAGE: ClassVar[str] = "layer_value"
    READERS: ClassVar[dict[str, Reader]] = {"layers": each(LayerValue.from_dict),
                                            "findings": each(LayerFinding.from_dict)}
    metric: float | None = None  # the baseline model's metric the ablations are read against
    layers: list[LayerValue] = field(default_factory=list)
    findings: list[LayerFinding] = field(default_factory=list)
    #: Layer names that compression leaves whole.
    keep: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SearchStageOutputs(StageOutputs):
    """What the search stage found (groups of trials, mean +- std over seeds) and how it ended."""

    STAGE: ClassVar[str] = "search"
    READERS: ClassVar[dict[str, Reader]] = {
        "best": optional(ConfigGroup.from_dict), "top": each(ConfigGroup.from_dict),
        "defaults": optional(ConfigGroup.from_dict), "flags": each(YellowFlag.from_dict),
        "trials_log": each(TrialLog.from_dict), "budget_plan": optional(BudgetPlan.from_dict),
        "kept": each(KeptRun.from_dict)}
    study: str = ""
    #: ``SearchPlan.to_dict()`` (JSON: a state.json of an older proftune may hold a part of one).
    plan: dict[str, Any] = field(default_factory=dict)
    epochs_per_trial: int | None = None
    pruner: str = "none"
    full_trials_in_share: float | None = None
    #: The best group of trials (one configuration over its seeds).
    best: ConfigGroup | None = None
    top: list[ConfigGroup] = field(default_factory=list)
    #: The task's defaults' group under the trial protocol, when measured.
    defaults: ConfigGroup | None = None
    flags: list[YellowFlag] = field(default_factory=list)
    stop_reason: str = ""
    early: bool = False
    arms: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    trials: int = 0
    search_calls: int = 0
    history: list[Any] = field(default_factory=list)  # (trial number, best so far)
    trials_file: str | None = None
    duration_s: float = 0.0
    seconds: float = 0.0
    #: The seeds' standard deviation pooled over the configurations trained at two seeds or more.
    seed_std: float | None = None
    #: Every trial as the report draws it.
    trials_log: list[TrialLog] = field(default_factory=list)
    #: The budget as planned when the search started (None: a run recorded before plans).
    budget_plan: BudgetPlan | None = None
    #: Trials at the task's own epochs and the race's first seed whose models were kept.
    kept: list[KeptRun] = field(default_factory=list)

    def fixed(self) -> dict[str, object]:
        """The params the space fixed (not searched)."""
        return dict((self.plan.get("space") or {}).get("fixed") or {})

    def search_plan(self) -> SearchPlan | None:
        """The plan as its record (None where the stage has not run)."""
        return SearchPlan.from_dict(self.plan) if self.plan else None


@dataclass(frozen=True, kw_only=True)
class FinalOutputs(StageOutputs):
    """The final race's result: the chosen params with their evidence, its figures and model."""

    STAGE: ClassVar[str] = "final"
    READERS: ClassVar[dict[str, Reader]] = {
        "race": optional(FinalOutcome.from_dict), "test": SeedSummary.from_dict,
        # a state.json of an older proftune named the metric in its figures too
        "metric": lambda d: SeedSummary.from_dict({k: v for k, v in d.items() if k != "name"})}
    params: dict[str, object] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)
    epochs: int | None = None
    default_epochs: int | None = None
    race: FinalOutcome | None = None
    decision: str = ""
    chosen: str = ""
    #: The chosen configuration on the validation data (``values``: every seed's, cut ones too).
    metric: SeedSummary = field(default_factory=SeedSummary)
    #: The same on the held-out data.
    test: SeedSummary = field(default_factory=SeedSummary)
    model: str = "model.pt"
    model_seed: int | None = None
    #: Milliseconds per batch-1 forward on ``latency_device`` (the run's device, as compress measures).
    latency_ms: float | None = None
    latency_device: str = ""
    size_bytes: int | None = None
    model_val: float | None = None
    model_test: float | None = None
    load: str = ""
    #: The search's best configurations that did not race (the budget could not hold a race at
    #: the task's own protocol): proposals, not adopted.
    proposals: list[dict[str, object]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class CompressOutputs(StageOutputs):
    """The compression sweep's choice against the uncompressed model, or why it was skipped."""

    STAGE: ClassVar[str] = "compress"
    READERS: ClassVar[dict[str, Reader]] = {"baseline": optional(ModelFigures.from_dict),
                                            "selected": optional(ModelFigures.from_dict),
                                            "candidates": each(ModelFigures.from_dict)}
    #: Why the stage did not compress (``--goal none``, too little time, a failure); None when it ran.
    skipped: str | None = None
    verdict: str | None = None
    run_id: int | None = None
    plan: Any = None
    notes: list[str] | None = None
    ignored_layers: list[str] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    #: The uncompressed model, measured as the candidates were.
    baseline: ModelFigures | None = None
    selected: ModelFigures | None = None
    candidates: list[ModelFigures] = field(default_factory=list)
    output: str | None = None
    load: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is None:
            return super().to_dict()
        # a skipped stage says why, and holds nothing else
        return {"schema_version": self.schema_version, "skipped": self.skipped,
                **({"verdict": self.verdict} if self.verdict is not None else {})}

