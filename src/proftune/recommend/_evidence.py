"""Typed views of the evidence that other packages read from a recommendation.

A :class:`~proftune.recommend.Recommendation`'s ``evidence`` is its JSON as it has always been
written (every measured number, for the report's evidence card). The few entries that optimize
and the report act on are read here, in the package that writes them, into frozen records (the
noise scale's into its own record, by :meth:`NoiseScaleResult.of`): nobody outside ``recommend``
reads an evidence key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._jsonsafe import finite_float
from ._batch_size import BatchSizeResult
from ._records import Recommendation

__all__ = ["BatchSizeEvidence", "OptimizerEvidence"]


def int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def row_evidence(rec: Recommendation | None, name: str) -> Mapping[str, Any]:
    if rec is None:
        return {}
    if rec.name != name:
        raise ValueError(f"rec is the {rec.name!r} recommendation, not {name!r}.")
    return rec.evidence


@dataclass(frozen=True)
class BatchSizeEvidence:
    """The ``batch_size`` row's measurements: the largest batch that fits the memory budget and
    the batch-size search's record (None without a budget, or in a run recorded before it was kept)."""

    max_batch_size: int | None = None
    search: BatchSizeResult | None = None
    #: A memory model was fitted (its probes may still be missing: ``search`` None).
    memory_model: bool = False

    @classmethod
    def of(cls, rec: Recommendation | None) -> BatchSizeEvidence:
        ev = row_evidence(rec, "batch_size")
        search = ev.get("search")
        return cls(max_batch_size=int_or_none(ev.get("max_batch_size")),
                   search=BatchSizeResult.from_dict(dict(search)) if isinstance(search, Mapping) else None,
                   memory_model=bool(ev.get("memory_model")))


@dataclass(frozen=True)
class OptimizerEvidence:
    """The ``optimizer`` row's chosen optimizer with the params it was compared at (its name,
    ``lr``, ``momentum`` for SGD); ``params`` is empty when nothing was compared."""

    params: Mapping[str, object] = field(default_factory=dict)

    @property
    def optimizer(self) -> str | None:
        name = self.params.get("optimizer")
        return str(name) if name is not None else None

    @property
    def lr(self) -> float | None:
        return finite_float(self.params.get("lr"))

    @property
    def momentum(self) -> float | None:
        return finite_float(self.params.get("momentum"))

    @classmethod
    def of(cls, rec: Recommendation | None) -> OptimizerEvidence:
        params = row_evidence(rec, "optimizer").get("params")
        return cls(params=dict(params) if isinstance(params, Mapping) else {})
