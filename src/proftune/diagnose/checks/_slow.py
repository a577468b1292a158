"""Slow convergence: the loss falls, but at a pace that leaves it far from converged."""

from __future__ import annotations

from .._findings import Finding
from .._history import History
from ._base import BaseCheck, fmt

#: ``||update|| / ||weight||`` per step that healthy training shows (about 1e-3, CS231n's rule
#: of thumb); ten times less moves the weights too slowly.
HEALTHY_UPDATE_RATIO = 1e-3


class SlowConvergence(BaseCheck):
    cause = "slow_convergence"
    explains = ()

    def check(self, history: History) -> Finding | None:
        slow = history.slow_progress()
        if slow is None:
            return None
        lr, test, ratio = history.lr(), history.lr_test, history.update_ratio()
        evidence: dict[str, object] = {**slow.to_dict(), "lr": lr, "update_ratio": ratio,
                                       "healthy_update_ratio": HEALTHY_UPDATE_RATIO}
        summary = (f"the loss fell only {slow.relative_drop:.0%} over {slow.steps} steps "
                   f"({fmt(slow.start_loss)} -> {fmt(slow.final_loss)}) and the last quarter still made "
                   f"{slow.last_quarter_share:.0%} of that progress: far from converged")
        tiny = ratio is not None and ratio < HEALTHY_UPDATE_RATIO / 10
        if ratio is not None:
            summary += (f"; each step moves the weights by {fmt(ratio)} of their norm (healthy: about "
                        f"{fmt(HEALTHY_UPDATE_RATIO)})")
        faster = test is not None and lr is not None and test.improved and test.best_lr >= 10 * lr
        if test is not None and lr is not None:
            evidence["range_test"] = test.summary()
            summary += (f"; a range test finds the loss still falling at lr {fmt(test.best_lr)}, "
                        f"{fmt(test.best_lr / lr)}x the current {fmt(lr)}" if faster else
                        f"; a range test does not find a much larger rate (safe maximum {fmt(test.best_lr)})")
        if faster or tiny:
            target = test.best_lr / 3 if faster and test is not None else None
            fix = (f"raise the learning rate to about {fmt(target)} (a third of the range test's safe maximum)"
                   if target else "raise the learning rate (run an LR range test), or use momentum / Adam")
            return Finding(self.cause, "warning", summary, fix, evidence, 0.8 if faster and tiny else 0.65,
                           step=history.steps[0]["step"] if history.steps else None)
        fix = "train longer, or look at the model and data (saturated or dead units, unscaled inputs)"
        return Finding(self.cause, "info", summary, fix, evidence, 0.3,
                       step=history.steps[0]["step"] if history.steps else None)
