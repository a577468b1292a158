"""``proftune.profile(task_or_model, ...)``: measure a model and its training (or inference) step.

A training step is profiled through the one fit loop (:func:`proftune.train.fit`) with a
profiling callback and ``max_steps``; the steps are spent in this order:

1. ``warmup`` steps, not measured (allocator, kernels and lazy state warm up);
2. ``steps`` clean steps: the step's phases and wall time, gradient norms, the CUDA peak;
   nothing is hooked, so this is the step as it runs without us;
3. (``detail="full"``) ``steps`` layer-timed steps: per-layer forward and backward time;
4. (not ``detail="time"``) one memory step: activations saved for backward per layer, and on CPU the peak of the step
   from ``torch.profiler``'s allocation events (so the profiler's cost touches no timing);
5. (``detail="full"``) one statistics step: weights, activations, gradients, update ratio;
6. (``trace=``) one step under ``torch.profiler``, exported as a Chrome/Perfetto trace.

Inference (``inference=True``) runs the same plan forward-only, in eval mode under
``torch.no_grad``, on its own small loop (there is no training to go through the fit loop).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._device import batch_size_of, call_model, move_to_device, output_loss, resolve_device
from .._paths import OutputPath, check_outputs
from .._train_params import as_train_params
from .._with_options import with_options
from ..exceptions import ConfigError, ProblemCollector
from ..task import Task, load_task
from ..track import Store, environment, optional_store, tracked_run
from ..train import FitState, TrainParams, fit, seed_everything
from ._assemble import assemble_profile, static_counts
from ._comm import CommRecorder, unwrap
from ._layers import module_names, output_tensors, shapes_of
from ._profiler import ProfilePlan, ProfilerCallback
from ._records import Profile

__all__ = ["DETAILS", "ProfileConfig", "profile"]

DETAILS = ("full", "step", "time")


class _ModuleTask(Task):
    """A bare module as a Task: its example input is every batch; the loss is the mean of its
    floating outputs (enough to drive a real backward through every layer)."""

    def __init__(self, module: nn.Module, example_input: Any, batch_size: int | None) -> None:
        self.module = module
        self.example = _resize_batch(example_input, batch_size) if batch_size else example_input
        # instance values of what a Task declares on its class
        setattr(self, "name", type(module).__name__)  # noqa: B010
        setattr(self, "default_params", {})  # noqa: B010
        self.steps_needed = 1

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return self.module

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return [self.example] * self.steps_needed

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return [self.example]

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        out = call_model(model, batch)
        own = output_loss(out)  # a Hugging Face model given labels returns its loss
        if own is not None:
            return own
        leaves = [t for t in output_tensors(out) if t.is_floating_point()]
        if not leaves:
            raise ConfigError(f"{self.name}'s output holds no floating tensor to backpropagate from.")
        return sum(t.float().mean() for t in leaves)  # type: ignore[return-value]


def _resize_batch(example: Any, batch_size: int) -> Any:
    """``example`` with every tensor's leading dimension cycled to ``batch_size`` rows."""
    if isinstance(example, torch.Tensor):
        if example.dim() == 0:
            return example
        idx = torch.arange(batch_size, device=example.device) % example.shape[0]
        return example.index_select(0, idx)
    if isinstance(example, tuple):
        return tuple(_resize_batch(e, batch_size) for e in example)
    if isinstance(example, list):
        return [_resize_batch(e, batch_size) for e in example]
    if isinstance(example, dict):
        return {k: _resize_batch(v, batch_size) for k, v in example.items()}
    return example


# -- the error a user's model raises ---------------------------------------------------------------
def _forward_error(exc: BaseException, model: nn.Module) -> ConfigError | None:
    """A ConfigError naming the innermost layer of ``model`` that raised, and its input shapes."""
    names = module_names(model)
    found: tuple[str, nn.Module, Any] | None = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "_call_impl":
            mod = frame.f_locals.get("self")
            if isinstance(mod, nn.Module) and id(mod) in names:
                args = frame.f_locals.get("args", ())
                kwargs = frame.f_locals.get("kwargs", {})
                found = (names[id(mod)], mod, (args, kwargs))
        tb = tb.tb_next
    if found is None:
        return None
    path, mod, (args, kwargs) = found
    shapes = shapes_of(args)
    if kwargs:
        shapes.append({k: shapes_of(v) for k, v in kwargs.items()})
    where = f"layer {path!r}" if path else "the model's top module"
    return ConfigError(
        f"the model's forward raised in {where} ({type(mod).__name__}) given inputs of shapes "
        f"{shapes}: {type(exc).__name__}: {exc}{_batch_norm_hint(mod, exc)}"
    )


def _batch_norm_hint(mod: nn.Module, exc: BaseException) -> str:
    """What to do when a BatchNorm layer in training mode saw one value per channel."""
    if not (isinstance(mod, nn.modules.batchnorm._BatchNorm) and "more than 1 value" in str(exc)):
        return ""
    # one value per channel at batch 1 means one per sample: two samples are the least that work
    return (". BatchNorm normalises over the batch in training mode, so a training step needs "
            "more than one value per channel: the smallest batch size that works is 2 "
            "(batch_size=2); an inference profile (inference=True) runs it in eval mode at batch 1")


