"""The linear memory model of a training step: peak(B) = a + b·B, and its safety margin.

``find_batch_size`` fits it to measured steps, ``predict`` to fake-traced ones; both answer the
largest batch under a budget from it, with the same margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._records import JsonRecord

__all__ = ["MIN_MARGIN_FRACTION", "RESIDUAL_MARGIN", "MemoryModel", "fit_memory_model"]

#: The smallest margin, as a fraction of the budget: allocator rounding and run-to-run jitter
#: that three points cannot show.
MIN_MARGIN_FRACTION = 0.005
#: The margin is this many times the largest residual of the fit.
RESIDUAL_MARGIN = 2.0

@dataclass(frozen=True)
class MemoryModel(JsonRecord):
    """peak(B) = intercept_bytes + per_sample_bytes·B, fitted by least squares."""

    DERIVED: ClassVar[tuple[str, ...]] = ("formula",)
    #: Said in the JSON beside the figures.
    formula: ClassVar[str] = "peak(B) = intercept_bytes + per_sample_bytes * B"

    intercept_bytes: float
    per_sample_bytes: float
    #: Largest |measured − fitted| over the points of the fit, bytes.
    residual_bytes: float
    margin_bytes: float
    points: int

    def predict(self, batch_size: float) -> float:
        return self.intercept_bytes + self.per_sample_bytes * batch_size

    def largest_batch(self, budget: float) -> int:
        """The largest B whose predicted peak plus the margin stays within ``budget``."""
        if self.per_sample_bytes <= 0:
            return 0
        return math.floor((budget - self.margin_bytes - self.intercept_bytes) / self.per_sample_bytes)


def fit_memory_model(points: Sequence[tuple[int, int]], budget: float) -> MemoryModel:
    """Least-squares line through ``(batch_size, peak_bytes)``; margin from the residual."""
    xs = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    if len(set(xs.tolist())) < 2:
        raise ValueError("a memory model needs peaks at two different batch sizes at least.")
    slope, intercept = np.polyfit(xs, ys, 1)
    resid = float(np.max(np.abs(ys - (intercept + slope * xs))))
    margin = max(RESIDUAL_MARGIN * resid, MIN_MARGIN_FRACTION * budget)
    return MemoryModel(intercept_bytes=float(intercept), per_sample_bytes=float(slope),
                       residual_bytes=resid, margin_bytes=margin, points=len(points))
