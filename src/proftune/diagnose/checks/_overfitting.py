"""Overfitting: the validation loss rises from its best epoch while the training loss keeps falling."""

from __future__ import annotations

import math

from .._findings import Finding
from .._history import History
from ._base import BaseCheck, fmt


class Overfitting(BaseCheck):
    cause = "overfitting"

    def check(self, history: History) -> Finding | None:
        ep = [e for e in history.epochs if math.isfinite(float(e.get("val_loss", math.nan)))
              and math.isfinite(float(e.get("train_loss", math.nan)))]
        if len(ep) < 3:
            return None
        vals = [float(e["val_loss"]) for e in ep]
        best = min(range(len(vals)), key=vals.__getitem__)
        if best >= len(vals) - 1:
            return None
        gap_best = vals[best] - float(ep[best]["train_loss"])
        gap_end = vals[-1] - float(ep[-1]["train_loss"])
        rise = vals[-1] / max(vals[best], 1e-12) - 1
        train_fell = float(ep[-1]["train_loss"]) < float(ep[best]["train_loss"])
        if not (train_fell and gap_end > gap_best and rise > 0.05):
            return None
        w0, w1 = ep[best].get("weight_norm"), ep[-1].get("weight_norm")
        evidence = {"best_epoch": ep[best].get("epoch", best + 1), "best_val_loss": vals[best],
                    "final_val_loss": vals[-1], "val_loss_rise": rise, "gap_at_best": gap_best,
                    "gap_at_end": gap_end, "weight_norm_at_best": w0, "weight_norm_at_end": w1}
        severity = "warning" if rise > 0.25 and len(vals) - 1 - best >= 2 else "info"
        summary = (f"validation loss rose {rise:.0%} since epoch {evidence['best_epoch']} while the train loss kept "
                   f"falling; the gap grew from {fmt(gap_best)} to {fmt(gap_end)}"
                   + (f", weight norm {fmt(w0)} -> {fmt(w1)}" if w0 and w1 else ""))
        fix = ("stop early (proftune.EarlyStopping with restore_best), add weight decay or dropout, "
               "or use more data/augmentation")
        return Finding(self.cause, severity, summary, fix, evidence, 0.8 if severity == "warning" else 0.4,
                       step=int(ep[best].get("step", 0)) or None)