# -- inference --------------------------------------------------------------------------------------
def _profile_inference(task: Task, model: nn.Module, plan: ProfilePlan, bs: int) -> ProfilerCallback:
    """Forward-only steps through the task's loss in eval mode under no_grad (no fit loop: no
    training happens), timed per phase with hooks on the model's top module."""
    prof = ProfilerCallback(plan, train=False)
    model.eval()
    state = FitState(task=task, model=model, optimizer=None, params={}, device=plan.device, batch_size=bs)
    marks: dict[str, float] = {}

    def pre(mod: nn.Module, args: Any) -> None:
        marks["fwd0"] = prof._now()

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        marks["fwd"] = marks.get("fwd", 0.0) + (prof._now() - marks["fwd0"]) * 1e3

    data = itertools.cycle(list(itertools.islice(iter(task.val_data(bs)), 8)) or [task.example_batch(bs)])
    handles = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
    prof.on_fit_start(state)
    try:
        with torch.no_grad():
            while not state.should_stop:
                t0 = prof._now()
                batch = move_to_device(next(data), plan.device)
                state.batch = batch
                t1 = prof._now()
                prof.on_step_start(state)
                marks.clear()
                t2 = prof._now()
                task.loss(model, batch)
                t3 = prof._now()
                fwd = marks.get("fwd", (t3 - t2) * 1e3)
                state.timing = {"data_ms": (t1 - t0) * 1e3, "forward_ms": fwd, "backward_ms": 0.0,
                                "optimizer_ms": 0.0, "step_ms": (t1 - t0) * 1e3 + (t3 - t2) * 1e3}
                if prof._phase == "layers" and prof.timer is not None:
                    prof.timer.mark_backward_end(t3)
                state.step += 1
                prof.on_step_end(state)
    except BaseException as exc:
        prof.on_exception(state, exc)
        raise
    finally:
        for h in handles:
            h.remove()
    prof.on_fit_end(state)
    return prof


