"""Two of the three measurements that ``recommend`` is built from, each a public call of its own: the
largest batch size that fits (``find_batch_size``) and the LR range test (``lr_find``), with their
configs and the task's static memory (the third, ``noise_scale``, is in ``_noise_scale``).

Each takes a task (and optionally a Profile measured before, whose numbers are not measured
again) and, with ``store=`` (a Store or a URL; ``db=`` is the older spelling, as in every public
entry), records itself as a Run (kinds ``batch_size``, ``lr_find``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._device import resolve_device
from .._paths import OutputPath, check_outputs
from .._train_params import TrainParams, as_train_params
from .._units import format_bytes, parse_memory
from .._with_options import with_options
from ..exceptions import ConfigError, ProblemCollector
from ..profile import Profile
from ..task import Task, load_task
from ..track import Store, optional_store, tracked_run
from ..train import seed_everything
from ._batch_size import BatchSizeResult, DataLimit, Measure, search_max_batch
from ._full_batches import FullBatchTask, samples_per_epoch
from ._lr_find import LRFindResult, decide_by_ladder, run_lr_range_test, validate_lr_range

__all__ = ["find_batch_size", "lr_find", "static_memory"]


_store = optional_store


def static_memory(task: Task, params: TrainParams | Mapping[str, Any], *,
                  profile: Profile | None = None) -> dict[str, int]:
    """Bytes of parameters (+ buffers), gradients and optimizer state: the floor of any budget.

    From the profile when it holds them; otherwise counted on a throwaway copy of the model on
    the CPU after one optimizer step on zero gradients (so lazily created state exists).
    """
    if profile is not None and profile.memory.params_bytes > 0:
        m = profile.memory
        return {"params_bytes": int(m.params_bytes), "grads_bytes": int(m.grads_bytes),
                "optimizer_bytes": int(m.optimizer_bytes),
                "total": int(m.params_bytes + m.grads_bytes + m.optimizer_bytes)}
    given = as_train_params(task, params)
    seed_everything(0)
    return model_static_memory(task, task.build_model(given.params), given)


def model_static_memory(task: Task, model: nn.Module, params: TrainParams) -> dict[str, int]:
    """:func:`static_memory` of a built ``model`` (moved to the CPU; its gradients are left unset)."""
    from ..profile import buffers_bytes, optimizer_state_bytes, params_bytes

    model = model.cpu()
    optimizer = task.configure_optimizer(model, params.params)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    if not isinstance(optimizer, torch.optim.LBFGS):
        optimizer.step()
    weights = params_bytes(model) + buffers_bytes(model)
    grads = sum(p.numel() * p.element_size() for p in trainable)
    state = optimizer_state_bytes(optimizer)
    for p in trainable:
        p.grad = None
    return {"params_bytes": int(weights), "grads_bytes": int(grads), "optimizer_bytes": int(state),
            "total": int(weights + grads + state)}


def _default_measure(task: Task, given: TrainParams, device: torch.device, seed: int) -> Measure:
    """The profiler's peak of one step, on batches of exactly the asked size (see FullBatchTask)."""
    from ..profile import peak_step_memory

    full = FullBatchTask(task)
    available: list[int] = []  # the epoch's sample count, once a probe found it smaller than a batch

    def measure(batch_size: int) -> int:
        # a batch cannot hold more samples than one epoch: say so (the search then clamps to the
        # data) instead of cycling the data to build a batch that training never sees
        if available and batch_size > available[0]:
            raise DataLimit(batch_size, available[0])
        n = samples_per_epoch(task, given, batch_size=min(batch_size, 1 << 16), stop_after=batch_size)
        if 0 < n < batch_size:
            available.append(n)
            raise DataLimit(batch_size, n)
        return int(peak_step_memory(full, given.params, batch_size=batch_size, device=device, seed=seed))

    return measure


def _cap_by_data(result: BatchSizeResult, task: Task, given: TrainParams) -> BatchSizeResult:
    """A batch cannot hold more samples than one epoch of the training data."""
    n = samples_per_epoch(task, given, batch_size=min(result.max_batch_size, 1 << 16),
                          stop_after=result.max_batch_size)
    if n >= result.max_batch_size or n < 1:
        return result
    return dataclasses.replace(result, max_batch_size=n, limited_by="data", data_samples=n,
                               memory_max_batch_size=result.max_batch_size,
                               predicted_peak_bytes=result.model.predict(n))


@dataclass(frozen=True)
class BatchSizeConfig:
    """What :func:`find_batch_size` searches: the budget (bytes or ``4GiB``; required), the device,
    the first probe's batch, how many probe steps at most, the seed, and whether to start from
    :func:`predict`'s answer."""

    memory_budget: int | str | None = None
    device: str | torch.device = "auto"
    start: int = 16
    max_probes: int = 3
    seed: int = 0
    from_prediction: bool = False


