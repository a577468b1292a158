"""The one training loop of proftune, with Lightning-style callbacks.

Profiling, monitoring, trial pruning, LR range tests and fine-tuning after compression all run
through :func:`fit`. A :class:`Callback` sees a :class:`FitState` at each hook and may ask the
loop to stop with :meth:`FitState.request_stop`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ._device import DeviceIterable, batch_size_of, clock, move_to_device, resolve_device
from ._fit_state import Callback, FitResult, FitState
from ._optimizers import build_optimizer
from ._schedule import Schedule, run_epochs, schedule_from, warn_if_per_epoch
from ._step import StepPhases, StepSpec, TimedPhases, run_step
from ._thread_control import ThreadControl
from ._threads import ThreadChoice, fit_key, threads_from_env
from ._train_params import LOOP_PARAMS, TrainParams, as_train_params, validate_params
from ._with_options import with_options
from .exceptions import ConfigError, ProblemCollector
from .metrics import direction, is_known, resolve_direction
from .task import Task, load_task

__all__ = [
    "LOOP_PARAMS",
    "NONFINITE_STOP",
    "Callback",
    "EarlyStopping",
    "FitConfig",
    "FitResult",
    "FitState",
    "StepPhases",
    "StepSpec",
    "ThreadChoice",
    "TimedPhases",
    "TrainParams",
    "build_optimizer",
    "evaluate_model",
    "fit",
    "run_step",
    "seed_everything",
    "validate_params",
]

#: How the stop reason of a training ended by a non-finite loss begins (``stop_on_nan``).
NONFINITE_STOP = "loss became"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class _Timer:
    """Milliseconds between marks; synchronises the device first when asked."""

    def __init__(self, device: torch.device, sync: bool) -> None:
        self.device, self.sync = device, sync
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = clock(self.device if self.sync else None)
        ms = (now - self.last) * 1e3
        self.last = now
        return ms


@dataclass(frozen=True)
class FitConfig:
    """How long and where :func:`fit` trains: ``epochs`` or ``max_steps`` (optimizer steps; with
    neither, the task's ``default_epochs``), ``batch_size`` (overrides ``params['batch_size']``),
    device and seed, whether to evaluate after each epoch, and whether a NaN loss stops the run.

    ``threads``: torch's intra-op CPU threads while it trains. None computes it: a few of the
    training's own steps at each count (1, 2, 4, ... up to this process's share of the cores), the
    fastest kept and measured again when the step time drifts (``proftune._threads``); a number
    (or ``$PROFTUNE_THREADS``, the CLI's ``--threads``) is kept as given. Torch's count is put back
    when the fit returns."""

    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    device: str | torch.device = "auto"
    seed: int = 0
    evaluate: bool = True
    stop_on_nan: bool = True
    threads: int | None = None


def fit(
    task: Task | str,
    params: TrainParams | Mapping[str, Any] | None = None,
    config: FitConfig | None = None,
    *,
    callbacks: Sequence[Callback] = (),
    model: nn.Module | None = None,
    **options: Any,
) -> FitResult:
    """Train ``task`` with ``params``; seeded and deterministic on CPU.

    ``params``: a :class:`TrainParams` is taken as it is (merged and validated where it was made);
    a dict is merged over the task's ``default_params`` and validated here, once.

    ``config`` (a :class:`FitConfig`) or its fields by name (``epochs=3, seed=0``) say how long
    and where. ``model`` trains a given model (fine-tuning) instead of building one.
    """
    cfg = with_options(FitConfig, config, options, caller="fit")
    epochs, max_steps, batch_size, device, seed = cfg.epochs, cfg.max_steps, cfg.batch_size, cfg.device, cfg.seed
    evaluate, stop_on_nan = cfg.evaluate, cfg.stop_on_nan
    task = load_task(task)
    given = as_train_params(task, params, batch_size=batch_size)
    merged = given.params
    problems = ProblemCollector()
    if epochs is not None and (isinstance(epochs, bool) or int(epochs) < 1):
        problems.add(f"epochs must be at least 1, but got {epochs=}.")
    if max_steps is not None and (isinstance(max_steps, bool) or int(max_steps) < 1):
        problems.add(f"max_steps must be at least 1, but got {max_steps=}.")
    threads, given_by = cfg.threads, "threads="
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        problems.add(f"threads must be a whole number >= 1 (None: computed), but got {threads=}.")
    problems.raise_if_any()
    if threads is None and (env := threads_from_env()) is not None:
        threads, given_by = env, "$PROFTUNE_THREADS"
    if epochs is None and max_steps is None:
        epochs = task.default_epochs
    bs = int(merged.setdefault("batch_size", 32))
    spec = StepSpec.from_params(merged)
    dev = resolve_device(device)

    seed_everything(seed)
    if model is None:
        model = task.build_model(merged)
    model = model.to(dev)
    optimizer = task.configure_optimizer(model, merged)
    scaler = spec.grad_scaler(dev.type)

    schedule = schedule_from(task.configure_scheduler(optimizer, merged, epochs=epochs, max_steps=max_steps),
                             owner=type(task).__name__)
    state = FitState(task=task, model=model, optimizer=optimizer, params=merged, device=dev,
                     batch_size=bs, scaler=scaler, scheduler=schedule.scheduler if schedule else None,
                     scheduler_interval=schedule.interval if schedule else "step")
    threads_before = torch.get_num_threads()
    control = ThreadControl(threads, given_by, fit_key(task, dev.type))
    callbacks = [*callbacks, control]
    started = time.perf_counter()
    try:
        for cb in callbacks:
            cb.on_fit_start(state)
        epoch_limit = epochs if epochs is not None else math.inf
        while state.epoch < epoch_limit and not state.should_stop:
            _run_epoch(state, callbacks, spec=spec, max_steps=max_steps, evaluate=evaluate,
                       stop_on_nan=stop_on_nan, started=started)
            if schedule is not None:
                _after_epoch(state, schedule, epochs=epochs, max_steps=max_steps)
            if max_steps is not None and state.step >= max_steps:
                break
        for cb in callbacks:
            cb.on_fit_end(state)
    except BaseException as exc:
        for cb in callbacks:
            with contextlib.suppress(Exception):
                cb.on_exception(state, exc)
        raise
    finally:
        torch.set_num_threads(threads_before)  # process-global: a library leaves it as it found it
    return FitResult(
        metrics=dict(state.metrics), curves=state.curves, params=merged, model=model,
        optimizer=optimizer, steps=state.step, epochs=state.epoch, samples=state.samples_seen,
        duration_s=time.perf_counter() - started, anomalies=state.anomalies,
        stop_reason=state.stop_reason, device=str(dev), threads=control.choice(),
    )


def _after_epoch(state: FitState, schedule: Schedule, *, epochs: int | None, max_steps: int | None) -> None:
    """Step an epoch-interval schedule; after a whole first epoch (its step count known), warn
    once where a per-step schedule reads as counted in epochs."""
    if schedule.interval == "epoch" and not state.should_stop:
        schedule.step_after_epoch(state.metrics)
    whole = not state.should_stop and (max_steps is None or state.step < max_steps)
    if state.epoch == 1 and whole:
        assert state.task is not None
        why = warn_if_per_epoch(schedule, task=state.task.name or type(state.task).__name__,
                                epochs=run_epochs(epochs, max_steps, state.step), steps_per_epoch=state.step)
        if why is not None:
            state.record_anomaly("scheduler_interval", reason=why)


def _micro_batches(it: Iterator[Any], accum: int) -> Iterator[list[Any]]:
    group: list[Any] = []
    for batch in it:
        group.append(batch)
        if len(group) == accum:
            yield group
            group = []
    if group:
        yield group


class _TimedPhases(TimedPhases):
    """The fit loop's side of a step: each phase's milliseconds, and ``on_after_backward``."""

    def __init__(self, state: FitState, callbacks: Sequence[Callback], timer: _Timer) -> None:
        self.state, self.callbacks, self.timer = state, callbacks, timer
        self.ms = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        self.timer.lap()  # what ran between phases (hooks) is not the step's time
        yield
        self.ms[phase] += self.timer.lap()


    def after_backward(self, loss: torch.Tensor) -> None:
        self.state.loss_tensor = loss
        for cb in self.callbacks:
            cb.on_after_backward(self.state)


def _run_epoch(state: FitState, callbacks: Sequence[Callback], *, spec: StepSpec,
               max_steps: int | None, evaluate: bool, stop_on_nan: bool, started: float) -> None:
    """One epoch of the fit loop: every phase and hook in the order callbacks rely on.

    Kept in one piece so the order of hooks, accumulation and timing reads top to bottom; the
    step itself is :func:`run_step` (the one description of a step, shared with the predictor).
    """
    task, model, optimizer, dev = state.task, state.model, state.optimizer, state.device
    assert task is not None
    assert optimizer is not None
    model.train()
    for cb in callbacks:
        cb.on_epoch_start(state)
    epoch_losses: list[float] = []
    epoch_started = time.perf_counter()
    timer = _Timer(dev, state.sync_timing)
    groups = _micro_batches(iter(task.train_data(state.batch_size, state.params)), spec.grad_accumulation)
    steps_before = state.step
    while True:
        timer.sync = state.sync_timing
        timer.lap()
        group = next(groups, None)
        if group is None:
            if state.step == steps_before:  # with max_steps alone, an empty epoch looped forever
                raise ConfigError(
                    f"train_data(batch_size={state.batch_size}) yielded no batch in epoch {state.epoch + 1}: "
                    "a task's training data must give at least one batch an epoch (a smaller batch_size, "
                    "or keep a last partial batch).")
            break
        group = [move_to_device(b, dev) for b in group]
        data_ms = timer.lap()
        state.batch = group[0] if len(group) == 1 else group
        for cb in callbacks:
            cb.on_step_start(state)
        timer.lap()  # hooks are not the step's time
        losses: list[float] = []
        if state.params.get("optimizer") == "lbfgs":
            forward_ms, backward_ms, losses = _lbfgs_step(state, callbacks, group[0], spec, timer)
            optimizer_ms = timer.lap()
        else:
            phases = _TimedPhases(state, callbacks, timer)
            losses = [float(v) for v in run_step(task, model, optimizer, group, spec, device_type=dev.type,
                                                 scaler=state.scaler, phases=phases)]
            forward_ms, backward_ms, optimizer_ms = (phases.ms[p] for p in ("forward", "backward", "optimizer"))
        state.step += 1
        n = sum(batch_size_of(b) for b in group)
        state.samples_seen += n
        state.loss = sum(losses) / len(losses)
        state.timing = {
            "data_ms": data_ms, "forward_ms": forward_ms, "backward_ms": backward_ms,
            "optimizer_ms": optimizer_ms,
            "step_ms": data_ms + forward_ms + backward_ms + optimizer_ms,
        }
        state.curves["step"].append({"step": state.step, "epoch": state.epoch, "loss": state.loss,
                                     "lr": float(optimizer.param_groups[0]["lr"]), "samples": n})
        if state.scheduler is not None and state.scheduler_interval == "step":  # the next step's rate
            state.scheduler.step()
        if not math.isfinite(state.loss):
            state.record_anomaly("nan_loss", loss=state.loss)
            if stop_on_nan:
                state.request_stop(f"{NONFINITE_STOP} {state.loss} at step {state.step}")
        epoch_losses.append(state.loss)
        for cb in callbacks:
            cb.on_step_end(state)
        if state.should_stop or (max_steps is not None and state.step >= max_steps):
            break
    if evaluate:
        state.metrics = evaluate_model(task, model, dev, state.batch_size)
    model.train()
    state.epoch += 1
    finite = [v for v in epoch_losses if math.isfinite(v)]
    state.curves["epoch"].append({
        "epoch": state.epoch,
        "train_loss": (sum(finite) / len(finite)) if finite else float("nan"),
        **state.metrics,
        "epoch_s": time.perf_counter() - epoch_started,
        "elapsed_s": time.perf_counter() - started,
    })
    for cb in callbacks:
        cb.on_epoch_end(state)


def _lbfgs_step(state: FitState, callbacks: Sequence[Callback], batch: Any, spec: StepSpec,
                timer: _Timer) -> tuple[float, float, list[float]]:
    """One LBFGS step: the closure re-evaluates the loss as often as LBFGS asks."""
    task, model, optimizer = state.task, state.model, state.optimizer
    assert task is not None
    assert optimizer is not None
    times = {"forward": 0.0, "backward": 0.0}
    calls = {"n": 0}
    first_loss: list[float] = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        timer.lap()
        with spec.autocast(state.device.type):
            loss = task.loss(model, batch)
        times["forward"] += timer.lap()
        loss.backward()
        times["backward"] += timer.lap()
        if calls["n"] == 0:
            first_loss.append(float(loss.detach()))
            state.loss_tensor = loss
            for cb in callbacks:
                cb.on_after_backward(state)
            timer.lap()
        calls["n"] += 1
        return loss

    optimizer.step(closure)  # type: ignore[arg-type]  # LBFGS takes a closure returning a tensor
    return times["forward"], times["backward"], first_loss


@torch.no_grad()
def evaluate_model(task: Task, model: nn.Module, device: torch.device, batch_size: int, *,
                   split: str = "val") -> dict[str, float]:
    """The task's metrics of ``model`` on its validation data, or (``split="test"``) its held-out
    ``test_data`` (eval mode, no grad)."""
    if split not in ("val", "test"):
        raise ConfigError(f"split={split!r} is unknown; valid: val, test.")
    data = task.val_data(batch_size) if split == "val" else task.test_data(batch_size)
    if data is None:
        raise ConfigError(f"task {task.name or type(task).__name__!r} has no test_data(); give it one, "
                          "or hold out part of its validation data (proftune's with_test_split).")
    was_training = model.training
    model.eval()
    try:
        metrics = task.evaluate(model, DeviceIterable(data, device))
    finally:
        model.train(was_training)
    return metric_values(task, metrics)


def metric_values(task: Task, metrics: Any) -> dict[str, float]:
    """The metrics a task's ``evaluate`` returned, as floats: the one place they enter.

    A value that is not one number (a list, a string, a tensor of several) is a ConfigError that
    names the metric and shows the value; NaN and infinity stay floats, which the fit loop records
    as an anomaly and every later step reads as not finite.
    """
    who = f"task {task.name or type(task).__name__!r}: evaluate()"
    if not isinstance(metrics, dict):
        raise ConfigError(f"{who} must return a dict of metric name to number, but got {metrics!r}.")
    out: dict[str, float] = {}
    problems = ProblemCollector()
    for k, v in metrics.items():
        if (isinstance(v, torch.Tensor) and v.numel() == 1) or (isinstance(v, np.ndarray) and v.size == 1):
            v = v.item()
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            problems.add(f"{k}={v!r}: a metric must be one number (a float, an int or a one-element tensor).")
            continue
        out[str(k)] = float(v)
    problems.raise_if_any(header=f"{who} returned values that are not metrics:")
    return out


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
