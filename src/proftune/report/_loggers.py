"""Callbacks that log a run live, inside ``fit`` or a user's own loop under ``Monitor``."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from .._jsonsafe import is_finite_number
from ..exceptions import ConfigError
from ..train import Callback, FitState

__all__ = ["MLflowLogger", "TensorBoardLogger", "WandbLogger"]


def _every(every: int) -> int:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"every must be a positive integer (log every N-th step), but got {every=}.")
    return every


def _grad_norm(model: torch.nn.Module) -> float | None:
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


class _StepLog(Callback):
    """What both loggers record: loss, lr and the gradient norm every ``every`` steps; the
    epoch's metrics; the params and the final metrics at the end."""

    def __init__(self, every: int) -> None:
        self.every = _every(every)
        self._grad: float | None = None

    def on_after_backward(self, state: FitState) -> None:
        if (state.step + 1) % self.every == 0:
            self._grad = _grad_norm(state.model)

    def step_values(self, state: FitState) -> dict[str, float]:
        values = {"loss": state.loss, "lr": state.lr, "grad_norm": self._grad}
        self._grad = None
        return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}

    @staticmethod
    def epoch_values(state: FitState) -> dict[str, float]:
        last = state.curves.get("epoch", [])[-1:] if state.curves else []
        values = {**(last[0] if last else {}), **state.metrics}
        return {k: float(v) for k, v in values.items() if k != "epoch" and is_finite_number(v)}


class TensorBoardLogger(_StepLog):
    """Scalars ``step/loss|lr|grad_norm`` every ``every`` steps, ``epoch/<metric>`` per epoch,
    and the params as hparams with the final metrics, in a TensorBoard log folder.

    ``proftune.fit(task, callbacks=[TensorBoardLogger("runs/a")])`` or
    ``Monitor(model, opt, callbacks=[TensorBoardLogger("runs/a")])``.
    """

    def __init__(self, logdir: str | Path, *, every: int = 1) -> None:
        super().__init__(every)
        self.logdir = Path(logdir)
        self.writer: Any = None

    def on_fit_start(self, state: FitState) -> None:
        from ._tensorboard import summary_writer

        self.writer = summary_writer(self.logdir)

    def on_step_end(self, state: FitState) -> None:
        if self.writer is not None and state.step % self.every == 0:
            for k, v in self.step_values(state).items():
                self.writer.add_scalar(f"step/{k}", v, state.step)

    def on_epoch_end(self, state: FitState) -> None:
        if self.writer is not None:
            for k, v in self.epoch_values(state).items():
                self.writer.add_scalar(f"epoch/{k}", v, state.epoch)
            self.writer.flush()

    def on_fit_end(self, state: FitState) -> None:
        if self.writer is None:
            return
        from ._tensorboard import hparams_of

        hp = hparams_of({"params": state.params})
        final = {f"final/{k}": float(v) for k, v in state.metrics.items() if is_finite_number(v)}
        if hp and final:
            self.writer.add_hparams(hp, final, run_name=".")
        self.writer.close()
        self.writer = None

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MLflowLogger(_StepLog):
    """An MLflow run per fit: params at the start, ``step/*`` and ``epoch/*`` metrics as they
    come (sent in batches at each epoch's end), the final metrics, FINISHED or FAILED.

    ``tracking_uri``: ``sqlite:///mlflow.db``, ``file:///...``, ``http://host:port``.
    """

    def __init__(self, tracking_uri: str, *, experiment: str = "proftune", run_name: str | None = None,
                 every: int = 1, tags: dict[str, str] | None = None) -> None:
        super().__init__(every)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.client: Any = None
        self.run_id: str | None = None
        self._pending: list[Any] = []

    def on_fit_start(self, state: FitState) -> None:
        from mlflow.entities import Param

        from ._mlflow import experiment_id, key, log_in_batches, mlflow_client

        self.client = mlflow_client(self.tracking_uri)
        exp = experiment_id(self.client, self.experiment, self.tracking_uri)
        task = getattr(state.task, "name", None) or (type(state.task).__name__ if state.task else "model")
        tags = {"proftune.task": str(task), "env.device": str(state.device), "env.torch": torch.__version__,
                **self.tags}
        run = self.client.create_run(exp, tags=tags, run_name=self.run_name or f"{task} fit")
        self.run_id = str(run.info.run_id)
        params = [Param(key(k), str(v)[:6000]) for k, v in state.params.items()]
        log_in_batches(self.client, self.run_id, params=params)

    def _metric(self, name: str, value: float, step: int) -> None:
        from mlflow.entities import Metric

        from ._mlflow import key

        self._pending.append(Metric(key(name), value, int(time.time() * 1000), step))

    def _flush(self) -> None:
        from ._mlflow import log_in_batches

        if self.client is not None and self.run_id is not None and self._pending:
            log_in_batches(self.client, self.run_id, metrics=self._pending)
            self._pending = []

    def on_step_end(self, state: FitState) -> None:
        if self.run_id is not None and state.step % self.every == 0:
            for k, v in self.step_values(state).items():
                self._metric(f"step/{k}", v, state.step)
            if len(self._pending) >= 900:
                self._flush()

    def on_epoch_end(self, state: FitState) -> None:
        if self.run_id is not None:
            for k, v in self.epoch_values(state).items():
                self._metric(f"epoch/{k}", v, state.epoch)
            self._flush()

    def on_fit_end(self, state: FitState) -> None:
        if self.run_id is None:
            return
        for k, v in state.metrics.items():
            if is_finite_number(v):
                self._metric(k, float(v), state.step)
        self._flush()
        self.client.set_terminated(self.run_id, status="FINISHED")

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        if self.run_id is not None:
            self._flush()
            self.client.set_terminated(self.run_id, status="FAILED")


