"""A study's trial inside a Ray worker: the trainable that runs proftune's trial runner (profile
gate, the one fit loop, fault classification), reporting each epoch's objective to Ray and,
under PBT, checkpointing the model and optimizer state and restoring a better member's."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import torch

from .._jsonsafe import finite_float, json_dumps
from ..task import Task, load_task
from ..train import Callback, FitState, evaluate_model
from ._pbt import (
    MEMBER,
    PERTURBABLE,
)
from ._records import ATTR, TrialFigures
from ._settings import SearchSettings
from ._trial import TrialFailed as _TrialFailed
from ._trial import TrialRunner

METRIC_KEY = "objective"


#: The objective at a trial's last epoch: recorded, not seen by the schedulers.
LAST_EPOCH_KEY = "objective_last_epoch"


_CKPT = "proftune_ckpt.pt"


# -- inside the Ray worker ----------------------------------------------------------------------
class _RayReport(Callback):
    """Each epoch: report the objective metric to Ray (ASHA, PBT), with a checkpoint for PBT."""

    def __init__(self, metric: str | None, *, checkpoint: bool, sign: float,
                 last_epoch: int | None = None) -> None:
        self.metric, self.checkpoint, self.sign = metric, checkpoint, sign
        self.last_epoch = last_epoch

    def on_epoch_end(self, state: FitState) -> None:
        from ray import tune

        value = state.metrics.get(self.metric) if self.metric else None
        report: dict[str, object] = {"epoch": state.epoch, "proftune_done": False}
        last = self.last_epoch is not None and state.epoch >= self.last_epoch
        if (finite := finite_float(value)) is not None:
            # the last epoch's value under another name: the schedulers act on ``objective``,
            # and a trial that trained every epoch is complete (ASHA would cut it at its top
            # rung, PBT would pause it for a round with nothing left to train)
            report[LAST_EPOCH_KEY if last else METRIC_KEY] = finite
        for key in PERTURBABLE:
            if key in state.params:
                report[f"param_{key}"] = state.params[key]
        if not self.checkpoint or last:
            tune.report(report)
            return
        with tempfile.TemporaryDirectory() as tmp:
            opt = state.optimizer.state_dict() if state.optimizer is not None else None
            torch.save({"model": state.model.state_dict(), "optimizer": opt, "epoch": state.epoch,
                        "step": state.step}, Path(tmp) / _CKPT)
            tune.report(report, checkpoint=tune.Checkpoint.from_directory(tmp))


class _RestoreCheckpoint(Callback):
    """PBT: continue a member from its (or an exploited member's) checkpoint, at the new params."""

    def __init__(self, checkpoint: Any, epochs: int) -> None:
        self.checkpoint, self.epochs = checkpoint, epochs

    def on_fit_start(self, state: FitState) -> None:
        if self.checkpoint is None:
            return
        with self.checkpoint.as_directory() as folder:
            # a checkpoint this trainable wrote itself, in this experiment: tensors and ints only
            saved = torch.load(Path(folder) / _CKPT, map_location=state.device, weights_only=True)
        state.model.load_state_dict(saved["model"])
        if state.optimizer is not None and saved.get("optimizer") is not None:
            state.optimizer.load_state_dict(saved["optimizer"])
            for group in state.optimizer.param_groups:  # the perturbed params win
                for key in ("lr", "weight_decay", "momentum"):
                    if key in state.params and key in group:
                        group[key] = float(state.params[key])
        state.epoch, state.step = int(saved["epoch"]), int(saved["step"])
        if state.epoch >= self.epochs and state.task is not None:
            # exploited after its last epoch: nothing left to train; its metrics are those of
            # the weights it now holds
            state.metrics = evaluate_model(state.task, state.model, state.device, state.batch_size)


class _WorkerRunner(TrialRunner):
    """The local trial runner without the Store: the driver records the Run."""

    def __init__(self, settings: SearchSettings, task: Task) -> None:
        super().__init__(settings, task, store=None)  # type: ignore[arg-type]
        self.record: TrialFigures | None = None

    def _finish(self, trial: Any, rec: TrialFigures, state: str, started: float) -> None:
        rec.state = state
        rec.duration_s = time.perf_counter() - started
        self.record = rec


def ray_trainable(config: Mapping[str, object], settings: SearchSettings, pbt: bool) -> None:
    """One trial on a Ray worker: gate, train through ``fit``, report the record."""
    from ray import tune

    config = {k: v for k, v in config.items() if k != MEMBER}
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    from .._threads import limit_threads

    limit_threads(torch.get_num_threads())  # Ray's CPUs for this trial: the fit loop's most threads
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    task = load_task(settings.task)
    runner = _WorkerRunner(settings, task)
    sign = -1.0 if settings.objectives[0].direction == "maximize" else 1.0
    metric = settings.objectives[0].metric if runner.report_metric or pbt else None
    runner.extra_callbacks = [_RayReport(metric, checkpoint=pbt, sign=sign, last_epoch=settings.epochs)]
    if pbt:
        runner.extra_callbacks.insert(0, _RestoreCheckpoint(tune.get_checkpoint(), int(settings.epochs or 1)))
    trial = optuna.trial.FixedTrial(config)
    rec = TrialFigures(params=dict(config), seed=settings.seed)
    started = time.perf_counter()
    values: Any = None
    try:
        values = runner._run(trial, dict(config), rec)  # type: ignore[arg-type]
    except optuna.TrialPruned:
        runner._finish(trial, rec, "pruned", started)
    except _TrialFailed:
        runner._finish(trial, rec, "failed", started)
    record = runner.record if runner.record is not None else rec
    told = {"constraints_raw": dict(trial.constraints),
            "user_attrs_raw": {k: v for k, v in trial.user_attrs.items() if k != ATTR}}
    final: dict[str, object] = {"proftune_done": True, "proftune_record": json_dumps({**record.to_dict(), **told}),
                             "epoch": int(settings.epochs or 1)}
    if values is not None:  # for the searcher; the schedulers decide on the epochs' reports only
        vals = values if isinstance(values, (list, tuple)) else [values]
        final.update({f"{METRIC_KEY}_{i}": float(v) for i, v in enumerate(vals)})
    # no ``objective`` here: synchronous PBT would pause a member on this report, waiting for the
    # others, and restore it from its last checkpoint again and again
    tune.report(final)
