"""Controllers that adapt training while it runs, as fit-loop callbacks (and Monitor callbacks).

- :class:`AdaptiveLR` lowers the learning rate when the gradient noise (an EMA of the variance
  of the global gradient norm, relative to its EMA mean) crosses a threshold, and raises it back
  when training has been stable for a while; every change is logged with its reason.
- :class:`GradGuard` clips the gradients of a step whose norm spikes against the running median,
  and skips a step whose gradients are not finite.
- :class:`EarlyStopping` (at home in :mod:`proftune.train`, the fit loop's own callback, as
  recommend uses it too) stops when a metric has not improved by ``min_delta`` for ``patience``
  evaluations, and restores the best weights.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any, TypedDict

import torch

from .._tensors import global_grad_norm
from ..exceptions import ProblemCollector
from ..train import Callback, FitState

__all__ = ["AdaptiveLR", "GradEvent", "GradGuard", "LRChange"]


class LRChange(TypedDict):
    """One change :class:`AdaptiveLR` made: the step it applies from, the lr before and after, the
    loss signal (variance/mean^2) then and why."""

    step: int
    old_lr: float
    new_lr: float
    signal: float
    reason: str


class _GradAction(TypedDict):
    step: int
    action: str
    grad_norm: float


class GradEvent(_GradAction, total=False):
    """One intervention of :class:`GradGuard`: ``action`` "skip" (non-finite gradients: ``reason``)
    or "clip" (a spike: the recent ``median`` norm, the norm ``clipped_to``, and ``ratio`` to it)."""

    reason: str
    median: float
    clipped_to: float
    ratio: float


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
        self.changes: list[LRChange] = []
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

    def state_dict(self) -> dict[str, object]:
        return {"mean": self._mean, "var": self._var, "n": self._n, "ceiling": self._ceiling,
                "stable": self._stable, "since_change": self._since_change, "changes": list(self.changes)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
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
        self.events: list[GradEvent] = []
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

    def state_dict(self) -> dict[str, object]:
        return {"norms": list(self._norms), "events": list(self.events)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._norms = deque(state_dict.get("norms", []), maxlen=self.window)
        self.events = list(state_dict.get("events", []))