class WandbLogger(_StepLog):
    """A W&B run per fit: the params as config, ``step/*`` every ``every`` steps, ``epoch/*``
    against ``epoch``, the final metrics as the summary; exit code 0, or 1 when the fit raised.

    ``mode="offline"`` (or ``WANDB_MODE=offline``) writes ``<dir>/wandb/offline-run-*`` with no
    account and no network; ``group`` puts the runs of one study together.
    """

    def __init__(self, project: str = "proftune", *, dir: str | Path | None = None, mode: str | None = None,
                 group: str | None = None, name: str | None = None, every: int = 1) -> None:
        from ._wandb import wandb_mode

        super().__init__(every)
        self.project, self.dir, self.mode = project, dir, wandb_mode(mode)
        self.group, self.name = group, name
        self.run: Any = None
        self._ctx: Any = None

    def on_fit_start(self, state: FitState) -> None:
        from ._wandb import wandb_run

        task = getattr(state.task, "name", None) or (type(state.task).__name__ if state.task else "model")
        config = {str(k): v if isinstance(v, (bool, int, float, str)) or v is None else str(v)
                  for k, v in state.params.items()}
        self._ctx = wandb_run(project=self.project, dir=self.dir, mode=self.mode, name=self.name or f"{task} fit",
                              group=self.group, job_type="fit", config={**config, "env.device": str(state.device)})
        self.run = self._ctx.__enter__()
        self.run.define_metric("epoch")
        self.run.define_metric("epoch/*", step_metric="epoch")

    def on_step_end(self, state: FitState) -> None:
        if self.run is not None and state.step % self.every == 0:
            values = {f"step/{k}": v for k, v in self.step_values(state).items()}
            if values:
                self.run.log(values, step=state.step)

    def on_epoch_end(self, state: FitState) -> None:
        if self.run is not None:
            values = {f"epoch/{k}": v for k, v in self.epoch_values(state).items()}
            self.run.log({"epoch": state.epoch, **values})

    def on_fit_end(self, state: FitState) -> None:
        if self.run is None:
            return
        self.run.summary.update({k: float(v) for k, v in state.metrics.items() if is_finite_number(v)})
        ctx, self._ctx, self.run = self._ctx, None, None
        ctx.__exit__(None, None, None)

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        if self.run is not None:
            ctx, self._ctx, self.run = self._ctx, None, None
            ctx.__exit__(type(exc), exc, exc.__traceback__)