def find_batch_size(
    task: Task | str,
    params: TrainParams | Mapping[str, Any] | None = None,
    config: BatchSizeConfig | None = None,
    *,
    profile: Profile | None = None,
    measure: Measure | None = None,
    store: Store | str | None = None,
    db: str | None = None,
    **options: Any,
) -> BatchSizeResult:
    """The largest batch size whose training step peaks within ``memory_budget`` (bytes or '4GiB').

    ``config`` (:class:`BatchSizeConfig`) or its fields by name (``memory_budget="4GiB"``) say
    what to search.

    Fits peak(B) = a + b·B from at most ``max_probes`` short probe steps (a given ``profile``'s
    peak counts as one and is not re-measured), predicts the largest B under the budget less a
    margin from the fit's residual, and verifies it with one step. ``measure`` replaces the
    profiler's :func:`peak_step_memory` (batch size -> bytes), e.g. in tests.

    ``from_prediction`` starts from :func:`predict`'s answer (fake-tensor steps, nothing run) and
    verifies it with one real step (more only when the measured peak is off the prediction),
    instead of probing; it falls back to the probes when no verified step fits.

    Raises :class:`ConfigError` when the budget cannot hold the parameters, gradients and
    optimizer state alone (the message says what the model needs at batch size 1).
    """
    cfg = with_options(BatchSizeConfig, config, options, caller="find_batch_size")
    if cfg.memory_budget is None:
        raise ConfigError("find_batch_size() needs memory_budget (bytes, or a size such as '4GiB').")
    start, max_probes, seed, from_prediction = cfg.start, cfg.max_probes, cfg.seed, cfg.from_prediction
    task_obj = load_task(task)
    given = as_train_params(task_obj, params)  # validated once; a TrainParams as it was made
    budget = parse_memory(cfg.memory_budget)
    dev = resolve_device(cfg.device)
    static = static_memory(task_obj, given, profile=profile)
    measure_fn = measure or _default_measure(task_obj, given, dev, seed)
    if budget < static["total"]:
        try:
            at_one: int | None = int(measure_fn(1))
        except (torch.OutOfMemoryError, DataLimit):
            at_one = None
        raise ConfigError(
            f"memory_budget={format_bytes(budget)} ({budget} bytes) is below what "
            f"{task_obj.name or type(task_obj).__name__} needs before any activation: parameters "
            f"{format_bytes(static['params_bytes'])} + gradients {format_bytes(static['grads_bytes'])} "
            f"+ optimizer state {format_bytes(static['optimizer_bytes'])} = {format_bytes(static['total'])}"
            + (f"; one training step at batch size 1 peaks at {format_bytes(at_one)} ({at_one} bytes)."
               if at_one is not None else ".")
        )
    known = []
    if profile is not None and profile.batch_size > 0 and profile.memory.peak_bytes > 0 and profile.mode == "train":
        known.append((int(profile.batch_size), int(profile.memory.peak_bytes)))

    def body() -> BatchSizeResult:
        found = _from_prediction(task_obj, given, measure_fn, budget, start, dev, static) if from_prediction else None
        if found is None:
            found = search_max_batch(measure_fn, budget, known=known, start=start, max_probes=max_probes,
                                     static_bytes=static["total"], device=str(dev), static_detail=static)
        return _cap_by_data(found, task_obj, given)

    st = _store(store, db=db)
    if st is None:
        return body()
    run_config = {"params": given.params, "memory_budget": budget, "device": str(dev), "max_probes": max_probes,
                  "start": start, "profile_point": known}
    with tracked_run("batch_size", task_obj, config=run_config, device=dev, store=st) as run:
        result = dataclasses.replace(body(), run_id=run.id)
        run.set(metrics={"max_batch_size": float(result.max_batch_size), "runs": float(result.runs),
                         "measured_peak_bytes": float(result.measured_peak_bytes or 0)},
                result=result.to_dict())
    return result


def _from_prediction(task: Task, given: TrainParams, measure: Measure, budget: int, start: int,
                     dev: torch.device, static: dict[str, int]) -> BatchSizeResult | None:
    """``predict``'s largest batch under ``budget``, verified by real steps (see verify_prediction)."""
    from ..predict import MemoryModel, predict
    from ._batch_size import verify_prediction

    pred = predict(task, given, batch_size=start, target=None, device_memory=budget,
                   foreach=dev.type == "cuda")
    m = pred.max_batch["model"] if pred.max_batch is not None else None
    if not pred.max_batch_size or not m:
        return None
    model = MemoryModel(intercept_bytes=m["intercept_bytes"], per_sample_bytes=m["per_sample_bytes"],
                        residual_bytes=m["residual_bytes"], margin_bytes=m["margin_bytes"], points=m["points"])
    return verify_prediction(measure, budget, model, pred.max_batch_size, static_bytes=static["total"],
                             device=str(dev), static_detail=static)


