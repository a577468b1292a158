"""The learning rate is too low: the loss hardly moves over many steps."""

from __future__ import annotations

from .._findings import Finding
from .._history import History
from ._base import BaseCheck, fmt


class LrTooLow(BaseCheck):
    cause = "lr_too_low"
    explains = ()

    def check(self, history: History) -> Finding | None:
        plateau = history.plateau()
        if plateau is None:
            return None
        lr = history.lr()
        evidence: dict[str, object] = {**plateau.to_dict(), "lr": lr}
        summary = (f"loss went from {fmt(plateau.start_loss)} to {fmt(plateau.final_loss)} "
                   f"({-plateau.relative_drop:+.1%}) over {plateau.steps} steps")
        confidence, severity, fix = 0.4, "warning", "raise the learning rate (run an LR range test)"
        test = history.lr_test
        if test is not None and lr is not None:
            evidence["range_test"] = test.summary()
            if test.improved and test.best_lr >= 30 * lr:
                confidence = 0.85
                summary += (f"; a range test finds the loss still falling at lr {fmt(test.best_lr)}, "
                            f"{fmt(test.best_lr / lr)}x the current {fmt(lr)}")
                fix = (f"raise the learning rate to about {fmt(test.best_lr / 3)} (a third of the "
                       "range test's safe maximum)")
            else:
                confidence, severity = 0.2, "info"
                summary += "; a range test does not find a much larger rate that trains faster"
                fix = "look at the model and data (dead or saturated units, labels) before the learning rate"
        return Finding(self.cause, severity, summary, fix, evidence, confidence,
                       step=history.steps[0]["step"] if history.steps else None)