# -- the entry point ----------------------------------------------------------------------------------
def _validate(*, batch_size: Any, steps: Any, warmup: Any, detail: Any, is_module: bool,
              example_input: Any) -> None:
    problems = ProblemCollector()

    def positive_int(name: str, value: Any, low: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.add(f"{name} must be an integer >= {low}, but got {name}={value!r}.")

    if batch_size is not None:
        positive_int("batch_size", batch_size, 1)
    positive_int("steps", steps, 1)
    positive_int("warmup", warmup, 0)
    if detail not in DETAILS:
        problems.add(f"detail={detail!r} is unknown; valid: {', '.join(DETAILS)}.")
    if is_module and example_input is None:
        problems.add("profiling an nn.Module needs example_input (a tensor, tuple or dict fed to model(...)).")
    problems.raise_if_any()


@dataclass(frozen=True)
class ProfileConfig:
    """What :func:`profile` measures: at ``batch_size`` (default the task's), ``steps`` steps after
    ``warmup`` unmeasured ones, training or (``inference``) the forward pass, on ``device`` from
    ``seed``, in ``detail`` (``full``, ``step`` or ``time``), with a ``trace`` file if given."""

    batch_size: int | None = None
    steps: int = 3
    warmup: int = 1
    inference: bool = False
    device: str | torch.device = "auto"
    seed: int = 0
    detail: str = "full"
    trace: str | Path | None = None


def profile(
    task_or_model: Task | str | nn.Module,
    config: ProfileConfig | None = None,
    *,
    params: TrainParams | Mapping[str, Any] | None = None,
    example_input: Any = None,
    store: Store | str | None = None,
    db: str | None = None,
    **options: Any,
) -> Profile:
    """Measure a model and its training step (or, with ``inference=True``, its forward pass).

    ``config`` (a :class:`ProfileConfig`) or its fields by name (``batch_size=64, steps=5``) say
    what to measure.

    ``task_or_model``: a Task, a task spec (``file.py[:Class]``, ``pkg.mod:Class``, a built-in
    name) or an ``nn.Module`` with ``example_input`` (trained on the mean of its output; the
    module itself is left untouched, a copy is trained). ``steps`` steps are measured after
    ``warmup`` unmeasured ones; ``detail="step"`` measures the step, memory and static counts
    only; ``detail="time"`` the step's time, throughput and gradient norms only, no memory step
    and no static counts (cheapest: gating trials; ``metrics()`` leaves out what it did not
    measure). ``trace`` writes a Chrome/Perfetto trace of one more step.
    ``store``: record a ``profile`` Run there (a Store or a URL; ``db`` is the older spelling).
    Times in ms, memory in bytes, rates per second.
    """
    cfg = with_options(ProfileConfig, config, options, caller="profile")
    batch_size, steps, warmup, inference, device = cfg.batch_size, cfg.steps, cfg.warmup, cfg.inference, cfg.device
    seed, detail, trace = cfg.seed, cfg.detail, cfg.trace
    is_module = isinstance(task_or_model, nn.Module)
    _validate(batch_size=batch_size, steps=steps, warmup=warmup, detail=detail, is_module=is_module,
              example_input=example_input)
    check_outputs([OutputPath("trace=", trace)], force=True)  # its folder, before any step
    dev = resolve_device(device)
    trace_path = Path(trace) if trace is not None else None
    plan = ProfilePlan(warmup=warmup, steps=steps, detail=detail, trace=trace_path, device=dev)
    if is_module:
        import copy

        module = copy.deepcopy(task_or_model)
        task: Task = _ModuleTask(module, example_input, batch_size)  # type: ignore[arg-type]
        task.steps_needed = plan.total  # type: ignore[attr-defined]
        # a bare module has no defaults; its batch is the example's
        given = TrainParams(params.params if isinstance(params, TrainParams) else params,
                            batch_size=batch_size_of(task.example))  # type: ignore[attr-defined]
    else:
        task = load_task(task_or_model)  # type: ignore[arg-type]
        if isinstance(params, TrainParams):  # validated where it was made: not again at its own batch size
            given = as_train_params(task, params, batch_size=batch_size or params.batch_size or 32)
        else:
            size = batch_size if batch_size is not None else {**task.default_params, **(params or {})}.get(
                "batch_size", 32)
            given = TrainParams.of(task, params, batch_size=size)
    assert given.batch_size is not None
    bs = given.batch_size
    task_name = task.name or type(task).__name__
    run_config = {"params": given.params, "batch_size": bs, "steps": steps,
                  "warmup": warmup, "inference": inference, "detail": detail, "seed": seed,
                  "device": str(dev), "trace": str(trace_path) if trace_path else None}

    def measure() -> Profile:
        return _measure(task, given, plan, bs=bs, inference=inference, seed=seed, task_name=task_name,
                        config=run_config)

    st = optional_store(store, db=db)
    if st is None:
        return measure()
    with tracked_run("profile", task, config=run_config, device=dev, store=st,
                     fingerprint=not is_module) as run:
        result = measure()
        result = dataclasses.replace(result, config={**result.config, "run_id": run.id})
        run.set(metrics=result.metrics(), result=result.to_dict(),
                artifacts={"trace": str(trace_path)} if trace_path else {})
    return result


def _measure(task: Task, given: TrainParams, plan: ProfilePlan, *, bs: int, inference: bool, seed: int,
             task_name: str, config: Mapping[str, object]) -> Profile:
    dev = plan.device
    params = given.params
    model: nn.Module | None = None
    try:
        if inference:
            seed_everything(seed)
            model = task.build_model(params).to(dev)
            prof = _profile_inference(task, model, plan, bs)
        else:
            model = task.build_model(params)
            wrapped = _maybe_ddp(model.to(dev), dev)
            prof = ProfilerCallback(plan, train=True)
            if wrapped is not model:
                prof.comm = CommRecorder(wrapped)
            # room for the partial last batches the plan skips; the profiler stops the loop when done
            # at one thread count (a timed measurement does not change threads under itself): the
            # one the fit loop chose for this workload moments ago where it did (on a busy machine
            # torch's default count can be 100x slower than it), else the caller's
            fit(task, given, max_steps=2 * plan.total + 2, batch_size=bs, device=dev, seed=seed,
                callbacks=[prof], model=wrapped, evaluate=False, stop_on_nan=False,
                threads=_step_threads(task, dev))
    except torch.OutOfMemoryError:
        raise
    except ConfigError:
        raise
    except Exception as exc:
        located = _forward_error(exc, unwrap(model)) if model is not None else None
        if located is not None:
            raise located from exc
        raise
    assert model is not None
    inner = unwrap(model)
    counts = None
    if prof.example is not None and plan.detail != "time":
        counts = static_counts(inner, prof.example, backward=not inference, train=not inference)
    m = prof.measurements()
    return assemble_profile(m, counts, task=task_name, device=dev, batch_size=bs,
                            mode="inference" if inference else "train", steps=plan.steps, env=environment(dev),
                            config={**config, "timed_fwd_bwd_ms": m.timed_fwd_bwd_ms})


def _step_threads(task: Task, dev: torch.device) -> int:
    """The thread count a profile's training steps run at: the fit loop's recent choice for the
    same task and device (``_threads.recall``), else the process's count."""
    from .._threads import recall

    hit = recall((task.name or type(task).__name__, dev.type)) if dev.type == "cpu" else None
    return hit[0] if hit is not None else torch.get_num_threads()


def _maybe_ddp(model: nn.Module, dev: torch.device) -> nn.Module:
    """Wrap in DistributedDataParallel when this process is one of several ranks."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return model
    if not any(p.requires_grad for p in model.parameters()):
        return model
    ids = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)

