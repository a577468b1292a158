"""What a :class:`HealthCheck` recorded of a run: the one record every check reads.

The recorder fills it while training runs; the checks (``diagnose/checks/``) only read it, so a
check can be tested on a History built by hand.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch

from ._lrtest import RangeTest

__all__ = ["History", "LayerSample", "StepRecord"]

#: (1-based step, per-layer statistics of :class:`proftune.profile.LayerStats` at that step).
LayerSample = tuple[int, dict[str, dict[str, Any]]]


class StepRecord(TypedDict):
    """One optimizer step: its loss, global gradient norm and lr, and the norm's running median."""

    step: int
    loss: float
    grad_norm: float
    lr: float | None
    median: float
    ratio: float  # grad_norm / median (NaN until the median is known)


@dataclass
class History:
    """Signals of one run: every step, sampled per-layer statistics, epochs, labels, model facts.

    ``nonfinite`` describes the first step whose loss or gradients were NaN/Inf (``step``,
    ``phase`` forward/backward/loss, ``layer``, ``type``, ``inputs_finite``, ``loss``, ...).
    """

    spike_factor: float = 10.0
    dead_threshold: float = 0.9
    steps: list[StepRecord] = field(default_factory=list)
    samples: list[LayerSample] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    labels: list[torch.Tensor] = field(default_factory=list)
    nonfinite: dict[str, Any] | None = None
    lr_test: RangeTest | None = None
    batchnorm: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    fan_in: dict[str, int] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    input_rms: dict[int, float] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

    # -- derived signals that several checks share -----------------------------------------
    def losses(self) -> list[tuple[int, float]]:
        return [(r["step"], r["loss"]) for r in self.steps]

    def lr(self) -> float | None:
        """The last learning rate used, else the params' ``lr``."""
        for r in reversed(self.steps):
            if r["lr"] is not None:
                return float(r["lr"])
        lr = self.params.get("lr")
        return float(lr) if lr is not None else None

    def smoothed(self, beta: float = 0.8) -> list[tuple[int, float]]:
        """Bias-corrected exponential moving average of the finite losses."""
        out, avg = [], 0.0
        finite = [(s, v) for s, v in self.losses() if math.isfinite(v)]
        for i, (s, v) in enumerate(finite):
            avg = beta * avg + (1 - beta) * v
            out.append((s, avg / (1 - beta ** (i + 1))))
        return out

    def spikes(self) -> list[StepRecord]:
        """Steps whose gradient norm reached ``spike_factor`` times its running median."""
        return [r for r in self.steps if math.isfinite(r["ratio"]) and r["ratio"] >= self.spike_factor]

    def lr_rise(self) -> dict[str, Any] | None:
        """The loss rose back by more than half of the progress made (or blew up)."""
        curve = self.smoothed()
        if len(curve) < 5:
            return None
        start = statistics.fmean(v for _, v in curve[:3])
        found = _rise_onset(curve, start)
        blew_up = self.nonfinite is not None
        if found is None and not blew_up:
            return None
        final = curve[-1][1]
        tail = [v for s, v in self.losses()[-max(len(curve) // 5, 5):] if math.isfinite(v)]
        if found is None:
            assert self.nonfinite is not None
            low, low_step = min((v, s) for s, v in curve)
            found = {"onset": int(self.nonfinite["step"]), "min_loss": low, "min_step": low_step,
                     "peak_loss": math.inf, "peak_step": int(self.nonfinite["step"])}
        return {"start_loss": start, "min_loss": found["min_loss"], "min_step": found["min_step"],
                "min_loss_overall": min(v for _, v in curve),
                "peak_loss": found["peak_loss"], "peak_step": found["peak_step"],
                "final_loss": final, "onset": found["onset"],
                "ended_above_start": final > start,
                "tail_cv": statistics.pstdev(tail) / max(statistics.fmean(tail), 1e-12) if len(tail) > 1 else None}

    def plateau(self) -> dict[str, Any] | None:
        """The smoothed loss fell by less than 10% over at least 30 steps."""
        curve = self.smoothed()
        if len(curve) < 30:
            return None
        n = max(len(curve) // 10, 3)
        start = statistics.fmean(v for _, v in curve[:n])
        end = statistics.fmean(v for _, v in curve[-n:])
        drop = (start - end) / max(abs(start), 1e-12)
        if drop >= 0.1:
            return None
        return {"start_loss": start, "final_loss": end, "relative_drop": drop, "steps": len(curve)}


def _rise_onset(curve: list[tuple[int, float]], start: float) -> dict[str, Any] | None:
    """Where the smoothed loss first climbed back above its low, and its peak after that."""
    low, low_step, onset, peak, peak_step = math.inf, 0, None, -math.inf, 0
    low_before, low_before_step = math.nan, 0
    for s, v in curve:
        if onset is None:
            progress = max(start - low, 0.1 * start) if math.isfinite(low) else 0.1 * start
            if math.isfinite(low) and v > low + 0.5 * progress and v > 1.2 * low:
                onset, low_before, low_before_step = s, low, low_step
        if v > peak and onset is not None:
            peak, peak_step = v, s
        if v < low:
            low, low_step = v, s
    if onset is None:
        return None
    return {"onset": onset, "min_loss": low_before, "min_step": low_before_step,
            "peak_loss": peak, "peak_step": peak_step}
