"""What each optimize stage hands the stages after it: one frozen, versioned record per stage.

A stage builds its record; the stages after it, the outputs (``config.yaml``, the plots) and the
result read its fields, never a dict's keys. ``to_dict`` is what ``state.json`` and the stage's
Run in the Store hold (the keys ``--json``, ``summary.json`` and the report have always read);
``from_dict`` reads them back on resume, a ``state.json`` written before records had a
``schema_version`` included. ``schema_version`` changes when a field changes meaning.

Nested values (the race, the search plan, a group of trials) stay JSON-shaped dicts here: each
has its own record where it is built (``FinalOutcome``, ``SearchPlan``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ..exceptions import ConfigError

__all__ = [
    "SCHEMA_VERSION",
    "STAGE_RECORDS",
    "BaselineOutputs",
    "CompressOutputs",
    "ComputeOutputs",
    "FinalOutputs",
    "HealthOutputs",
    "LayerValueOutputs",
    "SearchStageOutputs",
    "StageOutputs",
]

SCHEMA_VERSION = 1

R = TypeVar("R", bound="StageOutputs")


@dataclass(frozen=True, kw_only=True)
class StageOutputs:
    """The base of every stage's record: versioned, JSON-shaped, read back from ``state.json``."""

    #: The stage this record belongs to (a class constant, not stored).
    STAGE: ClassVar[str] = ""
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The record as ``state.json`` and the Store hold it (shallow: its values are JSON-shaped)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any] | None) -> R:
        """The record from its dict; keys it does not know are left out, missing ones take their
        defaults (a stage that was skipped, a ``state.json`` of an older proftune)."""
        d = dict(d or {})
        version = int(d.get("schema_version") or 1)  # no version: written before records had one
        if version > SCHEMA_VERSION:
            raise ConfigError(f"the {cls.STAGE or cls.__name__} stage's outputs have schema_version={version}, "
                              f"newer than this proftune reads ({SCHEMA_VERSION}); upgrade proftune or "
                              "start a new run in another out= folder.")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in d.items() if k in known}, "schema_version": SCHEMA_VERSION})


@dataclass(frozen=True, kw_only=True)
class BaselineOutputs(StageOutputs):
    """The task's defaults trained with the health checks, and a no-tricks run beside them."""

    STAGE: ClassVar[str] = "baseline"
    #: ``params``, ``metrics``, ``epochs``, ``steps``, ``duration_s``, ``run_id``, ``stop_reason``.
    defaults: dict[str, Any] = field(default_factory=dict)
    #: ``params``, ``metrics``, ``epochs``, ``duration_s``, ``stop_reason``.
    no_tricks: dict[str, Any] = field(default_factory=dict)
    #: |defaults' metric - no-tricks' metric|: how much the task's own choices matter.
    spread: float | None = None
    #: Seconds per epoch of the plain fit loop (the health checks slow the defaults' run).
    epoch_s: float | None = None
    held_out: dict[str, Any] = field(default_factory=dict)
    #: The health checks' findings (``Finding.to_dict()``).
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: The defaults' trained weights in ``--out`` (a file name), when the fit kept a model.
    model: str | None = None

    def metric(self, run: str, name: str) -> Any:
        """The metric ``name`` of the ``defaults`` or ``no_tricks`` run (None when absent)."""
        return ((self.defaults if run == "defaults" else self.no_tricks).get("metrics") or {}).get(name)


@dataclass(frozen=True, kw_only=True)
class HealthOutputs(StageOutputs):
    """The baseline's findings by severity and the profile of its step."""

    STAGE: ClassVar[str] = "health"
    errors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    #: Error findings were there and ``--ignore-findings`` went on anyway.
    ignored: bool = False
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
    #: ``batch_size``, ``lr``, ``grad_accumulation``, ``precision``, ``optimizer_alternative``.
    computed: dict[str, Any] = field(default_factory=dict)
    max_batch_size: int | None = None
    run_id: int | None = None
    #: The steps each measurement got from the stage's share.
    steps: dict[str, Any] = field(default_factory=dict)
    #: ``name``, ``value``, ``reason``, ``confidence``, ``effect`` of each recommendation.
    recommendations: list[dict[str, Any]] = field(default_factory=list)

    def reasons(self) -> dict[str, str]:
        """Each recommendation's reason by its name."""
        return {str(r["name"]): str(r.get("reason") or "") for r in self.recommendations}


