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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ._device import DeviceIterable, batch_size_of, clock, move_to_device, resolve_device
from ._optimizers import OPTIMIZERS, build_optimizer
from ._options import with_options
from ._threads import (
    ThreadChoice,
    ThreadTuner,
    candidate_counts,
    machine_cores,
    max_threads,
    others_running,
    recall,
    remember,
    run_queue_ms,
    threads_from_env,
)
from .exceptions import ConfigError, ProblemCollector
from .metrics import direction, is_known, resolve_direction
from .task import Task, load_task

__all__ = [
    "LOOP_PARAMS",
    "Callback",
    "EarlyStopping",
    "FitConfig",
    "FitResult",
    "FitState",
    "StepPhases",
    "StepSpec",
    "ThreadChoice",
    "build_optimizer",
    "evaluate_model",
    "fit",
    "run_step",
    "seed_everything",
    "validate_params",
]

PRECISIONS = ("fp32", "bf16", "fp16")
#: Params with a meaning to the loop; every other param goes to the task untouched.
LOOP_PARAMS = (
    "lr", "batch_size", "weight_decay", "optimizer", "momentum",
    "grad_accumulation", "grad_clip", "precision",
)


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
    #: ``{"step": [...], "epoch": [...]}``: one dict per step and per epoch.
    curves: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"step": [], "epoch": []})
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    samples_seen: int = 0
    should_stop: bool = False
    stop_reason: str | None = None
    #: When True the loop synchronises the device around each phase so that timings are exact.
    sync_timing: bool = False
    scaler: Any = None
    #: The task's learning-rate schedule (``Task.configure_scheduler``), stepped after each step.
    scheduler: Any = None

    def request_stop(self, reason: str) -> None:
        """Ask the loop to stop after the current step."""
        self.should_stop = True
        if self.stop_reason is None:
            self.stop_reason = reason

    def record_anomaly(self, kind: str, **detail: Any) -> None:
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
    curves: dict[str, list[dict[str, Any]]]
    params: dict[str, Any]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    steps: int
    epochs: int
    samples: int
    duration_s: float
    anomalies: list[dict[str, Any]]
    stop_reason: str | None
    device: str
    #: The CPU thread count it trained at and its evidence (the measured step times, the re-checks).
    threads: ThreadChoice | None = None

    @property
    def throughput(self) -> float:
        """Training samples per second over the whole fit (evaluation included)."""
        return self.samples / self.duration_s if self.duration_s > 0 else 0.0


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def validate_params(params: dict[str, Any]) -> dict[str, Any]:
    """Check and normalise the params the loop understands; one error lists every problem."""
    out = dict(params)
    problems = ProblemCollector()

    def number(key: str, kind: type, *, low: float | None = None, strict: bool = False) -> None:
        if key not in out:
            return
        value = out[key]
        try:
            if isinstance(value, bool):
                raise TypeError
            converted = kind(value)
            if kind is int and float(value) != converted:
                raise ValueError
        except (TypeError, ValueError):
            problems.add(f"param {key}={value!r} must be {'an integer' if kind is int else 'a number'}.")
            return
        if isinstance(converted, float) and not math.isfinite(converted):
            problems.add(f"param {key}={value!r} must be finite.")
            return
        if low is not None and (converted <= low if strict else converted < low):
            problems.add(f"param {key}={value!r} must be {'>' if strict else '>='} {low}.")
            return
        out[key] = converted

    number("lr", float, low=0.0, strict=True)
    number("batch_size", int, low=1)
    number("weight_decay", float, low=0.0)
    number("momentum", float, low=0.0)
    number("grad_accumulation", int, low=1)
    number("grad_clip", float, low=0.0, strict=True)
    if "optimizer" in out:
        name = str(out["optimizer"]).lower()
        if name not in OPTIMIZERS:
            problems.add(f"param optimizer={out['optimizer']!r} is unknown; valid: {', '.join(OPTIMIZERS)}.")
        out["optimizer"] = name
    if "precision" in out:
        prec = str(out["precision"]).lower()
        if prec not in PRECISIONS:
            problems.add(f"param precision={out['precision']!r} is unknown; valid: {', '.join(PRECISIONS)}.")
        out["precision"] = prec
    if out.get("optimizer") == "lbfgs" and int(out.get("grad_accumulation", 1) or 1) > 1:
        problems.add("param grad_accumulation must be 1 with optimizer='lbfgs' (it re-evaluates the loss).")
    problems.raise_if_any()
    return out


