"""Public entry points that run a task and record the run in the Store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._deprecated import renamed
from ._device import resolve_device
from .task import Task, load_task
from .track import Store, short_fingerprint, tracked_run
from .train import Callback, FitResult, fit, validate_params


@dataclass
class TrainResult:
    """A recorded training run: its id in the Store, the task's name and what
    :func:`proftune.train.fit` returned."""

    run_id: int
    result: FitResult
    data_fingerprint: str | None
    task: str = ""

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {
            "run_id": self.run_id,
            "task": self.task,
            "metrics": r.metrics,
            "params": dict(r.params),
            "epochs": r.epochs,
            "steps": r.steps,
            "samples": r.samples,
            "duration_s": r.duration_s,
            "throughput": r.throughput,
            "device": r.device,
            "data_fingerprint": short_fingerprint(self.data_fingerprint),
            "stop_reason": r.stop_reason,
            "anomalies": r.anomalies,
        }


def run_train(
    task: Task | str,
    params: dict[str, Any] | None = None,
    *,
    epochs: int | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device = "auto",
    seed: int = 0,
    callbacks: Sequence[Callback] = (),
    store: Store | str | None = None,
    db: str | None = None,
) -> TrainResult:
    """Train ``task`` with the fit loop and record the run (kind ``train``) in the Store.

    ``store``: a Store, a database URL or None for the default store (``db``: the older name of
    a URL); see :func:`proftune.track.open_store`.
    """
    task_obj = load_task(task)
    merged = validate_params({**task_obj.default_params, **(params or {})})
    if batch_size is not None:
        merged["batch_size"] = batch_size
    dev = resolve_device(device)
    config = {"params": merged, "epochs": epochs, "max_steps": max_steps, "seed": seed, "device": str(dev)}
    with tracked_run("train", task_obj, config=config, device=dev, store=store, db=db) as run:
        result = fit(task_obj, merged, epochs=epochs, max_steps=max_steps, device=dev, seed=seed,
                     callbacks=callbacks)
        run.set(metrics=result.metrics, curves=result.curves, anomalies=result.anomalies,
                result={"steps": result.steps, "epochs": result.epochs, "samples": result.samples,
                        "throughput": result.throughput, "stop_reason": result.stop_reason})
        fingerprint = run.store.get_run(run.id).data_fingerprint
    return TrainResult(run_id=run.id, result=result, data_fingerprint=fingerprint,
                       task=task_obj.name or type(task_obj).__name__)


#: ``TrainReport``: the former name of :class:`TrainResult`, deprecated.
__getattr__ = renamed(__name__, {"TrainReport": "TrainResult"})