@dataclass(frozen=True, kw_only=True)
class LayerValueOutputs(StageOutputs):
    """Each layer's cost beside its measured contribution; the layers compression must keep."""

    STAGE: ClassVar[str] = "layer_value"
    metric: float | None = None  # the baseline model's metric the ablations are read against
    layers: list[dict[str, Any]] = field(default_factory=list)  # ``LayerValue.to_dict()``
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: Layer names that compression leaves whole.
    keep: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SearchStageOutputs(StageOutputs):
    """What the search stage found (groups of trials, mean +- std over seeds) and how it ended."""

    STAGE: ClassVar[str] = "search"
    study: str = ""
    plan: dict[str, Any] = field(default_factory=dict)  # ``SearchPlan.to_dict()``
    epochs_per_trial: int | None = None
    pruner: str = "none"
    full_trials_in_share: float | None = None
    #: The best group (``params``, ``mean``, ``std``, ``n``, ``trials``, ``arms``, ``trial_s``).
    best: dict[str, Any] | None = None
    top: list[dict[str, Any]] = field(default_factory=list)
    #: The task's defaults' group under the trial protocol, when measured.
    defaults: dict[str, Any] | None = None
    flags: list[dict[str, Any]] = field(default_factory=list)
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
    trials_log: list[dict[str, Any]] = field(default_factory=list)

    def fixed(self) -> dict[str, Any]:
        """The params the space fixed (not searched)."""
        return dict((self.plan.get("space") or {}).get("fixed") or {})


@dataclass(frozen=True, kw_only=True)
class FinalOutputs(StageOutputs):
    """The final race's result: the chosen params with their evidence, its figures and model."""

    STAGE: ClassVar[str] = "final"
    params: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)
    epochs: int | None = None
    default_epochs: int | None = None
    race: dict[str, Any] = field(default_factory=dict)  # ``FinalOutcome.to_dict()``
    decision: str = ""
    chosen: str = ""
    #: ``name``, ``mean``, ``std``, ``values`` on the validation data.
    metric: dict[str, Any] = field(default_factory=dict)
    #: ``mean``, ``std``, ``values`` on the held-out data.
    test: dict[str, Any] = field(default_factory=dict)
    model: str = "model.pt"
    model_seed: int | None = None
    latency_ms: float | None = None
    size_bytes: int | None = None
    model_val: float | None = None
    model_test: float | None = None
    load: str = ""


@dataclass(frozen=True, kw_only=True)
class CompressOutputs(StageOutputs):
    """The compression sweep's choice against the uncompressed model, or why it was skipped."""

    STAGE: ClassVar[str] = "compress"
    #: Why the stage did not compress (``--goal none``, too little time, a failure); None when it ran.
    skipped: str | None = None
    verdict: str | None = None
    run_id: int | None = None
    plan: Any = None
    notes: list[str] | None = None
    ignored_layers: list[str] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    selected: dict[str, Any] | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    output: str | None = None
    load: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is None:
            return super().to_dict()
        # a skipped stage says why, and holds nothing else
        return {"schema_version": self.schema_version, "skipped": self.skipped,
                **({"verdict": self.verdict} if self.verdict is not None else {})}


#: The record of each stage, by the stage's name.
STAGE_RECORDS: dict[str, type[StageOutputs]] = {
    k.STAGE: k for k in (BaselineOutputs, HealthOutputs, ComputeOutputs, LayerValueOutputs, SearchStageOutputs,
                         FinalOutputs, CompressOutputs)}
