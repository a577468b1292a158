"""Public entry points that run a task and record the run in the Store."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ._deprecated import renamed
from ._device import resolve_device
from ._jsonsafe import json_safe
from ._records import plain, record_fields, stored_version
from ._threads import ThreadChoice
from ._train_params import TrainParams, as_train_params
from .task import Task, load_task
from .track import Store, short_fingerprint, tracked_run
from .train import Callback, FitResult, fit

#: Bumped when a field of :class:`TrainResult`'s JSON changes meaning.
TRAIN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TrainResult:
    """A recorded training run: what the fit did (epochs, steps, samples, samples/s, why it
    stopped, its final metrics), the task, the params and the Run's id.

    A frozen, versioned record: :func:`run_train` builds it once the fit is done, the ``train``
    Run holds :meth:`to_dict`, and the report reads it back through :meth:`from_dict`. ``result``
    is what :func:`proftune.train.fit` returned (the trained model, its optimizer, the curves):
    in memory only, None for a record read back.
    """

    epochs: int
    steps: int
    samples: int
    #: Training samples per second over the whole fit (evaluation included).
    throughput: float
    stop_reason: str | None
    run_id: int | None = None
    task: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    duration_s: float | None = None
    device: str = ""
    #: The first 8 hex digits of the training data's fingerprint (the Run holds the whole MD5).
    data_fingerprint: str | None = None
    anomalies: list[dict[str, object]] = field(default_factory=list)
    #: The CPU thread count it trained at and its evidence (None in a record from before it was kept).
    threads: ThreadChoice | None = None
    schema_version: int = TRAIN_SCHEMA_VERSION
    result: FitResult | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_fit(cls, fit_result: FitResult, *, run_id: int | None, task: str,
               data_fingerprint: str | None) -> TrainResult:
        """The record of ``fit_result`` (kept in memory as ``result``)."""
        r = fit_result
        return cls(epochs=r.epochs, steps=r.steps, samples=r.samples, throughput=r.throughput,
                   stop_reason=r.stop_reason, run_id=run_id, task=task, params=dict(r.params),
                   metrics=dict(r.metrics), duration_s=r.duration_s, device=r.device,
                   data_fingerprint=short_fingerprint(data_fingerprint), anomalies=list(r.anomalies),
                   threads=r.threads, result=r)

    def to_dict(self) -> dict[str, Any]:
        return dict(json_safe({f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                               if f.name != "result"}))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainResult:
        """The record back from :meth:`to_dict`'s JSON (a ``train`` Run's result); a Run recorded
        before the record had a version holds epochs, steps, samples, throughput and stop_reason."""
        stored_version(d, what="a training run's result", current=TRAIN_SCHEMA_VERSION)
        kw = record_fields(cls, d, what="a training run's result", exclude=("result",))
        if kw.get("threads") is not None:
            kw["threads"] = ThreadChoice.from_dict(kw["threads"])
        return cls(**kw)


def run_train(
    task: Task | str,
    params: TrainParams | Mapping[str, Any] | None = None,
    *,
    epochs: int | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device = "auto",
    seed: int = 0,
    threads: int | None = None,
    callbacks: Sequence[Callback] = (),
    store: Store | str | None = None,
    db: str | None = None,
) -> TrainResult:
    """Train ``task`` with the fit loop and record the run (kind ``train``) in the Store.

    ``params``: a :class:`~proftune.train.TrainParams` is taken as it is (validated where it was
    made); a dict is merged over the task's ``default_params`` and validated here, once.

    ``threads``: torch's CPU threads (None: computed from the measured steps, see ``FitConfig``).

    ``store``: a Store, a database URL or None for the default store (``db``: the older name of
    a URL); see :func:`proftune.track.open_store`.
    """
    task_obj = load_task(task)
    given = as_train_params(task_obj, params, batch_size=batch_size)
    dev = resolve_device(device)
    config = {"params": given.params, "epochs": epochs, "max_steps": max_steps, "seed": seed, "device": str(dev),
              **({"threads": threads} if threads is not None else {})}
    with tracked_run("train", task_obj, config=config, device=dev, store=store, db=db) as run:
        result = fit(task_obj, given, epochs=epochs, max_steps=max_steps, device=dev, seed=seed,
                     threads=threads, callbacks=callbacks)
        record = TrainResult.of_fit(result, run_id=run.id, task=task_obj.name or type(task_obj).__name__,
                                    data_fingerprint=run.store.get_run(run.id).data_fingerprint)
        run.set(metrics=result.metrics, curves=result.curves, anomalies=result.anomalies, result=record.to_dict())
    return record


#: ``TrainReport``: the former name of :class:`TrainResult`, deprecated.
__getattr__ = renamed(__name__, {"TrainReport": "TrainResult"})
