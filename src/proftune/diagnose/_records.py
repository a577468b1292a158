"""What ``diagnose`` and ``bandit`` return: frozen, versioned records, each Run holding its
:meth:`to_dict` and the report reading it back through :meth:`from_dict`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._jsonsafe import finite_float
from .._records import JsonRecord, Reader, each, mapping, optional, record_fields, stored_version
from ._findings import Finding
from ._lrtest import RangeTest

__all__ = ["DIAGNOSE_SCHEMA_VERSION", "ArmResult", "BanditPull", "BanditResult", "DiagnoseResult"]


#: Bumped when a field of :class:`DiagnoseResult`'s or :class:`BanditResult`'s JSON changes meaning.
DIAGNOSE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class DiagnoseResult(JsonRecord):
    """Findings of a diagnosis run, most likely cause first, and what the run measured.

    A frozen, versioned record: :func:`diagnose` builds it, its Run holds :meth:`to_dict`, and
    the report reads it back through :meth:`from_dict`.
    """

    WHAT: ClassVar[str] = "a diagnosis"
    SCHEMA: ClassVar[int | None] = DIAGNOSE_SCHEMA_VERSION
    READERS: ClassVar[dict[str, Reader]] = {"findings": each(Finding.from_dict),
                                            "lr_test": optional(RangeTest.from_dict)}
    DERIVED: ClassVar[tuple[str, ...]] = ("healthy",)

    run_id: int | None
    task: str
    findings: list[Finding]
    metrics: dict[str, float]
    steps: int
    epochs: int
    stop_reason: str | None
    duration_s: float
    params: Mapping[str, Any]
    lr_test: RangeTest | None = None
    schema_version: int = DIAGNOSE_SCHEMA_VERSION

    @property
    def top(self) -> Finding | None:
        """The most likely cause, or None for a healthy run."""
        return self.findings[0] if self.findings else None

    @property
    def healthy(self) -> bool:
        """No finding of warning or error severity."""
        return not any(f.severity in ("warning", "error") for f in self.findings)

    def to_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id, "task": self.task,
            "findings": [f.to_dict() for f in self.findings],
            "healthy": self.healthy,
            "metrics": self.metrics, "steps": self.steps, "epochs": self.epochs,
            "stop_reason": self.stop_reason, "duration_s": self.duration_s,
            "params": {k: v for k, v in self.params.items() if not str(k).startswith("_")},
            "lr_test": self.lr_test.to_dict() if self.lr_test else None,
            "schema_version": self.schema_version,
        }


@dataclass(frozen=True)
class ArmResult(JsonRecord):
    """One configuration at the end of a bandit session: its pulls and reward in the metric's
    own direction (the bandit maximises the sign-adjusted reward; this is the metric as measured)."""

    WHAT: ClassVar[str] = "a bandit arm"
    READERS: ClassVar[dict[str, Reader]] = {"mean": finite_float, "std": finite_float}

    arm: str
    pulls: int
    mean: float | None
    std: float | None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BanditPull:
    """One round: the configuration pulled, its metric, and the ``train`` Run that measured it."""

    round: int
    arm: str
    value: float | None
    run_id: int | None

    def to_dict(self, metric: str) -> dict[str, object]:
        """Keyed by the metric's name (``{"round": 1, "arm": "a", "accuracy": 0.9, "run_id": 7}``)."""
        return {"round": self.round, "arm": self.arm, metric: self.value, "run_id": self.run_id}

    @classmethod
    def from_dict(cls, d: object, metric: str) -> BanditPull:
        keyed = {("value" if k == metric else k): v for k, v in d.items()} if isinstance(d, Mapping) else d
        kw = record_fields(cls, mapping(keyed, what=f"a bandit pull (metric {metric})"),
                           what=f"a bandit pull (metric {metric})")
        return cls(**{**kw, "value": finite_float(kw["value"])})


@dataclass(frozen=True)
class BanditResult:
    """A bandit session: allocation, arm statistics, regret curve, best configuration.

    A frozen, versioned record: :func:`bandit` builds it, its Run holds :meth:`to_dict`, and the
    report reads it back through :meth:`from_dict`.
    """

    run_id: int | None
    name: str
    policy: str
    metric: str
    mode: str
    pulls: list[BanditPull]
    arms: list[ArmResult]
    best: str
    regret: list[float]
    total_pulls: int
    uniform_regret: list[float] = field(default_factory=list)
    schema_version: int = DIAGNOSE_SCHEMA_VERSION

    def to_dict(self) -> dict[str, object]:
        return {"run_id": self.run_id, "bandit": self.name, "policy": self.policy, "metric": self.metric,
                "mode": self.mode, "best": self.best, "total_pulls": self.total_pulls,
                "arms": [a.to_dict() for a in self.arms], "pulls": [p.to_dict(self.metric) for p in self.pulls],
                "regret": self.regret, "uniform_regret": self.uniform_regret,
                "schema_version": self.schema_version}

    @classmethod
    def from_dict(cls, d: object) -> BanditResult:
        """The record back from :meth:`to_dict`'s JSON (a ``bandit`` Run's result)."""
        renamed = {("name" if k == "bandit" else k): v for k, v in d.items()} if isinstance(d, Mapping) else d
        stored_version(renamed, what="a bandit session", current=DIAGNOSE_SCHEMA_VERSION)
        kw = record_fields(cls, mapping(renamed, what="a bandit session"), what="a bandit session")
        metric = str(kw["metric"])
        kw["arms"] = [ArmResult.from_dict(a) for a in kw["arms"] or []]
        kw["pulls"] = [BanditPull.from_dict(p, metric) for p in kw["pulls"] or []]
        return cls(**kw)
