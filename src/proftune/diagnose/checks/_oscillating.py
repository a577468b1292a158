"""Oscillating loss: the loss climbs back up again and again instead of settling. The cause is
looked for in a fixed order: the learning rate, the order of the data, the gradient norm, the
diversity of the batches; the first that holds is named, with its fix."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..._records import JsonRecord
from .._findings import Finding
from .._history import History
from ._base import BaseCheck, fmt

#: The finding that stands for each of the four causes, where there is one.
_CAUSE_OF = {"learning rate": "lr_too_high", "data order": "unshuffled_data", "gradient norm": "exploding_gradients"}


@dataclass(frozen=True)
class CauseProbe(JsonRecord):
    """One of the four causes looked at: ``verdict`` yes, no or unknown, with the figures in ``detail``."""

    name: str
    fix: str
    verdict: str
    detail: str


class OscillatingLoss(BaseCheck):
    cause = "oscillating_loss"
    explains = ()

    def check(self, history: History) -> Finding | None:
        osc = history.oscillation()
        if osc is None:
            return None
        probes = [_lr(history), _shuffle(history), _grad_norm(history), _batch_diversity(history)]
        named = next((p for p in probes if p.verdict == "yes"), None)
        evidence: dict[str, object] = {**osc.to_dict(), "causes_checked": [p.to_dict() for p in probes],
                                       "cause_found": named.name if named else None,
                                       "attributed_to": _CAUSE_OF.get(named.name) if named else None}
        summary = (f"the loss rose {osc.rises} times between windows of {osc.window_steps} steps "
                   f"(largest +{fmt(osc.largest_rise)} at step {osc.largest_rise_step}; start "
                   f"{fmt(osc.start_loss)}, low {fmt(osc.low)}, end {fmt(osc.final_loss)}); causes "
                   "checked in order: " + "; ".join(f"{p.name}: {p.verdict} ({p.detail})" for p in probes))
        fix = named.fix if named else ("no cause among the four was confirmed: lower the learning rate "
                                          "3x and clip gradients, then look again")
        # without a cause among the four the rises may be a low loss's batch noise: not an alarm
        return Finding(self.cause, "warning" if named else "info", summary, fix, evidence, 0.7 if named else 0.4,
                       step=osc.first_rise_step)


def _lr(history: History) -> CauseProbe:
    lr, test = history.lr(), history.lr_test
    name, fix = "learning rate", "lower the learning rate 3-10x (or add warm-up and decay)"
    if lr is None or test is None:
        return CauseProbe(name, fix, "unknown", "no LR range test")
    if lr > test.best_lr:
        return CauseProbe(name, f"lower the learning rate to about {fmt(test.best_lr / 3)} (a third of the "
                          "range test's safe maximum)", "yes",
                          f"lr {fmt(lr)} is above the range test's safe maximum {fmt(test.best_lr)}")
    return CauseProbe(name, fix, "no", f"lr {fmt(lr)} is within the range test's safe maximum {fmt(test.best_lr)}")


def _shuffle(history: History) -> CauseProbe:
    order = history.label_order()
    name, fix = "data order", "shuffle the training data every epoch (DataLoader(shuffle=True))"
    if order is None:
        return CauseProbe(name, fix, "unknown", "no class labels in the batches")
    detail = (f"consecutive samples share a label {order.adjacent_same_label:.0%} of the time "
              f"(shuffled {order.expected_if_shuffled:.0%})")
    return CauseProbe(name, fix, "yes" if order.excess >= 0.3 else "no", detail)


def _grad_norm(history: History) -> CauseProbe:
    norms = [r["grad_norm"] for r in history.steps if math.isfinite(r["grad_norm"])]
    name, fix = "gradient norm", "clip the gradient norm (param grad_clip, proftune.GradGuard)"
    if len(norms) < 10:
        return CauseProbe(name, fix, "unknown", "too few gradient norms")
    half = norms[len(norms) // 2:]
    cv = statistics.pstdev(half) / max(statistics.fmean(half), 1e-12)
    spikes = len(history.spikes())
    detail = f"{spikes} steps at >= {fmt(history.spike_factor)}x the running median; spread {cv:.0%} of its mean"
    return CauseProbe(name, fix, "yes" if spikes >= 2 or cv >= 1.0 else "no", detail)


def _batch_diversity(history: History) -> CauseProbe:
    name, fix = "batch diversity", "use larger batches (16+ samples, holding most classes), or gradient accumulation"
    order = history.label_order()
    bs = statistics.median(history.batch_sizes) if history.batch_sizes else None
    if bs is None:
        return CauseProbe(name, fix, "unknown", "batch size not seen")
    if order is not None:
        few = order.labels_per_batch < 0.5 * order.classes
        detail = f"batches of {bs:g} hold {order.labels_per_batch:.1f} of {order.classes} classes"
        return CauseProbe(name, fix, "yes" if few or bs < 16 else "no", detail)
    return CauseProbe(name, fix, "yes" if bs < 16 else "no", f"batches of {bs:g} samples")
