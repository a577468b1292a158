"""Vanishing gradients: the early layers get orders of magnitude smaller gradients than the late."""

from __future__ import annotations

import math
import statistics

from .._findings import Finding
from .._history import History, grad_norm
from ._base import BaseCheck, fmt


class VanishingGradients(BaseCheck):
    cause = "vanishing_gradients"
    explains = ("lr_too_low", "slow_convergence")

    def check(self, history: History) -> Finding | None:
        norms = layer_grad_norms(history)
        if len(norms) < 3:
            return None
        names = list(norms)
        k = max(1, len(names) // 3)
        early = statistics.fmean(norms[n] for n in names[:k])
        late = statistics.fmean(norms[n] for n in names[-k:])
        if late <= 0:
            return None
        ratio = early / late
        if ratio >= 1e-2:
            return None
        severity = "warning" if ratio < 1e-3 else "info"
        evidence = {"early_grad_norm": early, "late_grad_norm": late, "ratio": ratio,
                    "early_layers": names[:k], "late_layers": names[-k:], "per_layer": norms}
        summary = (f"early layers' gradient norms are {fmt(ratio)} of the late layers' "
                   f"({fmt(early)} vs {fmt(late)})")
        fix = ("use ReLU-family activations instead of saturating ones, residual connections, "
               "normalisation layers, or a variance-preserving init (kaiming/xavier)")
        step = history.samples[0][0] if history.samples else None
        return Finding(self.cause, severity, summary, fix, evidence,
                       0.8 if ratio < 1e-3 else 0.4, step=step, layer=names[0])


def layer_grad_norms(history: History) -> dict[str, float]:
    """Median gradient norm of each weight layer over the sampled steps, forward order."""
    out: dict[str, list[float]] = {}
    for _, stats in history.samples:
        norms = {name: grad_norm(s) for name, s in stats.items() if name in history.fan_in}
        # a layer with exactly zero gradient is dead (no signal at all), not vanishing
        if not norms or not all(math.isfinite(g) and g > 0 for g in norms.values()):
            continue
        for name, g in norms.items():
            out.setdefault(name, []).append(g)
    return {k: statistics.median(v) for k, v in out.items()}
