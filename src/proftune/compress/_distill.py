"""Knowledge distillation as a Task wrapper, trained by the one fit loop.

Hinton et al. (2015): the student's loss mixes the task loss with the KL divergence between the
teacher's and the student's temperature-softened class distributions, scaled by T² so that its
gradients keep their size as T changes:
``loss = alpha * T² * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * task_loss``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..exceptions import ConfigError
from ..task import Task, TaskWrapper

__all__ = ["DistillationTask", "hinton_loss"]


def hinton_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T² · KL(softmax(teacher/T) ‖ softmax(student/T))``, mean over the batch."""
    t = float(temperature)
    log_p = F.log_softmax(student_logits.float() / t, dim=-1)
    log_q = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return F.kl_div(log_p, log_q, log_target=True, reduction="batchmean") * (t * t)


class DistillationTask(TaskWrapper):
    """``task`` with a teacher: the loss adds Hinton's distillation term; data and metrics unchanged.

    The student's inputs and logits are caught with a forward hook while the task's own loss
    runs, so any task whose loss calls ``model(...)`` once works unchanged; the teacher runs on
    the same inputs without gradients.
    """

    def __init__(self, task: Task, teacher: nn.Module, *, temperature: float = 4.0, alpha: float = 0.5) -> None:
        problems = []
        if not temperature > 0:
            problems.append(f"temperature must be > 0, but got {temperature=}.")
        if not 0.0 <= alpha <= 1.0:
            problems.append(f"alpha must be in [0, 1], but got {alpha=}.")
        if problems:
            raise ConfigError(problems)
        super().__init__(task)
        self.task = task
        self.teacher = teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.name = f"{task.name or type(task).__name__}+distill"  # type: ignore[misc]
        self.default_params = dict(task.default_params)  # type: ignore[misc]
        self.default_epochs = task.default_epochs  # type: ignore[misc]

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return self.task.build_model(params)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return self.task.train_data(batch_size, params)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return self.task.val_data(batch_size)

    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        return self.task.evaluate(model, data)

    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        return self.task.configure_optimizer(model, params)

    def example_batch(self, batch_size: int) -> Any:
        return self.task.example_batch(batch_size)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        seen: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []

        def catch(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if not seen:
                seen.append((args, kwargs, out))

        handle = model.register_forward_hook(catch, with_kwargs=True)
        try:
            task_loss = self.task.loss(model, batch)
        finally:
            handle.remove()
        if not seen or not isinstance(seen[0][2], torch.Tensor):
            raise ConfigError(
                f"distillation needs the task's loss to call model(...) and get logits back; "
                f"{type(self.task).__name__}.loss did not (or the model returns no tensor)."
            )
        args, kwargs, student_logits = seen[0]
        teacher = self.teacher.to(student_logits.device)
        with torch.no_grad():
            teacher_logits = teacher(*args, **kwargs)
        kd = hinton_loss(student_logits, teacher_logits, self.temperature)
        return self.alpha * kd + (1.0 - self.alpha) * task_loss
