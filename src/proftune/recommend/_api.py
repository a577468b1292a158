"""Public entry points: largest batch size, LR range test, noise scale, and all of it at once.

Each takes a task (and optionally a Profile measured before, whose numbers are not measured
again) and, with ``store=`` (a Store or a URL; ``db=`` is the older spelling, as in every public
entry), records itself as a Run (kinds ``batch_size``, ``lr_find``, ``recommend``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._device import resolve_device
from .._optimizers import DEFAULT_OPTIMIZER
from .._records import JsonRecord
from .._threads import fit_key, work_threads
from .._train_params import TrainParams, as_train_params
from .._units import format_bytes, parse_memory
from .._with_options import with_options
from ..exceptions import ConfigError
from ..profile import Profile
from ..task import Task, load_task
from ..track import Store, optional_store, tracked_run
from ._accumulation import StepCost, plan_accumulation
from ._batch_cost import BatchCost, bound_by_cost, step_timer
from ._batch_size import BatchSizeResult
from ._full_batches import samples_per_epoch
from ._lr_find import LRFindResult
from ._measurements import find_batch_size, lr_find
from ._noise_scale import NoiseScaleResult, noise_scale
from ._precision import checked_precision_row
from ._records import CONDITIONAL_NAMES, RECOMMENDATION_NAMES, Recommendation, Recommendations
from ._rules import bottleneck_rule, data_loading_rule, precision_rule
from ._scaling import optimizer_family, scale_lr
from ._workers import num_workers_row

#: A computed batch leaves an epoch at least this many optimizer steps (or the task's own count, if fewer).
MIN_STEPS_PER_EPOCH = 8


@dataclass(frozen=True)
class DataBound:
    """The largest batch the training data allows: never above one epoch's samples, and small
    enough that an epoch keeps ``MIN_STEPS_PER_EPOCH`` optimizer steps (the task's own batch is
    allowed where it keeps fewer: the defaults' schedule trains with it)."""

    samples: int
    cap: int
    default_batch: int

    def describe(self) -> str:
        return (f"{self.samples} training samples, at most {self.cap} a batch so that an epoch keeps "
                f">= {min(MIN_STEPS_PER_EPOCH, max(1, self.samples // self.default_batch))} optimizer steps "
                f"(the task's batch {self.default_batch} keeps {self.samples // max(self.default_batch, 1)})")

    def to_dict(self) -> dict[str, object]:
        return {"train_samples": self.samples, "max_batch_by_data": self.cap,
                "min_steps_per_epoch": MIN_STEPS_PER_EPOCH, "default_batch": self.default_batch}


def data_bound(task: Task, params: TrainParams, default_batch: int, *,
               target_batch: int | None = None) -> DataBound | None:
    """The data's bound on a computed batch (None: the training data has no countable samples); a
    ``target_batch`` the user gave is theirs, bounded only by the training set itself."""
    n = samples_per_epoch(task, params, batch_size=max(1, min(default_batch, 1 << 16)), stop_after=1 << 22)
    if n < 1:
        return None
    cap = min(n, max(min(default_batch, n), n // MIN_STEPS_PER_EPOCH, 1, min(int(target_batch or 0), n)))
    return DataBound(samples=n, cap=cap, default_batch=default_batch)


def _round_batch(b: float) -> int:
    """Round a batch size to a multiple of 8 from 16 up (friendlier to kernels), else to an int."""
    if b >= 16:
        return int(8 * round(b / 8))
    return max(1, round(b))


@dataclass(frozen=True)
class RecommendConfig:
    """What :func:`recommend` measures beyond the Profile, and how long it may: the memory budget
    (bytes or ``4GiB``), a target global batch, device and seed, the range test's steps and the lr
    ladder's per rate (where the sweep sees no fall; 0: none), the noise scale's steps, the optimizer
    comparison's and the embedding row's seconds, DDP ranks and the all-reduce's largest share of the
    step, and whether a lower precision may be timed against fp32 (without it fp32 is kept)."""

    memory_budget: int | str | None = None
    target_batch: int | None = None
    device: str | torch.device = "auto"
    seed: int = 0
    lr_steps: int = 100
    ladder_steps: int = 100
    noise_steps: int = 30
    optimizer_budget_s: float = 4.0
    embedding_budget_s: float = 120.0
    ddp: int | None = None
    ddp_share: float = 0.10
    precision_check: bool = True
    #: False: the threads row reads the thread count the fit loop measured for this task in its last
    #: fit (within two minutes) instead of measuring it again (a fresh measurement where none is known).
    measure_threads: bool = True


def recommend(
    task: Task | str,
    params: TrainParams | Mapping[str, Any] | None = None,
    config: RecommendConfig | None = None,
    *,
    profile: Profile | None = None,
    store: Store | str | None = None,
    db: str | None = None,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> Recommendations:
    """Every training parameter proftune computes, from ONE Profile plus the measurements the
    Profile cannot hold (memory at other batch sizes, the LR range test, the noise scale, a
    short equal-time comparison of optimizers). ``config`` (a :class:`RecommendConfig`) or its
    fields by name (``memory_budget="30MB"``) say what to measure.

    Without ``profile``, one is measured first (``proftune.profile``). Without
    ``memory_budget``: on CUDA the device's free memory, on CPU no batch-size search.
    ``optimizer_budget_s`` bounds the optimizer comparison (range tests and trials, seconds;
    0 skips it and keeps the task's optimizer). A model with embedding tables gets the
    ``embedding_dim`` row: the task trained once as it is and once at the recommended sizes,
    bounded by ``embedding_budget_s`` seconds (0 skips the row). With ``ddp=N`` the DDP step is
    profiled on N ranks of this machine at a few per-rank batch sizes and ``ddp_batch_size`` gives
    the per-rank batch at which the all-reduce takes at most ``ddp_share`` of the step.
    """
    cfg = with_options(RecommendConfig, config, options, caller="recommend")
    memory_budget, target_batch, seed, lr_steps, noise_steps = (cfg.memory_budget, cfg.target_batch, cfg.seed,
                                                                cfg.lr_steps, cfg.noise_steps)
    optimizer_budget_s, embedding_budget_s, ddp, ddp_share = (cfg.optimizer_budget_s, cfg.embedding_budget_s,
                                                              cfg.ddp, cfg.ddp_share)
    task_obj = load_task(task)
    given = as_train_params(task_obj, params)  # validated once; a TrainParams as it was made
    dev = resolve_device(cfg.device)
    if target_batch is not None and (isinstance(target_batch, bool) or int(target_batch) < 1):
        raise ConfigError(f"target_batch must be a positive integer, but got {target_batch=}.")
    if ddp is not None and (isinstance(ddp, bool) or not isinstance(ddp, int) or ddp < 2):
        raise ConfigError(f"ddp must be a number of processes >= 2, but got {ddp=}.")
    if not (isinstance(ddp_share, (int, float)) and 0.0 < float(ddp_share) < 1.0):
        raise ConfigError("ddp_share must be in (0, 1) (the all-reduce's largest share of the step), "
                          f"but got {ddp_share=}.")
    for name, value in (("optimizer_budget_s", optimizer_budget_s), ("embedding_budget_s", embedding_budget_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"{name} must be a finite number of seconds >= 0, but got {name}={value!r}.")
    budget = parse_memory(memory_budget) if memory_budget is not None else None
    say = progress or (lambda _msg: None)

    def body() -> Recommendations:
        # the work outside the fit loop (profile, range tests, gradient samples) at the threads
        # the load leaves (a thread per core on a busy machine waits at every parallel region)
        with work_threads(fit_key(task_obj, dev.type)):
            return measured()

    def measured() -> Recommendations:
        prof = profile
        if prof is None:
            say("profiling")
            from ..profile import profile as profile_fn

            prof = profile_fn(task_obj, params=given, device=dev, seed=seed)
        return _recommend_from(task_obj, given, prof, cfg, budget=budget, device=dev, say=say,
                               ddp_spec=task if isinstance(task, str) else task_obj)

    st = optional_store(store, db=db)
    if st is None:
        return body()
    run_config = {"params": given.params, "memory_budget": budget, "target_batch": target_batch, "device": str(dev),
                  "seed": seed, "lr_steps": lr_steps, "ladder_steps": cfg.ladder_steps, "noise_steps": noise_steps,
                  "optimizer_budget_s": optimizer_budget_s, "embedding_budget_s": embedding_budget_s,
                  "ddp": ddp, "ddp_share": ddp_share}
    with tracked_run("recommend", task_obj, config=run_config, device=dev, store=st) as run:
        recs = dataclasses.replace(body(), run_id=run.id)
        run.set(result=recs.to_dict(), curves=recs.curves,
                metrics={r.name: float(r.value) for r in recs
                         if isinstance(r.value, (int, float)) and not isinstance(r.value, bool)})
    return recs


def _recommend_from(task: Task, given: TrainParams, prof: Profile, cfg: RecommendConfig, *, budget: int | None,
                    device: torch.device, say: Callable[[str], None], ddp_spec: Any) -> Recommendations:
    recs: dict[str, Recommendation] = {}
    target_batch, seed, noise_steps = cfg.target_batch, cfg.seed, cfg.noise_steps
    b_prof = int(prof.batch_size or given.batch_size or 32)
    step = prof.step

    # -- memory: the largest batch -----------------------------------------------------------------
    if budget is None and device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = int(free)
    batch_result: BatchSizeResult | None = None
    if budget is not None:
        say("batch size")
        batch_result = find_batch_size(task, given, memory_budget=budget, device=device, profile=prof, seed=seed)
    max_batch = batch_result.max_batch_size if batch_result is not None else None

    # -- the LR range test first: the noise scale is measured at a rate that trains ---------------------
    say("lr range test")
    # the range test's steps, and the ladder's per rate where the sweep sees no fall
    lr_res = lr_find(task, given, batch_size=b_prof, steps=cfg.lr_steps, device=device, seed=seed,
                     ladder_steps=cfg.ladder_steps)

    # -- noise scale: the critical batch ------------------------------------------------------------
    say("noise scale")
    micro = 4
    # micro-batches of two samples at least: batch norm cannot train on one (the defaults at
    # batch 2 crashed the probe at micro-batches of 1)
    small = max(2, b_prof // micro)
    # at the range test's rate, not the task's: at a rate that diverges the gradients measure the
    # blow-up (digits-mlp at SGD lr 1.0: B_simple 2.8, against 45 at the suggested 0.15)
    ns_params = dict(given.params)
    if lr_res.suggested_lr is not None:
        ns_params["lr"] = lr_res.suggested_lr
    ns = (noise_scale(task, ns_params, small_batch=small, micro_batches=micro, steps=noise_steps,
                      device=device, seed=seed) if noise_steps > 0 else None)
    b_crit = ns.critical_batch_size if ns is not None else None
    b_crit, recs["critical_batch_size"] = _critical_row(ns, ns_params.get("lr"), micro=micro, small=small)

    # -- target and batch size -------------------------------------------------------------------------
    target = int(target_batch) if target_batch is not None else (_round_batch(b_crit) if b_crit else b_prof)
    target_src = "target_batch=" if target_batch is not None else (
        "the critical batch size" if b_crit else "the profiled batch size")
    data = data_bound(task, given, b_prof, target_batch=target_batch)
    data_note = ""
    if data is not None and target > data.cap:
        data_note = f"; {target_src} {target} is bounded by the data: {data.describe()}"
        target = data.cap
    batch = min(target, max_batch) if max_batch is not None else target
    checked, cost_note, cost = _epoch_cost(task, given, batch, b_prof, data, max_batch=max_batch,
                                           user_batch=target_batch is not None, device=device, seed=seed, say=say)
    data_note += cost_note
    evidence: dict[str, object] = {"target_batch": target, "target_from": target_src,
                                   "profile_batch_size": b_prof,
                                   "profile_peak_bytes": prof.memory.peak_bytes,
                                   **({"data": data.to_dict()} if data is not None else {}),
                                   **({"epoch_cost": cost.to_dict()} if cost is not None else {})}
    if batch_result is not None:
        evidence.update({"max_batch_size": max_batch, "memory_budget": budget,
                         "measured_peak_bytes": batch_result.measured_peak_bytes,
                         "memory_model": batch_result.model.to_dict(), "runs": batch_result.runs,
                         "limited_by": batch_result.limited_by,
                         # the search's whole record (every probe), which the report draws
                         "search": batch_result.to_dict()})
        why = (f"the largest batch under {format_bytes(budget)} is {max_batch} (peak "
               f"{format_bytes(batch_result.measured_peak_bytes)} measured at it; memory model "
               f"{format_bytes(batch_result.model.intercept_bytes)} + "
               f"{format_bytes(batch_result.model.per_sample_bytes)}/sample)")
        if max_batch is not None and batch < max_batch:
            why += f"; {target_src} {target} is smaller, so use that"
        else:
            why += f"; {target_src} is {target}"
        # bounded by memory: measured and verified; below it: as good as the target's estimate
        conf = "high" if batch == max_batch or target_batch is not None else "medium"
    else:
        why = (f"no memory budget given on {device.type}: batch size from {target_src} ({target}); "
               "pass memory_budget= to bound it by memory")
        conf = "medium" if b_crit else "low"
    why += data_note
    batch, target = checked, max(target, checked)
    time_ms = step.time_ms * batch / b_prof if step.time_ms and b_prof else None
    recs["batch_size"] = Recommendation(
        "batch_size", batch, why + ".", evidence, conf,
        f"~{time_ms:.1f} ms per step ({batch / time_ms * 1e3:.0f} samples/s, linear in batch from "
        f"{step.time_ms:.1f} ms at {b_prof})" if time_ms else "")

    # -- learning rate and its scaling ---------------------------------------------------------------------
    lr_ev = {k: v for k, v in lr_res.to_dict().items() if k != "curve"}
    accumulation = plan_accumulation(target, max_batch, cost=_step_cost(prof)) if max_batch else None
    effective = accumulation.effective_batch if accumulation is not None else batch
    opt_name = str(given.optimizer or DEFAULT_OPTIMIZER)
    if lr_res.suggested_lr is None:
        recs["lr"] = Recommendation("lr", None, f"no lr suggested: {lr_res.message}", lr_ev, "low", "")
        recs["lr_scaling"] = Recommendation("lr_scaling", None, "no lr to scale (the range test gave none).",
                                            {"optimizer": opt_name}, "low", "")
    else:
        try:
            rule = scale_lr(lr_res.suggested_lr, from_batch=b_prof, to_batch=effective,
                            optimizer=opt_name, critical_batch=b_crit)
        except ConfigError as exc:
            rule = None
            scaling_msg = str(exc)
        lr_value = rule.lr if rule is not None else lr_res.suggested_lr
        if lr_res.ladder is not None:  # the sweep saw no fall: the ladder's rates decided
            reason = (f"LR range test at batch {b_prof} ({lr_res.optimizer}, {lr_res.steps} steps) saw no fall; "
                      f"the lr ladder at batch {b_prof} decided: {lr_res.ladder.message} "
                      f"[{lr_res.ladder.describe()}]")
            effect = f"the rate whose short training ended lowest, {lr_res.suggested_lr:.3g}"
        else:
            reason = (f"LR range test at batch {b_prof} ({lr_res.optimizer}, {lr_res.steps} steps): loss "
                      f"falls from {lr_res.min_lr:.2g}, smoothed minimum at {lr_res.lr_at_min_loss:.2g}, "
                      f"blows up after {lr_res.max_lr:.2g}; suggested {lr_res.suggested_lr:.3g}")
            effect = (f"a stable lr {math.log10((lr_res.max_lr or lr_value) / lr_res.suggested_lr):.1f} "
                      "decades below where the loss blows up")
        if rule is not None and effective != b_prof:
            reason += (f", scaled to batch {effective} by the {rule.rule} rule: {lr_value:.3g} (`proftune lr-find` "
                       f"runs the same test and prints the unscaled {lr_res.suggested_lr:.3g})")
        else:
            reason += " (the rate `proftune lr-find` suggests: the same test, at the same batch)"
        if lr_res.message and lr_res.ladder is None:
            reason += f" ({lr_res.message})"
        recs["lr"] = Recommendation("lr", lr_value, reason + ".", lr_ev,
                                    "medium" if lr_res.message is None or lr_res.ladder is not None else "low",
                                    effect)
        if rule is not None:
            recs["lr_scaling"] = Recommendation("lr_scaling", rule.rule, rule.reason, rule.to_dict(), "medium",
                                                f"lr x{rule.factor:.3g} for batch {b_prof} -> {effective}")
        else:
            recs["lr_scaling"] = Recommendation("lr_scaling", None, scaling_msg, {"optimizer": opt_name}, "low", "")

    # -- accumulation -----------------------------------------------------------------------------------------
    if accumulation is None:
        recs["grad_accumulation"] = Recommendation(
            "grad_accumulation", 1, "no memory budget: the target batch runs in one step.",
            {"target_batch": target}, "low", "")
    else:
        recs["grad_accumulation"] = Recommendation(
            "grad_accumulation", accumulation.steps, accumulation.reason,
            {**accumulation.to_dict(), "profile_step_ms": step.time_ms, "profile_batch_size": b_prof},
            "medium" if accumulation.step_ms is not None else "low",
            (f"effective batch {accumulation.effective_batch} at ~{accumulation.step_ms:.1f} ms per "
             f"optimizer step ({accumulation.samples_per_s:.0f} samples/s)") if accumulation.step_ms else "")

    # -- rules on the profile ------------------------------------------------------------------------------
    say("precision")
    recs["precision"] = checked_precision_row(precision_rule(prof), task, given, device=device, seed=seed,
                                              measure=bool(cfg.precision_check))
    recs["data_loading"] = data_loading_rule(prof)
    recs["bottleneck"] = bottleneck_rule(prof)

    recs.update(_more_rows(task, given, prof, lr_res, cfg, ddp_spec, b_prof=b_prof, budget=budget, max_batch=max_batch,
                           critical=b_crit, device=device, seed=seed, say=say))
    say("threads")
    recs["threads"] = _threads_row(task, given, b_prof, device=device, seed=seed, measure=bool(cfg.measure_threads))
    say("data loader workers")
    workers = num_workers_row(task, given, b_prof, threads=int(recs["threads"].value), device=device, seed=seed)
    if workers is not None:
        recs["num_workers"] = workers
        recs["data_loading"] = _measured_workers(recs["data_loading"], workers)
    names = RECOMMENDATION_NAMES + CONDITIONAL_NAMES
    return Recommendations(tuple(recs[name] for name in names if name in recs), profile=prof,
                           curves={"lr_range": lr_res.curve,
                                   "noise_scale": list(ns.history) if ns is not None else []})


def _epoch_cost(task: Task, params: TrainParams, batch: int, b_prof: int, data: DataBound | None, *,
                max_batch: int | None, user_batch: bool, device: torch.device, seed: int,
                say: Callable[[str], None]) -> tuple[int, str, BatchCost | None]:
    """A computed batch is a hypothesis: an epoch at it timed against the defaults' epoch. (the
    batch to use, what the reason adds, the timed cost): ``batch`` unchecked where it is the user's
    own target, or the data has no countable samples."""
    if data is None or user_batch:
        return batch, "", None
    say("batch cost")
    cost = bound_by_cost(batch, default_batch=b_prof, samples=data.samples,
                         timer=step_timer(task, params, device=device, seed=seed))
    if cost is None:
        return batch, "", None
    # never above what memory holds (a budget below the profiled batch's peak)
    return min(cost.batch, max_batch or cost.batch), cost.note(), cost


def _critical_row(ns: NoiseScaleResult | None, ns_lr: Any, *, micro: int,
                  small: int) -> tuple[int | None, Recommendation]:
    """The critical batch (None where not measured, or measured where the model was not learning)
    and its row (the noise scale measured at lr ``ns_lr``)."""
    b_crit = ns.critical_batch_size if ns is not None else None
    recs: dict[str, Recommendation] = {}
    learning, trend = ns.learning() if ns is not None else (False, "")
    ns_evidence = {k: v for k, v in ns.to_dict().items() if k not in ("history", "losses")} if ns is not None else {}
    ns_evidence.update(lr=ns_lr, learning=learning, loss_trend=trend)
    if ns is not None and b_crit is not None and not learning:
        # measured where the loss did not fall: the gradients of a plateau, not of its training
        b_crit = None
        at = f"{ns_lr:.3g}" if isinstance(ns_lr, (int, float)) else "the task's"
        recs["critical_batch_size"] = Recommendation(
            "critical_batch_size", None,
            f"not measured: the model was not learning at lr {at} ({trend}); the noise scale there "
            f"(B_simple {ns.b_simple:.1f}) is a plateau's, not the training's, so no batch is computed from it.",
            ns_evidence, "low", "")
    elif ns is None:
        recs["critical_batch_size"] = Recommendation(
            "critical_batch_size", None, "not measured (noise_steps=0: the time given held too few steps).",
            ns_evidence, "low", "")
    elif b_crit is None:
        recs["critical_batch_size"] = Recommendation(
            "critical_batch_size", None, "no step had full micro-batches to estimate the noise scale.",
            ns_evidence, "low", "")
    else:
        conf = "low" if ns.clipped_steps > ns.used_steps // 2 else "medium"
        at_lr = f" at lr {ns_lr:.3g}" if isinstance(ns_lr, float) else ""
        recs["critical_batch_size"] = Recommendation(
            "critical_batch_size", b_crit,
            f"gradient noise scale B_simple = tr(Σ)/|G|² = {ns.trace_sigma:.4g}/{ns.grad_sq_norm:.4g} "
            f"= {ns.b_simple:.1f}, measured over {ns.used_steps} steps of {micro}x{small} samples{at_lr} "
            "(EMA-smoothed); below it a bigger batch cuts the steps almost linearly, above it "
            "mostly adds compute. It grows as the loss falls: measure again later in training.",
            ns_evidence, conf,
            f"batches up to ~{b_crit} train in proportionally fewer steps (McCandlish et al. 2018)")

    return b_crit, recs["critical_batch_size"]


def _more_rows(task: Task, given: TrainParams, prof: Profile, lr_res: LRFindResult, cfg: RecommendConfig,
               ddp_spec: Any, *,
               b_prof: int, budget: int | None, max_batch: int | None, critical: int | None,
               device: torch.device, seed: int, say: Callable[[str], None]) -> dict[str, Recommendation]:
    """``optimizer`` always; ``embedding_dim`` for a model with embedding tables; ``ddp_batch_size``
    when asked about DDP."""
    out: dict[str, Recommendation] = {}
    say("optimizer comparison")
    out["optimizer"] = _optimizer_row(task, given, prof, lr_res, budget_s=float(cfg.optimizer_budget_s),
                                      batch_size=b_prof, memory_budget=budget, device=device, seed=seed)
    if cfg.embedding_budget_s > 0:
        from ._embedding import EmbeddingConfig, recommend_embedding_dim

        say("embedding tables")
        row = recommend_embedding_dim(task, given, device=device, profile=prof,
                                      config=EmbeddingConfig(budget_s=float(cfg.embedding_budget_s), seed=seed))
        if row is not None:
            out["embedding_dim"] = row
    if cfg.ddp is not None:
        say(f"ddp batch size ({cfg.ddp} ranks)")
        out["ddp_batch_size"] = _ddp_row((ddp_spec, cfg.ddp, float(cfg.ddp_share)), task, given, b_prof,
                                         max_batch=max_batch, critical=critical, device=device, seed=seed)
    return out


def _ddp_row(ddp: tuple[Any, int, float], task: Task, given: TrainParams, b_prof: int, *,
             max_batch: int | None, critical: int | None, device: torch.device, seed: int) -> Recommendation:
    from ._ddp import ddp_recommendation, measure_and_plan

    spec, nprocs, share = ddp
    samples = samples_per_epoch(task, given, batch_size=b_prof, stop_after=1 << 20)
    scaling, plan = measure_and_plan(spec, nprocs=nprocs, current=b_prof, params=given.params, share=share,
                                     max_batch=max_batch, critical_batch=critical, samples=samples or None,
                                     device="cuda" if device.type == "cuda" else "cpu", seed=seed)
    lr = None if given.lr is None else float(given.lr)
    return ddp_recommendation(scaling, plan, lr=lr, optimizer=given.optimizer or DEFAULT_OPTIMIZER,
                              critical_batch=critical)


def _optimizer_row(task: Task, given: TrainParams, prof: Profile, lr_res: LRFindResult, *,
                   budget_s: float, batch_size: int, memory_budget: int | None, device: torch.device,
                   seed: int) -> Recommendation:
    from ._optimizer import (
        SGD_MOMENTUM,
        CompareConfig,
        compare_optimizers,
        optimizer_recommendation,
    )

    current = (given.optimizer or DEFAULT_OPTIMIZER).lower()
    if budget_s <= 0:
        return Recommendation("optimizer", current, f"keep {current}: the comparison was skipped "
                              "(optimizer_budget_s=0).", {"current": current}, "low", "")
    same = current != "sgd" or float(given.momentum or 0.0) == SGD_MOMENTUM
    known = {current: lr_res} if same and lr_res.batch_size == batch_size else {}
    cfg = CompareConfig(budget_s=budget_s, batch_size=batch_size, memory_budget=memory_budget, seed=seed)
    comp = compare_optimizers(task, given, profile=prof, device=device, config=cfg, known_rates=known)
    return optimizer_recommendation(comp)


def _step_cost(prof: Profile) -> StepCost | None:
    s = prof.step
    if not s.time_ms or not prof.batch_size:
        return None
    per_batch = s.data_ms + s.forward_ms + s.backward_ms
    fixed = max(s.time_ms - per_batch, 0.0)
    if per_batch <= 0:
        per_batch, fixed = s.time_ms, 0.0
    return StepCost(batch_size=int(prof.batch_size), per_batch_ms=per_batch, fixed_ms=fixed)


__all__ = [
    "optimizer_family",
    "recommend",
]


def _measured_workers(row: Recommendation, workers: Recommendation) -> Recommendation:
    """The data-loading rule's advice with the measured ``num_workers`` in place of its rule of thumb."""
    if not isinstance(row.value, dict) or workers.value is None:
        return row
    value = {**row.value, "num_workers": workers.value}
    reason = row.reason.replace(f"num_workers={row.value.get('num_workers')}", f"num_workers={workers.value}")
    return dataclasses.replace(row, value=value, reason=reason + " (num_workers as measured: the num_workers row)",
                               evidence={**row.evidence, "num_workers_measured": workers.evidence["step_ms"]})


@dataclass(frozen=True)
class _LoaderWorkers(JsonRecord):
    """What can be said of the task's data loader's ``num_workers`` (the threads row's evidence)."""

    num_workers: int | None
    num_workers_note: str


def _loader_workers(task: Task, given: TrainParams, batch_size: int) -> _LoaderWorkers:
    loader = task.train_data(batch_size, given.params)
    if isinstance(loader, torch.utils.data.DataLoader):
        return _LoaderWorkers(loader.num_workers,
                              "the task's own value; the num_workers row measures each count on training steps")
    return _LoaderWorkers(None, f"not measured: the task's train_data is a {type(loader).__name__}, not a "
                          "DataLoader (batches from memory); it has no loader workers to set")


def _threads_row(task: Task, params: TrainParams, batch_size: int, *, device: torch.device,
                 seed: int, measure: bool = True) -> Recommendation:
    """The CPU thread count as the fit loop computes it (a fresh first measurement: a few of a
    short fit's steps at each count), with the measured step times; and what can be said of the
    data loader's ``num_workers``. ``measure=False``: the count the fit loop measured for this task
    in its last fit, where it remembers one (a slow model's measurement is seconds)."""
    from .. import _threads
    from ..train import fit

    workers = _loader_workers(task, params, batch_size).to_dict()
    known = None if measure else _threads.recall(_threads.fit_key(task, device.type))
    if known is not None:
        return Recommendation("threads", known[0], f"{known[0]} thread(s): the count the fit loop measured for "
                              "this task in its last training (not measured again here).",
                              {"source": "remembered", "max_threads": _threads.max_threads(), **workers}, "medium", "")
    _threads.forget()  # measure here and now, not an earlier fit's choice
    limit = _threads.max_threads()
    steps = 2 + 3 * len(_threads.candidate_counts(limit)) + 8
    result = fit(task, params, max_steps=steps, batch_size=batch_size, device=device, seed=seed, evaluate=False)
    choice = result.threads
    assert choice is not None
    evidence = {"step_ms": choice.step_ms, "candidates": choice.candidates, "max_threads": limit,
                "checks": [c.to_dict() for c in choice.checks], "source": choice.source, "steps": result.steps,
                "batch_size": batch_size, **workers}
    if choice.source == "user":
        return Recommendation("threads", choice.threads, f"kept the fixed {choice.threads} ({choice.given_by}).",
                              evidence, "high", "")
    times = ", ".join(f"{k} thread{'s' if k != '1' else ''} {v:.3g} ms" for k, v in
                      sorted(choice.step_ms.items(), key=lambda kv: int(kv[0])))
    if len(choice.candidates) < 2:
        return Recommendation("threads", choice.threads, f"one core for this process ({limit}): 1 thread.",
                              evidence, "high", "")
    skipped = sorted({c for check in choice.checks for c in check.skipped})
    waited = {k: v for check in choice.checks for k, v in check.wait_share.items()}
    why = ""
    if skipped:
        shares = ", ".join(f"{k} thread{'s' if k != '1' else ''} {v:.0%}" for k, v in sorted(waited.items()))
        held = {k: v for check in choice.checks for k, v in check.others.items()}
        others = ", ".join(f"{v:.3g} beside {k} thread{'s' if k != '1' else ''}" for k, v in sorted(held.items()))
        why = (f"; not measured: {', '.join(map(str, skipped))} threads (a smaller count was slower"
               + (f", or its steps waited for cores held by others: {shares} of the step" if shares else "")
               + (f", or other processes' runnable threads held the other cores: {others}" if others else "") + ")")
    return Recommendation(
        "threads", choice.threads,
        f"measured per step on this machine as loaded now: {times}{why}; the fit loop computes it again "
        f"for every training and re-checks when the step time drifts (--threads N fixes it).",
        evidence, "medium", f"{choice.threads} thread(s) per training on this machine's present load")