# -- one optimizer step: the description the fit loop runs and the step predictor traces ----------------


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
        scaled = loss / len(micro_batches)
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


class _ThreadControl(Callback):
    """Sets torch's thread count for each step, as :class:`ThreadTuner` decides from the steps'
    times (or once, for a fixed count); :meth:`choice` is the record of what it did."""

    def __init__(self, fixed: int | None, given_by: str, key: tuple[str, ...]) -> None:
        self.fixed, self.given_by, self.key = fixed, given_by, key
        self.limit = max_threads()
        self.tuner: ThreadTuner | None = None
        self._armed = False
        self._grad_hooks: list[Any] = []
        self._deadline, self._fallback, self._cut = 0.0, 1, False
        self._wait0: float | None = None
        self._others0: int | None = None
        self._wall0 = 0.0
        if fixed is None:
            hit = recall(key)
            start, recheck, since = hit if hit is not None else (None, 64, 0)
            self.tuner = ThreadTuner(candidate_counts(self.limit), start=start, recheck=recheck, since=since,
                                     cores=machine_cores())
        self._apply()

    def _apply(self) -> None:
        want = self.fixed if self.fixed is not None else (self.tuner.threads if self.tuner else None)
        if want is not None and torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def on_step_start(self, state: FitState) -> None:
        if self.tuner is not None and self.tuner.wants_load():
            self._wait0, self._wall0 = run_queue_ms(), time.perf_counter()
            self._others0 = others_running(torch.get_num_threads())
        else:  # not read around this step (each read opens a file under /proc)
            self._wait0 = self._others0 = None
        # a candidate measured after a faster one: once its step has taken ``abort`` x the best
        # step, the rest of the step runs at the best count (checked as each module's forward
        # starts and each parameter's gradient is computed, through hooks on this model's own
        # modules and parameters, removed at the step's end; no global module hook: the one stack
        # of running modules is profile's), so a count that waits on busy cores costs about
        # ``abort`` good steps, not one of its own (2 threads of digits-cnn on 2 cores at load 9:
        # 0.55 s with the backward checked alone, 0.13-0.18 s with the forward too; 20 ms at 1)
        cut = self.tuner.cut_off() if self.tuner is not None else None
        if cut is not None and not self._armed:
            self._deadline, self._fallback = time.perf_counter() + cut[0] / 1e3, cut[1]
            self._cut = False
            self._armed = True
            self._grad_hooks = [p.register_hook(self._check_grad) for p in state.model.parameters()
                                if p.requires_grad]
            if not hasattr(state.model, "_orig_mod"):  # a compiled model would recompile for new hooks
                self._grad_hooks += [m.register_forward_pre_hook(self._check) for m in state.model.modules()]

    def _check(self, *_: Any) -> None:
        if not self._cut and time.perf_counter() > self._deadline:
            self._cut = True
            torch.set_num_threads(self._fallback)

    def _check_grad(self, grad: torch.Tensor) -> None:
        self._check()  # in the backward too, as each parameter's gradient is computed

    def on_after_backward(self, state: FitState) -> None:
        if self._armed:
            self._check()

    def _unhook(self) -> None:
        self._armed = False
        for h in self._grad_hooks:
            h.remove()
        self._grad_hooks = []

    def on_step_end(self, state: FitState) -> None:
        cut = self._armed and self._cut
        self._unhook()
        if self.tuner is not None:
            waited: float | None = None
            others: float | None = None
            if self._wait0 is not None:
                wait, wall = run_queue_ms(), (time.perf_counter() - self._wall0) * 1e3
                # the share of the step the training thread waited for a core, scaled to the step's time
                waited = (None if wait is None or wall <= 0 else
                          (wait - self._wait0) / wall * float(state.timing.get("step_ms", 0.0)))
            if self._others0 is not None:
                # other processes' runnable threads, sampled as the step began and as it ended
                after = others_running(torch.get_num_threads())
                others = None if after is None else (self._others0 + after) / 2
            self.tuner.observe(float(state.timing.get("step_ms", 0.0)), cut=cut, wait_ms=waited, others=others)
            self._apply()

    def on_fit_end(self, state: FitState) -> None:
        self._unhook()
        self._remember()

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self._unhook()

    def _remember(self) -> None:
        t = self.tuner
        if t is not None and (t.checks or t.remembered) and not t.measuring:
            remember(self.key, t.threads, t.recheck, t.since)

    def choice(self) -> ThreadChoice:
        t = self.tuner
        if t is None:
            assert self.fixed is not None
            return ThreadChoice(threads=self.fixed, source="user", max_threads=self.limit, given_by=self.given_by)
        return ThreadChoice(threads=t.threads, source="computed", max_threads=self.limit, candidates=t.candidates,
                            checks=list(t.checks), remembered=t.remembered,
                            steps_at={str(k): v for k, v in sorted(t.steps_at.items())})


