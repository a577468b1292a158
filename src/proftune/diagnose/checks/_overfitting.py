"""Overfitting: the validation curve stopped improving while the training loss kept falling and the
train/validation gap grew (in loss, and in accuracy where the task reports it)."""

from __future__ import annotations

import math

from .._findings import Finding
from .._history import History
from ._base import BaseCheck, fmt

#: AUTOTRAINER's (ICSE 2021) "test not well" gap: train accuracy above 0.9 and 7 points above
#: validation, or 10 points at a train accuracy of 0.9 or less.
ACC_GAP_HIGH, ACC_GAP_LOW = 0.07, 0.10
#: Relative rise of the validation loss from its minimum that counts (5%), and that is large
#: enough on its own when no accuracy is known (25%).
RISE, LARGE_RISE = 0.05, 0.25


class Overfitting(BaseCheck):
    cause = "overfitting"
    explains = ()

    def check(self, history: History) -> Finding | None:
        ep = [e for e in history.epochs if math.isfinite(float(e.get("val_loss", math.nan)))
              and math.isfinite(float(e.get("train_loss", math.nan)))]
        if len(ep) < 3:
            return None
        vals = [float(e["val_loss"]) for e in ep]
        trains = [float(e["train_loss"]) for e in ep]
        best = min(range(len(vals)), key=vals.__getitem__)
        since = len(vals) - 1 - best
        gap_best, gap_end = vals[best] - trains[best], vals[-1] - trains[-1]
        # relative to the best loss, but not to a near-zero one (a perfect fit's 1e-9)
        rise = (vals[-1] - vals[best]) / max(vals[best], 0.01 * vals[0], 1e-12)
        if not (since >= 1 and trains[-1] < trains[best] and gap_end > gap_best and rise > RISE):
            return None
        stalled = since >= max(2, math.ceil(0.15 * len(vals)))
        acc = _accuracy_gap(history)
        severe_gap = acc is not None and acc["gap"] >= (ACC_GAP_HIGH if acc["train"] > 0.9 else ACC_GAP_LOW)
        warning = stalled and (severe_gap or (acc is None and rise >= LARGE_RISE))
        w0, w1 = ep[best].get("weight_norm"), ep[-1].get("weight_norm")
        first_epoch = int(ep[0].get("epoch", 1))
        best_epoch = int(ep[best].get("epoch", best + first_epoch))
        evidence: dict[str, object] = {
            "best_epoch": best_epoch, "epochs": len(vals), "epochs_since_best": since,
            "best_val_loss": vals[best], "final_val_loss": vals[-1], "val_loss_rise": rise,
            "final_train_loss": trains[-1], "gap_at_best": gap_best, "gap_at_end": gap_end,
            "weight_norm_at_best": w0, "weight_norm_at_end": w1}
        if acc is not None:
            evidence.update(train_accuracy=acc["train"], val_accuracy=acc["val"], accuracy_gap=acc["gap"])
        summary = (f"validation loss has not improved for {since} of {len(vals)} epochs: up {rise:.0%} from "
                   f"{fmt(vals[best])} at epoch {best_epoch} to {fmt(vals[-1])}, while the train loss fell from "
                   f"{fmt(trains[best])} to {fmt(trains[-1])}")
        if acc is not None:
            summary += (f"; train accuracy {acc['train']:.1%} vs {acc['val']:.1%} on validation "
                        f"(gap {acc['gap'] * 100:.1f} points)")
        if w0 and w1:
            summary += f"; weight norm {fmt(w0)} -> {fmt(w1)}"
        if not warning:
            summary += ("; the accuracy gap is small, the model mostly grows over-confident"
                        if acc is not None else "")
        fix = (f"stop early at epoch {best_epoch} (proftune.EarlyStopping with restore_best), add weight decay "
               "or dropout, or use more data/augmentation")
        return Finding(self.cause, "warning" if warning else "info", summary, fix, evidence,
                       0.8 if warning else 0.4, step=int(ep[best].get("step", 0)) or None)


def _accuracy_gap(history: History) -> dict[str, float] | None:
    """Train accuracy (the final model on the training data) against the last validation accuracy."""
    train = history.train_metrics.get("accuracy")
    val = history.epochs[-1].get("accuracy") if history.epochs else None
    if train is None or val is None or not (math.isfinite(float(train)) and math.isfinite(float(val))):
        return None
    return {"train": float(train), "val": float(val), "gap": float(train) - float(val)}
