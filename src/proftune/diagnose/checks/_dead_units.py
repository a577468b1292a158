"""Dead units: ReLU layers whose outputs are (almost) always zero."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .._findings import Finding
from .._history import History
from ._base import BaseCheck

_RELU_TYPES = ("ReLU", "ReLU6")


@dataclass(frozen=True)
class _DeadLayer:
    """A ReLU layer's zero and dead-unit fractions over the second half of its samples, from ``onset``."""

    layer: str
    zero_frac: float
    dead_frac: float
    onset: int
    samples: int


class DeadUnits(BaseCheck):
    """ReLU layers whose outputs are zero over ``dead_threshold`` of the time, or half of whose
    units are (``dead_frac`` of LayerStats: units zero on >90% of a step's samples)."""

    cause = "dead_units"

    explains = ("vanishing_gradients", "lr_too_low", "slow_convergence")

    def check(self, history: History) -> Finding | None:
        per_layer = _relu_zero_fractions(history)
        worst = _worst_layer(per_layer, history.dead_threshold)
        if worst is None:
            return None
        at_init = worst.onset == history.samples[0][0]
        evidence = {"zero_frac": worst.zero_frac, "dead_unit_frac": worst.dead_frac,
                    "threshold": history.dead_threshold, "sampled_steps": worst.samples,
                    "per_layer": {k: statistics.fmean(z for _, z, _ in v[len(v) // 2:])
                                  for k, v in per_layer.items()},
                    "dead_from_init": at_init}
        dead_txt = (f", {worst.dead_frac:.0%} of its units are zero on >90% of samples"
                    if math.isfinite(worst.dead_frac) else "")
        summary = (f"ReLU outputs of {worst.layer} are zero {worst.zero_frac:.0%} of the time{dead_txt} "
                   f"(from step {worst.onset}{', i.e. at init' if at_init else ''})")
        fix = ("check the biases and init of the layer before it (biases near 0, kaiming init), lower "
               "the learning rate, or use LeakyReLU/GELU")
        severe = worst.zero_frac > 0.99 or (math.isfinite(worst.dead_frac) and worst.dead_frac > 0.9)
        return Finding(self.cause, "error" if severe else "warning", summary, fix, evidence,
                       0.95 if at_init else 0.7, step=worst.onset, layer=worst.layer, root=at_init)


def _relu_zero_fractions(history: History) -> dict[str, list[tuple[int, float, float]]]:
    """(step, zero fraction, dead-unit fraction) of each ReLU layer at each sampled step."""
    per_layer: dict[str, list[tuple[int, float, float]]] = {}
    for step, stats in history.samples:
        for name, s in stats.items():
            if history.types.get(name) not in _RELU_TYPES:
                continue
            act = s.get("activation") or {}
            z = act.get("zero_frac")
            if z is None or act.get("nonfinite", 0) or not math.isfinite(float(z)):
                continue
            dead = act.get("dead_frac")
            per_layer.setdefault(name, []).append((step, float(z), float(dead) if dead is not None else math.nan))
    return per_layer


def _worst_layer(per_layer: dict[str, list[tuple[int, float, float]]], threshold: float) -> _DeadLayer | None:
    """The layer most dead over the second half of its samples, and when it first was."""

    def bad(z: float, d: float) -> bool:
        return z > threshold or (math.isfinite(d) and d >= 0.5)

    worst: _DeadLayer | None = None
    worst_key = (-math.inf, -math.inf)
    for name, rows in per_layer.items():
        tail = rows[len(rows) // 2:]
        zero = statistics.fmean(z for _, z, _ in tail)
        deads = [d for _, _, d in tail if math.isfinite(d)]
        dead = statistics.fmean(deads) if deads else math.nan
        if not bad(zero, dead):
            continue
        onset = next(step for step, z, d in rows if bad(z, d))
        key = (zero, dead if math.isfinite(dead) else 0.0)
        if worst is None or key > worst_key:
            worst, worst_key = _DeadLayer(name, zero, dead, onset, len(rows)), key
    return worst
