"""The learning rate is too high: the loss climbs back up (or blows up) after falling."""

from __future__ import annotations

import math

from .._findings import Finding
from .._history import History
from ._base import BaseCheck, fmt

#: A rate this many times the range test's safe maximum is a root cause of the run.
FAR_ABOVE = 10.0


class LrTooHigh(BaseCheck):
    cause = "lr_too_high"
    explains = (
        "exploding_gradients",
        "nan_inf",
        "dead_units",
        "lr_too_low",
        "overfitting",
        "oscillating_loss",
        "saturated_activations",
        "no_lr_decay",
        "no_warmup",
    )

    def check(self, history: History) -> Finding | None:
        rise = history.lr_rise()
        if rise is None:
            return None
        lr = history.lr()
        evidence: dict[str, object] = {**rise.to_dict(), "lr": lr}
        peak = "a non-finite value" if not math.isfinite(rise.peak_loss) else fmt(rise.peak_loss)
        summary = (f"loss rose from its low of {fmt(rise.min_loss)} (step {rise.min_step}) "
                   f"to {peak} (step {rise.peak_step})")
        confidence, severity, root = 0.5, "warning", False
        test = history.lr_test
        if test is not None and lr is not None:
            evidence["range_test"] = test.summary()
            if lr > test.best_lr:
                confidence = 0.9
                # 10x over the safe maximum: the rate is the cause whatever else warm-up would mend
                # (not over batches too small for batch norm: the range test itself is noise there)
                tiny_bn = bool(history.batchnorm) and bool(history.batch_sizes) and min(history.batch_sizes) <= 8
                root = lr >= FAR_ABOVE * test.best_lr and not tiny_bn
                severity = "error" if rise.ended_above_start else "warning"
                summary += (f"; a range test puts the safe maximum at lr {fmt(test.best_lr)}, "
                            f"below the current {fmt(lr)}")
            else:
                confidence, severity = 0.3, "info"
                summary += (f"; a range test finds the current lr {fmt(lr)} at or below the safe "
                            f"maximum {fmt(test.best_lr)}")
        safe = test.best_lr if test is not None and lr is not None and lr > test.best_lr else None
        fix = (f"lower the learning rate to about {fmt(safe / 3)} (a third of the range test's "
               "safe maximum), or add warm-up; proftune.AdaptiveLR lowers it online"
               if safe else "lower the learning rate (3-10x) or add warm-up; proftune.AdaptiveLR lowers it online")
        return Finding(self.cause, severity, summary, fix, evidence, confidence, step=rise.onset, root=root)
