"""One optimizer step, described once (:class:`StepSpec`) and run by one function
(:func:`run_step`): the fit loop runs it and times its phases, ``proftune.predict`` traces the
same function on fake tensors. Importable from :mod:`proftune.train`."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .task import Task

__all__ = ["StepPhases", "StepSpec", "TimedPhases", "run_step"]


@dataclass(frozen=True)
class StepSpec:
    """How one optimizer step runs, described once: ``grad_accumulation`` micro-batches, each
    forward under autocast at ``precision`` (fp16 with a GradScaler), the loss divided by the
    micro-batches, gradients unscaled, clipped to ``grad_clip`` (None: not clipped), one optimizer
    step. :func:`fit` runs it; ``proftune.predict`` traces the same :func:`run_step` on fake tensors."""

    precision: str = "fp32"
    grad_accumulation: int = 1
    grad_clip: float | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> StepSpec:
        """The step of validated params (:func:`validate_params`): precision, grad_accumulation, grad_clip."""
        clip = params.get("grad_clip")
        return cls(precision=str(params.get("precision", "fp32")),
                   grad_accumulation=int(params.get("grad_accumulation", 1) or 1),
                   grad_clip=float(clip) if clip else None)

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager[Any]:
        """The forward's autocast on ``device_type`` ("cpu", "cuda"); nothing at fp32."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(device_type=device_type, dtype=dtype)

    def grad_scaler(self, device_type: str) -> torch.amp.GradScaler | None:
        """A GradScaler at fp16 (its gradients underflow without one), else None."""
        return torch.amp.GradScaler(device_type) if self.precision == "fp16" else None


class StepPhases:
    """What the caller of :func:`run_step` does around its phases: the fit loop times them and
    runs its callbacks, the predictor tags every op with its phase. No-ops by default."""

    def forward(self) -> contextlib.AbstractContextManager[Any]:
        """Around each micro-batch's forward and loss."""
        return contextlib.nullcontext()

    def backward(self) -> contextlib.AbstractContextManager[Any]:
        """Around each micro-batch's backward."""
        return contextlib.nullcontext()

    def optimizer(self) -> contextlib.AbstractContextManager[Any]:
        """Around the optimizer's part: unscaling the gradients, then (a second time) clip and step."""
        return contextlib.nullcontext()

    def after_backward(self, loss: torch.Tensor) -> None:
        """The gradients are complete and unscaled, not clipped; ``loss`` is the last micro-batch's."""


class TimedPhases(StepPhases):
    """Phases that each run inside one context of the caller's, :meth:`_timed` (``phase``:
    "forward", "backward", "optimizer"): the fit loop's timer and predict's measured step."""

    def _timed(self, phase: str) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement _timed(phase).")

    def forward(self) -> contextlib.AbstractContextManager[Any]:
        return self._timed("forward")

    def backward(self) -> contextlib.AbstractContextManager[Any]:
        return self._timed("backward")

    def optimizer(self) -> contextlib.AbstractContextManager[Any]:
        return self._timed("optimizer")


def run_step(task: Task, model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: Sequence[Any],
             spec: StepSpec, *, device_type: str, scaler: torch.amp.GradScaler | None = None,
             phases: StepPhases | None = None) -> list[torch.Tensor]:
    """One optimizer step over ``micro_batches`` as ``spec`` describes it; the losses (detached,
    unscaled), one per micro-batch. Not for LBFGS (its closure re-runs the model)."""
    phases = phases or StepPhases()
    optimizer.zero_grad(set_to_none=True)
    losses: list[torch.Tensor] = []
    loss: torch.Tensor | None = None
    for batch in micro_batches:
        with phases.forward(), spec.autocast(device_type):
            loss = task.loss(model, batch)
        # one micro-batch: the loss itself (a division by 1 is one more autograd node a step)
        scaled = loss / len(micro_batches) if len(micro_batches) > 1 else loss
        with phases.backward():
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        losses.append(loss.detach())
    if loss is None:
        raise ValueError("run_step needs at least one micro-batch.")
    if scaler is not None:
        with phases.optimizer():
            scaler.unscale_(optimizer)
    phases.after_backward(loss)
    with phases.optimizer():
        if spec.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    return losses
