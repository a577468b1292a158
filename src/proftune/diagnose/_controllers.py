"""Controllers that adapt training while it runs, as fit-loop callbacks (and Monitor callbacks).

- :class:`AdaptiveLR` lowers the learning rate when the gradient noise (an EMA of the variance
  of the global gradient norm, relative to its EMA mean) crosses a threshold, and raises it back
  when training has been stable for a while; every change is logged with its reason.
- :class:`GradGuard` clips the gradients of a step whose norm spikes against the running median,
  and skips a step whose gradients are not finite.
- :class:`EarlyStopping` stops when a metric has not improved by ``min_delta`` for ``patience``
  evaluations, and restores the best weights.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from typing import Any

import torch

from .._tensors import global_grad_norm
from ..exceptions import ConfigError, ProblemCollector
from ..metrics import direction, is_known, resolve_direction
from ..train import Callback, FitState

__all__ = ["AdaptiveLR", "EarlyStopping", "GradGuard"]


def _skip_step(model: torch.nn.Module) -> None:
    """Drop every gradient so the optimizer leaves the weights as they are this step."""
    for p in model.parameters():
        p.grad = None


def _set_lr(state: FitState, lr: float) -> None:
    assert state.optimizer is not None
    for group in state.optimizer.param_groups:
        group["lr"] = lr


class AdaptiveLR(Callback):
    """Lower the learning rate when the gradients get noisy, raise it back when they calm down.

    The signal is ``var / mean**2`` of the global gradient norm, both EMAs with factor ``beta``
    over optimizer steps (a scale-free measure of how erratic the gradients are). Above
    ``threshold`` the rate is multiplied by ``factor`` (at most once per ``cooldown`` steps), and
    the rate that was unstable becomes a ceiling: later raises stop at ``backoff`` times it. After
    ``patience`` steps with the signal below ``threshold / 4``, the rate is multiplied by
    ``raise_factor``, up to the ceiling. A non-finite gradient skips the step and lowers the rate.
    ``changes`` logs every change: step, old and new rate, the signal and the reason.
    """

    def __init__(self, *, threshold: float = 0.3, beta: float = 0.9, factor: float = 0.5,
                 raise_factor: float = 1.2, patience: int = 50, cooldown: int = 3, warmup: int = 3,
                 backoff: float = 0.7, min_lr: float = 1e-7, max_lr: float | None = None) -> None:
        problems = ProblemCollector()
        if threshold <= 0:
            problems.add(f"threshold must be > 0, but got {threshold=}.")
        if not 0 < beta < 1:
            problems.add(f"beta must be in (0, 1), but got {beta=}.")
        if not 0 < factor < 1:
            problems.add(f"factor must be in (0, 1), but got {factor=}.")
        if raise_factor < 1:
            problems.add(f"raise_factor must be >= 1, but got {raise_factor=}.")
        if not 0 < backoff <= 1:
            problems.add(f"backoff must be in (0, 1], but got {backoff=}.")
        for name, value in (("patience", patience), ("cooldown", cooldown), ("warmup", warmup)):
            if value < 0:
                problems.add(f"{name} must be >= 0, but got {name}={value}.")
        if min_lr <= 0:
            problems.add(f"min_lr must be > 0, but got {min_lr=}.")
        problems.raise_if_any()
        self.threshold, self.beta, self.factor = threshold, beta, factor
        self.raise_factor, self.patience, self.cooldown = raise_factor, patience, cooldown
        self.warmup, self.backoff, self.min_lr, self.max_lr = warmup, backoff, min_lr, max_lr
        self.changes: list[dict[str, Any]] = []
        self.signal_curve: list[tuple[int, float]] = []
        self._reset()

    def _reset(self) -> None:
        self._mean: float | None = None
        self._var = 0.0
        self._n = 0
        self._since_change = 10**9
        self._stable = 0
        self._ceiling: float | None = None

    @property
    def signal(self) -> float:
        """The current ``var / mean**2`` of the gradient norm (0 before any step)."""
        if not self._mean:
            return 0.0
        return self._var / (self._mean**2)

    def on_fit_start(self, state: FitState) -> None:
        self._reset()
        self.changes.clear()
        self.signal_curve.clear()
        lr = state.lr
        if self.max_lr is None and lr is not None:
            self.max_lr = lr
        self._ceiling = self.max_lr

    def _change(self, state: FitState, new_lr: float, reason: str) -> None:
        old = float(state.lr or 0.0)
        new_lr = max(new_lr, self.min_lr)
        if new_lr == old:
            return
        _set_lr(state, new_lr)
        self.changes.append({"step": state.step + 1, "old_lr": old, "new_lr": new_lr,
                             "signal": self.signal, "reason": reason})
        self._since_change = 0
        self._stable = 0
        # measure the new rate afresh: the EMAs still hold the old rate's gradients
        self._mean, self._var, self._n = None, 0.0, 0

    def on_after_backward(self, state: FitState) -> None:
        if state.optimizer is None:
            return
        g = global_grad_norm(state.model)
        lr = float(state.lr or 0.0)
        self._since_change += 1
        if not math.isfinite(g):
            _skip_step(state.model)
            self._ceiling = min(self._ceiling or lr, lr * self.backoff)
            self._change(state, lr * self.factor,
                         f"gradient norm is {g} (step skipped); lowering the learning rate")
            return
        if self._mean is None:
            self._mean = g
        else:
            dev = g - self._mean
            self._mean = self.beta * self._mean + (1 - self.beta) * g
            self._var = self.beta * self._var + (1 - self.beta) * dev * dev
        self._n += 1
        sig = self.signal
        self.signal_curve.append((state.step + 1, sig))
        if self._n <= self.warmup:
            return
        if sig > self.threshold:
            self._stable = 0
            if self._since_change >= self.cooldown and lr * self.factor >= self.min_lr:
                self._ceiling = min(self._ceiling or lr, lr * self.backoff)
                self._change(state, lr * self.factor,
                             f"gradient-norm variance/mean^2 {sig:.3g} > threshold {self.threshold:g}")
            return
        if sig < self.threshold / 4:
            self._stable += 1
            ceiling = self._ceiling if self._ceiling is not None else lr
            if self._stable >= self.patience and lr < ceiling:
                self._change(state, min(lr * self.raise_factor, ceiling),
                             f"stable for {self._stable} steps (variance/mean^2 {sig:.3g} < {self.threshold / 4:g})")
        else:
            self._stable = 0

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self._mean, "var": self._var, "n": self._n, "ceiling": self._ceiling,
                "stable": self._stable, "since_change": self._since_change, "changes": list(self.changes)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._mean, self._var, self._n = state_dict["mean"], state_dict["var"], state_dict["n"]
        self._ceiling, self._stable = state_dict["ceiling"], state_dict["stable"]
        self._since_change = state_dict["since_change"]
        self.changes = list(state_dict.get("changes", []))


class GradGuard(Callback):
    """Clip a step's gradients when their norm spikes; skip a step whose gradients are not finite.

    A spike is a global gradient norm above ``spike_factor`` times the median of the last
    ``window`` steps (after ``warmup`` steps); its gradients are scaled down to ``clip_to`` times
    that median. ``events`` logs each intervention.
    """

    def __init__(self, *, spike_factor: float = 5.0, window: int = 50, warmup: int = 5,
                 clip_to: float = 1.0, skip_nonfinite: bool = True) -> None:
        problems = ProblemCollector()
        if spike_factor <= 1:
            problems.add(f"spike_factor must be > 1, but got {spike_factor=}.")
        if window < 3:
            problems.add(f"window must be at least 3, but got {window=}.")
        if warmup < 1 or warmup > window:
            problems.add(f"warmup must be in [1, window={window}], but got {warmup=}.")
        if clip_to <= 0:
            problems.add(f"clip_to must be > 0, but got {clip_to=}.")
        problems.raise_if_any()
        self.spike_factor, self.window, self.warmup = spike_factor, window, warmup
        self.clip_to, self.skip_nonfinite = clip_to, skip_nonfinite
        self.events: list[dict[str, Any]] = []
        self._norms: deque[float] = deque(maxlen=window)

    def on_fit_start(self, state: FitState) -> None:
        self._norms.clear()
        self.events.clear()

    def on_after_backward(self, state: FitState) -> None:
        g = global_grad_norm(state.model)
        step = state.step + 1
        if not math.isfinite(g):
            if self.skip_nonfinite:
                _skip_step(state.model)
                self.events.append({"step": step, "action": "skip", "grad_norm": g,
                                    "reason": "non-finite gradients"})
                state.record_anomaly("grad_nonfinite", grad_norm=g, action="skipped")
            return
        if len(self._norms) >= self.warmup:
            median = statistics.median(self._norms)
            if median > 0 and g > self.spike_factor * median:
                target = self.clip_to * median
                torch.nn.utils.clip_grad_norm_(
                    [p for p in state.model.parameters() if p.grad is not None], target)
                self.events.append({"step": step, "action": "clip", "grad_norm": g, "median": median,
                                    "clipped_to": target, "ratio": g / median})
                state.record_anomaly("grad_spike", grad_norm=g, median=median, clipped_to=target)
        self._norms.append(g)

    def state_dict(self) -> dict[str, Any]:
        return {"norms": list(self._norms), "events": list(self.events)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._norms = deque(state_dict.get("norms", []), maxlen=self.window)
        self.events = list(state_dict.get("events", []))


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by ``min_delta`` for ``patience`` evaluations.

    ``monitor`` is a metric of the task's evaluation (checked after each epoch), or ``"loss"``,
    the training loss, checked every ``every`` steps (what works inside a Monitor, which has no
    epochs). ``mode``: ``"min"``, ``"max"`` or ``"auto"`` (the metric registry's direction, or the
    task's ``metric_directions``; never guessed from the name). With ``restore_best`` the weights
    of the best evaluation are put back at the end.
    """

    def __init__(self, monitor: str = "val_loss", *, mode: str = "auto", patience: int = 3,
                 min_delta: float = 0.0, restore_best: bool = True, every: int = 50) -> None:
        problems = ProblemCollector()
        if mode not in ("min", "max", "auto"):
            problems.add(f"mode={mode!r} is unknown; valid: min, max, auto.")
        if patience < 0:
            problems.add(f"patience must be >= 0, but got {patience=}.")
        if min_delta < 0:
            problems.add(f"min_delta must be >= 0, but got {min_delta=}.")
        if every < 1:
            problems.add(f"every must be >= 1, but got {every=}.")
        problems.raise_if_any()
        if mode == "auto" and is_known(monitor):
            mode = direction(monitor)
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.min_delta, self.restore_best, self.every = min_delta, restore_best, every
        self._init()

    def _init(self) -> None:
        self.best: float | None = None
        self.best_at: int | None = None
        self.wait = 0
        self.stopped_at: int | None = None
        self.restored = False
        self._best_weights: dict[str, torch.Tensor] | None = None
        self._seen = 0

    def on_fit_start(self, state: FitState) -> None:
        self._init()
        if self.mode == "auto":  # a metric of the task's own: it may declare its direction
            self.mode = resolve_direction(self.monitor, task=state.task)

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def _observe(self, state: FitState, value: float, at: int) -> None:
        self._seen += 1
        if math.isfinite(value) and self._improved(value):
            self.best, self.best_at, self.wait = value, at, 0
            if self.restore_best:
                self._best_weights = {k: v.detach().to("cpu", copy=True)
                                      for k, v in state.model.state_dict().items()}
            return
        self.wait += 1
        if self.wait > self.patience:
            self.stopped_at = at
            state.request_stop(f"early stopping: {self.monitor} did not improve by {self.min_delta:g} "
                               f"for {self.wait} evaluations (best {self.best:.4g} at {self.best_at})")

    def on_epoch_end(self, state: FitState) -> None:
        if self.monitor == "loss":
            return
        if self.monitor not in state.metrics:
            raise ConfigError(f"EarlyStopping monitor={self.monitor!r} is not a metric of this task; "
                              f"valid: {', '.join(sorted(state.metrics)) or '(none)'}, loss.")
        self._observe(state, float(state.metrics[self.monitor]), state.epoch)

    def on_step_end(self, state: FitState) -> None:
        if self.monitor == "loss" and state.step % self.every == 0 and state.loss is not None:
            self._observe(state, float(state.loss), state.step)

    def on_fit_end(self, state: FitState) -> None:
        if self.restore_best and self._best_weights is not None and self.wait > 0:
            state.model.load_state_dict(copy.deepcopy(self._best_weights))
            self.restored = True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_at": self.best_at, "wait": self.wait, "stopped_at": self.stopped_at}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.best_at = state_dict["best"], state_dict["best_at"]
        self.wait, self.stopped_at = state_dict["wait"], state_dict["stopped_at"]
