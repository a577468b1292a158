"""What the fit loop's callbacks see and what :func:`proftune.train.fit` returns: the hooks
(:class:`Callback`), the loop's state at each hook (:class:`FitState`) and the result
(:class:`FitResult`). Importable from :mod:`proftune.train`, where the loop is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._threads import ThreadChoice
from .task import Task

__all__ = ["Callback", "FitResult", "FitState"]


class Callback:
    """Hooks into :func:`fit` (and :class:`proftune.Monitor`); every hook is a no-op by default."""

    def on_fit_start(self, state: FitState) -> None:
        """Once, after the model and optimizer are built, before the first batch."""

    def on_epoch_start(self, state: FitState) -> None:
        """At the start of each epoch."""

    def on_step_start(self, state: FitState) -> None:
        """Before the forward pass of an optimizer step; the batch is loaded (``state.batch``)."""

    def on_after_backward(self, state: FitState) -> None:
        """After the last backward of a step: gradients are complete and unscaled, not clipped."""

    def on_step_end(self, state: FitState) -> None:
        """After the optimizer step; ``state.loss`` and ``state.timing`` hold the step's figures."""

    def on_epoch_end(self, state: FitState) -> None:
        """After the epoch's evaluation; ``state.metrics`` holds its metrics."""

    def on_fit_end(self, state: FitState) -> None:
        """Once, at the end (also after a stop request)."""

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        """When the loop is about to raise ``exc``."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


@dataclass
class FitState:
    """What the loop knows at a hook; callbacks read it and may request a stop."""

    task: Task | None
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    params: dict[str, Any]
    device: torch.device
    batch_size: int = 0
    epoch: int = 0
    #: Optimizer steps done so far (the step being run, inside step hooks, is ``step``).
    step: int = 0
    batch: Any = None
    #: Mean loss of the last step (over its micro-batches), as a float.
    loss: float | None = None
    #: The last step's loss tensor (the last micro-batch's, unscaled, attached to the graph).
    loss_tensor: torch.Tensor | None = None
    #: Milliseconds of the last step: data_ms, forward_ms, backward_ms, optimizer_ms, step_ms.
    timing: dict[str, float] = field(default_factory=dict)
    #: Metrics of the last evaluation.
    metrics: dict[str, float] = field(default_factory=dict)
    #: ``{"step": [...], "epoch": [...]}``: one row of figures per step and per epoch.
    curves: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {"step": [], "epoch": []})
    anomalies: list[dict[str, object]] = field(default_factory=list)
    samples_seen: int = 0
    should_stop: bool = False
    stop_reason: str | None = None
    #: When True the loop synchronises the device around each phase so that timings are exact.
    sync_timing: bool = False
    scaler: Any = None
    #: The task's learning-rate schedule (``Task.configure_scheduler``).
    scheduler: Any = None
    #: When the loop steps ``scheduler``: ``"step"`` (after every optimizer step) or ``"epoch"``.
    scheduler_interval: str = "step"

    def request_stop(self, reason: str) -> None:
        """Ask the loop to stop after the current step."""
        self.should_stop = True
        if self.stop_reason is None:
            self.stop_reason = reason

    def record_anomaly(self, kind: str, **detail: object) -> None:
        """Note an anomaly (``nan_loss``, ``grad_spike``, ...) at the current step."""
        self.anomalies.append({"kind": kind, "step": self.step, "epoch": self.epoch, **detail})

    @property
    def lr(self) -> float | None:
        if self.optimizer is None or not self.optimizer.param_groups:
            return None
        return float(self.optimizer.param_groups[0]["lr"])


@dataclass
class FitResult:
    """What :func:`fit` returns: final metrics, curves, the trained model and how it ended."""

    metrics: dict[str, float]
    curves: dict[str, list[dict[str, float]]]
    params: dict[str, Any]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    steps: int
    epochs: int
    samples: int
    duration_s: float
    anomalies: list[dict[str, object]]
    stop_reason: str | None
    device: str
    #: The CPU thread count it trained at and its evidence (the measured step times, the re-checks).
    threads: ThreadChoice | None = None

    @property
    def throughput(self) -> float:
        """Training samples per second over the whole fit (evaluation included)."""
        return self.samples / self.duration_s if self.duration_s > 0 else 0.0
