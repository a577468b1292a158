"""Learning-rate schedules: no warm-up where an early spike shows one is needed, and no decay
where the loss sits on a noisy floor that a lower rate would lower. Each is confirmed by a short
run (:mod:`proftune.diagnose._probes`) when ``diagnose`` could make one."""

from __future__ import annotations

import math
import statistics

from .._findings import Finding
from .._history import History, early_rise
from ._base import BaseCheck, fmt
from ._lr_too_high import FAR_ABOVE

#: Optimizers whose first steps are taken on second-moment estimates from a few batches (the
#: reason for warm-up: Liu et al. 2020, "On the Variance of the Adaptive Learning Rate").
_ADAPTIVE = ("adam", "adamw", "radam", "nadam", "adamax", "rmsprop", "adagrad")
#: Layers with which warm-up is standard practice (Transformers, Vaswani et al. 2017).
_WARMUP_LAYERS = ("MultiheadAttention", "LayerNorm", "TransformerEncoderLayer", "TransformerDecoderLayer")


class NoWarmup(BaseCheck):
    """The run starts at its full rate where warm-up is expected and trains badly (an early climb,
    a rise, a plateau, slow progress or oscillation); confirmed when the same run with a linear
    warm-up ends its probe window 20%+ lower without climbing itself."""

    cause = "no_warmup"

    explains = ("lr_too_high", "exploding_gradients", "oscillating_loss", "dead_units")

    def check(self, history: History) -> Finding | None:
        if not warmup_suspected(history):
            return None
        lrs = history.lrs()
        early = history.early_instability()
        evidence: dict[str, object] = {"lr": lrs[0], "optimizer": history.optimizer,
                                       "early_climb": early.to_dict() if early is not None else None}
        summary = f"the run starts at its full learning rate {fmt(lrs[0])} ({history.optimizer or 'optimizer'}"
        layers = sorted({t for t in history.types.values() if t in _WARMUP_LAYERS})
        summary += (f", {'/'.join(layers)} in the model)" if layers else ")")
        if early is not None:
            summary += (f" and the smoothed loss climbed from {fmt(early.low_loss)} at step {early.low_step} "
                        f"back to {fmt(early.peak_loss)} at step {early.peak_step}")
        probe = history.warmup_probe
        if probe is None:
            fix = "warm the learning rate up linearly over the first ~5% of the steps"
            return Finding(self.cause, "info", summary, fix, evidence, 0.3, step=1)
        n, w = probe.steps, probe.warmup_steps
        ours = [v for v in probe.losses if math.isfinite(v)]
        orig = [r["loss"] for r in history.steps[:n] if math.isfinite(r["loss"])]
        if len(ours) < n or len(orig) < n:
            return None  # the probe or the run broke off: nothing to compare
        k = max(n // 3, 1)
        ours_tail, orig_tail = statistics.fmean(ours[-k:]), statistics.fmean(orig[-k:])
        climb = early_rise(list(enumerate(ours, start=1)))
        climb_rise = max(climb.rise, 0.0) if climb else 0.0
        gain = 1 - ours_tail / orig_tail if orig_tail > 0 else 0.0
        evidence["probe"] = {"steps": n, "warmup_steps": w, "lr": probe.lr, "loss_with_warmup": ours_tail,
                             "loss_without": orig_tail, "relative_gain": gain, "climb_with_warmup": climb_rise}
        if gain < 0.2 or climb_rise >= 0.2:
            return None  # warm-up does not fix it (or only delays the climb): not the missing warm-up
        summary += (f"; the same run with {w} steps of linear warm-up reached a loss of {fmt(ours_tail)} over steps "
                    f"{n - k + 1}-{n} against {fmt(orig_tail)} without ({gain:.0%} lower), with no climb")
        fix = (f"warm the learning rate up linearly over the first {w} steps (or about 5% of training), "
               "e.g. torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=N)")
        test = history.lr_test
        far = test is not None and lrs[0] >= FAR_ABOVE * test.best_lr
        if far:
            assert test is not None
            summary += (f"; but the rate is {fmt(lrs[0] / test.best_lr)}x the range test's safe maximum "
                        f"{fmt(test.best_lr)}: lowering it comes first")
        return Finding(self.cause, "warning", summary, fix, evidence, 0.6 if far else 0.85, step=1, root=not far)


class NoLrDecay(BaseCheck):
    cause = "no_lr_decay"
    explains = ("oscillating_loss",)

    def check(self, history: History) -> Finding | None:
        lr = history.constant_lr()
        tail = history.stalled_tail()
        if lr is None or tail is None:
            return None
        evidence: dict[str, object] = {**tail.to_dict(), "lr": lr}
        summary = (f"the learning rate stayed at {fmt(lr)} for all {len(history.lrs())} steps and the last "
                   f"{tail.tail_steps} made {max(tail.tail_progress, 0.0):.0%} of the run's progress: the "
                   f"loss sits at {fmt(tail.tail_loss)} with a step-to-step spread of {tail.tail_noise:.0%}")
        probe = history.decay_probe
        severity, confidence = "info", 0.35
        if probe is not None:
            evidence["probe"] = probe.to_dict()
            if probe.relative_gain >= 0.1:
                severity, confidence = "warning", 0.8
                summary += (f"; {probe.steps} more steps at lr {fmt(probe.decayed_lr)} lowered the train loss "
                            f"to {fmt(probe.decayed_loss)} against {fmt(probe.constant_loss)} at the same rate "
                            f"({probe.relative_gain:.0%} lower)")
            else:
                return None  # a lower rate does not help: the floor is not the rate's noise
        fix = ("decay the learning rate (cosine to ~0 over the run, or step it down 10x for the last "
               "quarter: torch.optim.lr_scheduler.CosineAnnealingLR)")
        return Finding(self.cause, severity, summary, fix, evidence, confidence,
                       step=history.steps[-tail.tail_steps]["step"] if history.steps else None)


def wants_warmup(history: History) -> bool:
    """Warm-up is expected: an adaptive optimizer, or attention / LayerNorm in the model."""
    opt = (history.optimizer or str(history.params.get("optimizer", ""))).lower()
    return opt in _ADAPTIVE or any(t in _WARMUP_LAYERS for t in history.types.values())


def warmup_steps(history: History) -> int:
    """The warm-up a probe tries: 10% of the run's steps, 20 to 100."""
    return min(100, max(20, len(history.steps) // 10))


def warmup_suspected(history: History) -> bool:
    """Warm-up is expected, the rate is at its full value from step 1 over the warm-up window,
    and the run shows trouble that warm-up could be behind."""
    lrs = history.lrs()
    w = warmup_steps(history)
    if len(lrs) < 3 * w or not wants_warmup(history) or lrs[0] < 0.99 * max(lrs[:w]):
        return False
    return history.nonfinite is None and bool(history.early_instability() or history.lr_rise()
                                              or history.plateau() or history.slow_progress()
                                              or history.oscillation() or history.stalled_high())