def fit(
    task: Task | str,
    params: dict[str, Any] | None = None,
    config: FitConfig | None = None,
    *,
    callbacks: Sequence[Callback] = (),
    model: nn.Module | None = None,
    **options: Any,
) -> FitResult:
    """Train ``task`` with ``params``; seeded and deterministic on CPU.

    ``config`` (a :class:`FitConfig`) or its fields by name (``epochs=3, seed=0``) say how long
    and where. ``model`` trains a given model (fine-tuning) instead of building one.
    """
    cfg = with_options(FitConfig, config, options, caller="fit")
    epochs, max_steps, batch_size, device, seed = cfg.epochs, cfg.max_steps, cfg.batch_size, cfg.device, cfg.seed
    evaluate, stop_on_nan = cfg.evaluate, cfg.stop_on_nan
    task = load_task(task)
    merged = {**task.default_params, **(params or {})}
    if batch_size is not None:
        merged["batch_size"] = batch_size
    merged = validate_params(merged)
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

    scheduler = task.configure_scheduler(optimizer, merged, epochs=epochs, max_steps=max_steps)
    state = FitState(task=task, model=model, optimizer=optimizer, params=merged, device=dev,
                     batch_size=bs, scaler=scaler, scheduler=scheduler)
    threads_before = torch.get_num_threads()
    control = _ThreadControl(threads, given_by, (task.name or type(task).__name__, dev.type))
    callbacks = [*callbacks, control]
    started = time.perf_counter()
    try:
        for cb in callbacks:
            cb.on_fit_start(state)
        epoch_limit = epochs if epochs is not None else math.inf
        while state.epoch < epoch_limit and not state.should_stop:
            _run_epoch(state, callbacks, spec=spec, max_steps=max_steps, evaluate=evaluate,
                       stop_on_nan=stop_on_nan, started=started)
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


def _micro_batches(it: Iterator[Any], accum: int) -> Iterator[list[Any]]:
    group: list[Any] = []
    for batch in it:
        group.append(batch)
        if len(group) == accum:
            yield group
            group = []
    if group:
        yield group


class _TimedPhases(StepPhases):
    """The fit loop's side of a step: each phase's milliseconds, and ``on_after_backward``."""

    def __init__(self, state: FitState, callbacks: Sequence[Callback], timer: _Timer) -> None:
        self.state, self.callbacks, self.timer = state, callbacks, timer
        self.ms = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        self.timer.lap()  # what ran between phases (hooks) is not the step's time
        yield
        self.ms[phase] += self.timer.lap()

    def forward(self) -> contextlib.AbstractContextManager[Any]:
        return self._timed("forward")

    def backward(self) -> contextlib.AbstractContextManager[Any]:
        return self._timed("backward")

    def optimizer(self) -> contextlib.AbstractContextManager[Any]:
        return self._timed("optimizer")

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
    while True:
        timer.sync = state.sync_timing
        timer.lap()
        group = next(groups, None)
        if group is None:
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
                                     "lr": state.lr, "samples": n})
        if state.scheduler is not None:  # the rate of the next step; the curve holds this step's
            state.scheduler.step()
        if not math.isfinite(state.loss):
            state.record_anomaly("nan_loss", loss=state.loss)
            if stop_on_nan:
                state.request_stop(f"loss became {state.loss} at step {state.step}")
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
    return {k: float(v) for k, v in metrics.items()}


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