@dataclass(frozen=True)
class LRFindConfig:
    """An LR range test: from ``min_lr`` to ``max_lr`` over ``steps`` steps at ``batch_size``
    (default: the task's), on ``device`` from ``seed``; ``plot`` a PNG path for the curve.
    Where the sweep sees no fall, the lr ladder decides: ``ladder_rungs`` constant rates half a
    decade apart around the task's lr, ``ladder_steps`` steps each (0: no ladder)."""

    min_lr: float = 1e-7
    max_lr: float = 10.0
    steps: int = 100
    batch_size: int | None = None
    device: str | torch.device = "auto"
    seed: int = 0
    plot: str | None = None
    ladder_steps: int = 100
    ladder_rungs: int = 7


def lr_find(
    task: Task | str,
    params: TrainParams | Mapping[str, Any] | None = None,
    config: LRFindConfig | None = None,
    *,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    store: Store | str | None = None,
    db: str | None = None,
    **options: Any,
) -> LRFindResult:
    """Exponential LR range test from ``min_lr`` to ``max_lr`` over ``steps`` steps of the fit loop
    (``config``, an :class:`LRFindConfig`, or its fields by name).

    Returns ``suggested_lr`` (robust to noisy loss: one decade below the smoothed minimum,
    within the descending region), ``min_lr`` where the loss starts to fall, ``max_lr`` the last
    before it blows up, and the curve. A given ``model``/``optimizer`` is restored afterwards.
    ``plot`` writes the curve as a PNG.
    """
    cfg = with_options(LRFindConfig, config, options, caller="lr_find")
    min_lr, max_lr, steps, batch_size, seed, plot = (cfg.min_lr, cfg.max_lr, cfg.steps, cfg.batch_size, cfg.seed,
                                                     cfg.plot)
    validate_lr_range(min_lr, max_lr, steps)
    _check_ladder(cfg.ladder_steps, cfg.ladder_rungs)
    check_outputs([OutputPath("plot=", plot)], force=True)  # its folder, before the sweep
    task_obj = load_task(task)
    given = as_train_params(task_obj, params)  # validated once; a TrainParams as it was made
    dev = resolve_device(cfg.device)

    def body() -> LRFindResult:
        result = run_lr_range_test(task_obj, given, model=model, optimizer=optimizer, min_lr=min_lr,
                                   max_lr=max_lr, steps=steps, batch_size=batch_size, device=dev, seed=seed)
        if model is None and optimizer is None:  # a given model is the user's: the ladder trains the task's
            result = decide_by_ladder(result, task_obj, given, steps=cfg.ladder_steps, rungs=cfg.ladder_rungs,
                                      device=dev, seed=seed)
        if plot:
            result.plot(plot)
        return result

    st = _store(store, db=db)
    if st is None:
        return body()
    run_config = {"params": given.params, "min_lr": min_lr, "max_lr": max_lr, "steps": steps,
                  "batch_size": batch_size, "device": str(dev), "seed": seed,
                  "ladder_steps": cfg.ladder_steps, "ladder_rungs": cfg.ladder_rungs}
    with tracked_run("lr_find", task_obj, config=run_config, device=dev, store=st) as run:
        result = dataclasses.replace(body(), run_id=run.id)
        metrics = {k: v for k, v in (("suggested_lr", result.suggested_lr), ("min_lr", result.min_lr),
                                     ("max_lr", result.max_lr)) if v is not None}
        run.set(metrics=metrics, result={k: v for k, v in result.to_dict().items() if k != "curve"},
                curves={"lr_range": result.to_dict()["curve"]},
                artifacts={"plot": str(plot)} if plot else {})
    return result


def _check_ladder(steps: Any, rungs: Any) -> None:
    problems = ProblemCollector()
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0 or 0 < steps < 8:
        problems.add(f"ladder_steps={steps!r} must be 0 (no ladder) or an integer >= 8 (steps per rate).")
    if isinstance(rungs, bool) or not isinstance(rungs, int) or rungs < 3:
        problems.add(f"ladder_rungs={rungs!r} must be an integer >= 3 (a rate each side of the centre).")
    problems.raise_if_any(header="The lr ladder is not well-formed, found the following errors:")
