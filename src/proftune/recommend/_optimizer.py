"""The optimizer by measurement: a short, equal-budget comparison through the fit loop.

AdamW and SGD with momentum each train from the same seeded start at their own range-test rate
for the same wall-clock share of the budget (the number of steps set from the profile's measured
step time, so that the comparison does not depend on the machine's load; a hard stop at 1.25
times the share, and at 1.25 times the budget for the whole comparison, guards the bound).
L-BFGS joins where the whole training set fits in one batch and a full-batch step fits the share:
the data is small and the loss deterministic, which is where a quasi-Newton method pays. The
winner is the lowest validation loss at the end of its share; the
task's own optimizer is kept unless another one beats it by more than ``KEEP_TOLERANCE`` and
beyond the noise of the paired per-batch validation losses.

The gradient-noise figures say why: the noise-to-signal ratio of mini-batch gradients and the
excess kurtosis of their noise (0 for Gaussian noise; heavy-tailed noise, large kurtosis, is
where adaptive methods beat SGD: Zhang et al. 2020, "Why are adaptive methods good for
attention models?"; Simsekli et al. 2019).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._device import move_to_device
from .._optimizers import DEFAULT_OPTIMIZER
from .._records import JsonRecord
from .._train_params import TrainParams, as_train_params
from ..profile import Profile
from ..task import Task, TaskWrapper
from ..train import Callback, FitState, build_optimizer, evaluate_model, fit, seed_everything
from ._full_batches import samples_per_epoch
from ._lr_find import LRFindResult, run_lr_range_test
from ._records import MeasuredEffect, Recommendation, keep_unless_better

__all__ = ["CompareConfig", "OptimizerComparison", "OptimizerTrial", "compare_optimizers", "gradient_noise",
           "optimizer_recommendation"]

#: Another optimizer replaces the task's only when its validation loss is lower by this fraction.
KEEP_TOLERANCE = 0.02
#: SGD's momentum in the comparison (the usual heavy-ball value).
SGD_MOMENTUM = 0.9
#: L-BFGS runs full-batch only below this many training samples (the seeds' rule of thumb).
LBFGS_MAX_SAMPLES = 1_000_000
#: Loss evaluations one L-BFGS step takes: torch's max_iter=20 iterations, ~1.25 evaluations
#: each under the strong-Wolfe line search.
LBFGS_EVALS_PER_STEP = 25
#: Fewer mini-batch steps than this in a share make the comparison meaningless.
MIN_STEPS = 10
#: ...and a range test shorter than this has no curve to read.
MIN_RANGE_STEPS = 20
#: Validation batch size of the per-batch losses that the paired noise test compares.
EVAL_BATCH = 16
#: Another optimizer must beat the task's by this many standard errors of the paired difference.
NOISE_SIGMAS = 2.0
#: A trial (and the whole comparison) is stopped at this multiple of its time.
HARD_STOP = 1.25
#: Points kept of each training curve (evidence, not the whole run).
CURVE_POINTS = 40


@dataclass(frozen=True)
class OptimizerTrial(JsonRecord):
    """One optimizer trained for its share of the budget: its settings, its cost and its result."""

    optimizer: str
    #: What it trained with: the optimizer, lr, momentum (SGD) and batch size.
    params: dict[str, str | float]
    lr_from: str
    steps: int
    samples: int
    time_s: float
    val_loss: float
    metrics: dict[str, float]
    stopped_by: str
    curve: list[dict[str, float]] = field(default_factory=list)
    #: The validation loss of each validation batch (the paired comparison's samples).
    batch_losses: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class OptimizerComparison(JsonRecord):
    """The trials, the choice and the gradient-noise figures, with the budget they ran under."""

    choice: str
    current: str
    trials: list[OptimizerTrial]
    noise: dict[str, float]
    budget_s: float
    share_s: float
    spent_s: float
    reason: str
    skipped: list[dict[str, str]] = field(default_factory=list)
    honours_param: bool = True

    def trial(self, name: str) -> OptimizerTrial | None:
        return next((t for t in self.trials if t.optimizer == name), None)


class _NamedOptimizer(TaskWrapper):
    """The task with the optimizer ``params['optimizer']`` names, for a task whose own
    ``configure_optimizer`` ignores that param (the comparison must run what it names)."""

    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        return build_optimizer(model.parameters(), params)


class Deadline(Callback):
    """Stops the fit loop ``seconds`` after it starts, and in any case at the clock time ``until``
    (``time.perf_counter()``), with ``reason``: the hard bounds of a trial and of the whole
    comparison, and of each training that sizes an embedding table."""

    def __init__(self, seconds: float, until: float = math.inf, *, reason: str = "time share spent") -> None:
        self.seconds = seconds
        self.until = until
        self.reason = reason
        self.end = math.inf
        self.hit = False

    def on_fit_start(self, state: FitState) -> None:
        self.end = min(time.perf_counter() + self.seconds, self.until)

    def on_step_end(self, state: FitState) -> None:
        if time.perf_counter() >= self.end:
            self.hit = True
            state.request_stop(self.reason)


def honours_optimizer_param(task: Task, params: TrainParams) -> bool:
    """Whether ``task.configure_optimizer`` builds the optimizer ``params['optimizer']`` names."""
    seed_everything(0)
    model = task.build_model(params.params)
    try:
        opt = task.configure_optimizer(model, {**params.params, "optimizer": "sgd", "momentum": SGD_MOMENTUM})
    finally:
        del model
    return isinstance(opt, torch.optim.SGD)


# -- gradient noise ------------------------------------------------------------------------------


def gradient_noise(task: Task, params: TrainParams, *, batch_size: int, batches: int = 16,
                   device: torch.device, seed: int = 0, max_coords: int = 1 << 18) -> dict[str, float]:
    """Mini-batch gradients at the seeded initial model: how noisy and how heavy-tailed.

    ``noise_to_signal`` = E|g_b − ḡ|² / |ḡ|² over ``batches`` mini-batches of ``batch_size``;
    ``kurtosis`` the excess kurtosis of the noise per coordinate (standardised, pooled over up to
    ``max_coords`` coordinates): 0 for Gaussian noise, large for heavy tails;
    ``norm_max_over_median`` the largest noise norm over the median one.
    """
    seed_everything(seed)
    model = task.build_model(params.params).to(device).train()
    grads: list[torch.Tensor] = []
    data = iter(task.train_data(batch_size, params.params))
    for _ in range(batches):
        batch = next(data, None)
        if batch is None:
            break
        model.zero_grad(set_to_none=True)
        task.loss(model, move_to_device(batch, device)).backward()
        flat = torch.cat([p.grad.detach().flatten().float() for p in model.parameters()
                          if p.grad is not None])
        if flat.numel() > max_coords:
            flat = flat[:: math.ceil(flat.numel() / max_coords)]
        grads.append(flat.double().cpu())
    del model
    if len(grads) < 4:
        return {"batches": float(len(grads))}
    g = torch.stack(grads)
    mean = g.mean(0)
    noise = g - mean
    norms = noise.norm(dim=1)
    var = noise.pow(2).mean(0)
    keep = var > 0
    z4 = (noise[:, keep].pow(4).mean(0) / var[keep].pow(2)) if bool(keep.any()) else torch.zeros(1)
    signal = float(mean.pow(2).sum())
    return {"batches": float(len(grads)), "batch_size": float(batch_size),
            "noise_to_signal": float(norms.pow(2).mean()) / signal if signal > 0 else math.inf,
            "kurtosis": float(z4.mean()) - 3.0,
            "norm_max_over_median": float(norms.max() / norms.median()) if float(norms.median()) > 0 else math.inf}


# -- the comparison ------------------------------------------------------------------------------


def _val_loss(metrics: dict[str, float], result_curve: Sequence[Mapping[str, float]]) -> float:
    if "val_loss" in metrics and math.isfinite(metrics["val_loss"]):
        return float(metrics["val_loss"])
    losses = [float(r["loss"]) for r in result_curve]
    tail = losses[-max(1, len(losses) // 10):]
    return sum(tail) / len(tail) if tail and all(math.isfinite(v) for v in tail) else math.inf


def _curve(steps: Sequence[Mapping[str, float]], step_s: float) -> list[dict[str, float]]:
    every = max(1, math.ceil(len(steps) / CURVE_POINTS))
    samples = 0
    out = []
    for i, row in enumerate(steps):
        samples += int(row.get("samples") or 0)
        if i % every == 0 or i == len(steps) - 1:
            out.append({"step": float(row["step"]), "samples": float(samples), "loss": float(row["loss"]),
                        "time_s": round((i + 1) * step_s, 4)})
    return out


def _trial(task: Task, params: TrainParams, *, name: str, lr_from: str, steps: int,
           hard_stop_s: float | None, until: float, batch_size: int, device: torch.device,
           seed: int) -> OptimizerTrial:
    deadline = Deadline(hard_stop_s if hard_stop_s is not None else math.inf, until)
    started = time.perf_counter()
    result = fit(task, params, max_steps=steps, batch_size=batch_size, device=device, seed=seed,
                 callbacks=[deadline], evaluate=False, stop_on_nan=True)
    spent = time.perf_counter() - started
    diverged = any(not math.isfinite(float(r["loss"])) for r in result.curves["step"])
    metrics = {} if diverged else evaluate_model(task, result.model, torch.device(device), batch_size)
    loss = math.inf if diverged else _val_loss(metrics, result.curves["step"])
    per_batch = [] if diverged or "val_loss" not in metrics else _batch_losses(task, result.model, device)
    stopped = "diverged" if diverged else ("time" if deadline.hit else "budget")
    step_s = spent / max(1, result.steps)
    given = params.params
    return OptimizerTrial(optimizer=name, params={k: given[k] for k in ("optimizer", "lr", "momentum")
                                                  if k in given} | {"batch_size": batch_size},
                          lr_from=lr_from, steps=result.steps, samples=result.samples, time_s=spent,
                          val_loss=loss, metrics=metrics, stopped_by=stopped,
                          curve=_curve(result.curves["step"], step_s), batch_losses=per_batch)


@torch.no_grad()
def _batch_losses(task: Task, model: nn.Module, device: torch.device) -> list[float]:
    """The task's validation loss on each validation batch of ``EVAL_BATCH`` samples."""
    model.eval()
    out = []
    for batch in task.val_data(EVAL_BATCH):
        value = task.evaluate(model, [move_to_device(batch, device)]).get("val_loss")
        if value is not None:
            out.append(float(value))
    return out


@dataclass(frozen=True)
class CompareConfig:
    """How long and on what the comparison runs (see :func:`compare_optimizers`)."""

    budget_s: float = 4.0
    #: Seconds of training each optimizer gets, as predicted from the profile's step time (its
    #: steps are set from it); default: what ``budget_s`` leaves after the range tests, shared
    #: out, with a hard stop at 1.25 times that. Given, the comparison does not depend on the load.
    share_s: float | None = None
    batch_size: int = 32
    lr_steps: int = 50
    noise_batches: int = 16
    memory_budget: int | None = None
    seed: int = 0


def _lbfgs_fit(task: Task, params: TrainParams, prof: Profile, cfg: CompareConfig,
               share_s: float, device: torch.device) -> tuple[int, int, str | None]:
    """``(samples, steps, None)`` when full-batch L-BFGS fits the data, memory and the share;
    otherwise ``(samples, 0, why not)``."""
    n = samples_per_epoch(task, params, batch_size=cfg.batch_size, stop_after=LBFGS_MAX_SAMPLES)
    if n > LBFGS_MAX_SAMPLES:
        return n, 0, f"more than {LBFGS_MAX_SAMPLES:,} training samples: not a full-batch problem"
    b = max(1, int(prof.batch_size or cfg.batch_size))
    m = prof.memory
    static = m.params_bytes + m.grads_bytes + m.optimizer_bytes
    per_sample = max(0.0, (m.peak_bytes - static) / b) if m.peak_bytes else 0.0
    need = static + per_sample * n
    limit = cfg.memory_budget
    if limit is None and device.type == "cuda":
        limit = int(torch.cuda.mem_get_info(device)[0])
    if limit is None:
        limit = _cpu_memory_limit()
    if limit and need > limit:
        return n, 0, (f"one full batch of {n} samples needs ~{need / 2**20:.0f} MiB (memory model from the "
                      f"profile), above the {limit / 2**20:.0f} MiB available")
    s = prof.step
    eval_ms = (s.data_ms + s.forward_ms + s.backward_ms or s.time_ms) * n / b
    step_s = LBFGS_EVALS_PER_STEP * eval_ms / 1e3
    if step_s <= 0 or step_s > share_s:
        return n, 0, (f"one L-BFGS step on the full batch ({LBFGS_EVALS_PER_STEP} evaluations of ~"
                      f"{eval_ms:.1f} ms, linear in the batch from the profile) would take {step_s:.2f} s, "
                      f"beyond the {share_s:.2f} s share")
    return n, max(1, int(share_s / step_s)), None


def _cpu_memory_limit() -> int | None:
    """A quarter of the memory available on this machine (the comparison must not crowd it)."""
    try:
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4)
    except (ValueError, OSError, AttributeError):
        return None


def compare_optimizers(task: Task, params: TrainParams | Mapping[str, Any], *, profile: Profile, device: torch.device,
                       config: CompareConfig | None = None,
                       known_rates: dict[str, LRFindResult] | None = None) -> OptimizerComparison:
    """Train AdamW, SGD+momentum (and full-batch L-BFGS where it fits) for equal shares of
    ``config.budget_s`` seconds, each at its own range-test rate; the best validation loss wins.

    ``known_rates`` maps an optimizer name to a range test already run at this batch (``recommend``
    passes its own), which is then not run again.
    """
    cfg = config or CompareConfig()
    given = as_train_params(task, params)  # validated once: each trial takes the record
    started = time.perf_counter()
    # the whole comparison stops here at the latest (trials and range tests), unless a share is given
    until = started + HARD_STOP * cfg.budget_s if cfg.share_s is None else math.inf
    current = str(given.optimizer or DEFAULT_OPTIMIZER).lower()
    honours = honours_optimizer_param(task, given)
    runner: Task = task if honours else _NamedOptimizer(task)
    b = int(cfg.batch_size)
    s = profile.step
    step_ms = float(s.time_ms or 0.0) * b / max(1, int(profile.batch_size or b))
    noise = gradient_noise(runner, given, batch_size=b, batches=cfg.noise_batches, device=device, seed=cfg.seed)

    # a range test the caller ran through the task's own optimizer counts only where the task
    # builds the optimizer its params name
    rates: dict[str, LRFindResult] = dict(known_rates or {}) if honours else {}
    settings: dict[str, dict[str, str | float]] = {"adamw": {"optimizer": "adamw"},
                                                  "sgd": {"optimizer": "sgd", "momentum": SGD_MOMENTUM}}
    if current not in settings and current != "lbfgs":
        settings[current] = {"optimizer": current}
    skipped: list[dict[str, str]] = []
    n_candidates = len(settings) + 1  # + L-BFGS, decided below within its share
    missing = [name for name in settings if name not in rates]
    # a range test gets the time of one trial at most; too few steps there and nothing is compared
    test_s = cfg.budget_s / (len(missing) + n_candidates)
    test_steps = min(cfg.lr_steps, int(test_s * 1e3 / step_ms)) if step_ms > 0 else 0
    if missing and cfg.share_s is None and test_steps < MIN_RANGE_STEPS:
        reason = (f"the {cfg.budget_s:g} s budget leaves {test_s:.2f} s for each range test, {test_steps} steps "
                  f"of {step_ms:.1f} ms (at least {MIN_RANGE_STEPS} needed): raise the optimizer budget")
        return OptimizerComparison(choice=current, current=current, trials=[], noise=noise,
                                   budget_s=cfg.budget_s, share_s=0.0, spent_s=time.perf_counter() - started,
                                   reason=reason, skipped=skipped, honours_param=honours)
    for name in missing:
        rates[name] = run_lr_range_test(
            runner, given.with_params(**settings[name]), steps=cfg.lr_steps if cfg.share_s is not None else test_steps,
            batch_size=b, device=device, seed=cfg.seed,
            callbacks=[Deadline(HARD_STOP * test_s, until)] if cfg.share_s is None else ())
    share = cfg.share_s if cfg.share_s is not None else max(
        0.0, (cfg.budget_s - (time.perf_counter() - started)) / n_candidates)
    hard_stop = None if cfg.share_s is not None else HARD_STOP * share
    steps = int(share * 1e3 / step_ms) if step_ms > 0 else 0
    trials: list[OptimizerTrial] = []
    if steps < MIN_STEPS:
        reason = (f"the {cfg.budget_s:g} s budget leaves {share:.2f} s per optimizer, {steps} steps of "
                  f"{step_ms:.1f} ms (at least {MIN_STEPS} needed): raise the optimizer budget")
        return OptimizerComparison(choice=current, current=current, trials=[], noise=noise,
                                   budget_s=cfg.budget_s, share_s=share, spent_s=time.perf_counter() - started,
                                   reason=reason, skipped=skipped, honours_param=honours)
    for name, extra in settings.items():
        rate = rates[name].suggested_lr
        if rate is None:
            skipped.append({"optimizer": name, "why": f"its range test gave no rate ({rates[name].message})"})
            continue
        trials.append(_trial(runner, given.with_params(**extra, lr=rate), name=name,
                             lr_from=f"range test at batch {b}: {rate:.3g}", steps=steps, hard_stop_s=hard_stop,
                             until=until, batch_size=b, device=device, seed=cfg.seed))
    n, lb_steps, why_not = _lbfgs_fit(runner, given, profile, cfg, share, device)
    if why_not is None:
        trials.append(_trial(runner, given.with_params(optimizer="lbfgs", lr=1.0), name="lbfgs",
                             lr_from="lr 1 with the strong-Wolfe line search (the search sets the step)",
                             steps=lb_steps, hard_stop_s=hard_stop, until=until, batch_size=n,
                             device=device, seed=cfg.seed))
    else:
        skipped.append({"optimizer": "lbfgs", "why": why_not})
    choice, reason = _choose(trials, current)
    return OptimizerComparison(choice=choice, current=current, trials=trials, noise=noise,
                               budget_s=cfg.budget_s, share_s=share, spent_s=time.perf_counter() - started,
                               reason=reason, skipped=skipped, honours_param=honours)


def paired_gain(mine: OptimizerTrial, other: OptimizerTrial) -> tuple[float, float | None]:
    """How much lower ``other``'s validation loss is than ``mine``'s, and the standard error of
    that difference over the validation batches both were scored on (None with fewer than 3)."""
    a, b = mine.batch_losses, other.batch_losses
    gain = mine.val_loss - other.val_loss
    if len(a) < 3 or len(a) != len(b):
        return gain, None
    d = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d)
    var = sum((v - mean) ** 2 for v in d) / (len(d) - 1)
    return gain, math.sqrt(var / len(d))


def _choose(trials: list[OptimizerTrial], current: str) -> tuple[str, str]:
    """The lowest validation loss; the task's own optimizer unless beaten by more than
    ``KEEP_TOLERANCE`` of its loss and beyond noise (``NOISE_SIGMAS`` standard errors of the
    paired per-batch difference, where there are enough validation batches)."""
    finite = [t for t in trials if math.isfinite(t.val_loss)]
    if not finite:
        return current, "every optimizer diverged or gave no validation loss: keep the task's"
    best = min(finite, key=lambda t: t.val_loss)
    mine = next((t for t in finite if t.optimizer == current), None)
    table = ", ".join(f"{t.optimizer} {t.val_loss:.4g}" for t in sorted(trials, key=lambda t: t.val_loss))
    if mine is None:
        return best.optimizer, f"validation loss after equal time: {table}"
    if best.optimizer == current:
        return current, f"the task's {current} is best after equal time ({table})"
    gain, se = paired_gain(mine, best)
    noise = (f"±{se:.2g} (paired over {len(mine.batch_losses)} validation batches)" if se is not None
             else "(no noise estimate)")
    beyond = se is None or gain > NOISE_SIGMAS * se
    if best.val_loss < mine.val_loss * (1 - KEEP_TOLERANCE) and beyond:
        return best.optimizer, (f"{best.optimizer} ends {gain / mine.val_loss:.0%} below the task's {current} "
                                f"after equal time, {gain:.3g} {noise} ({table})")
    return current, (f"{best.optimizer} beats the task's {current} by {gain:.3g} {noise}: within "
                     f"{KEEP_TOLERANCE:.0%} or {NOISE_SIGMAS:g} standard errors, not worth a change ({table})")


def optimizer_recommendation(comp: OptimizerComparison) -> Recommendation:
    """The ``optimizer`` row: the choice, the trials' curves and the noise figures as evidence."""
    evidence = comp.to_dict()
    chosen = comp.trial(comp.choice)
    mine = comp.trial(comp.current)
    evidence["params"] = dict(chosen.params) if chosen is not None else {"optimizer": comp.current}
    if not comp.trials:
        return keep_unless_better(
            Recommendation("optimizer", comp.current, f"{comp.reason}.", evidence, "low", ""), comp.current,
            inconclusive="no optimizer trained long enough to be compared",
            would_decide=(f"a larger optimizer_budget_s (each range test needs {MIN_RANGE_STEPS} steps and each "
                          f"optimizer {MIN_STEPS} steps, at the profiled step time)"))
    noise = comp.noise
    heard = ""
    if "kurtosis" in noise:
        tails = "heavy-tailed" if noise["kurtosis"] > 3.0 else "near-Gaussian"
        heard = (f" Gradient noise at the start: noise/signal {noise['noise_to_signal']:.3g}, excess "
                 f"kurtosis {noise['kurtosis']:.2f} ({tails}; heavy tails favour adaptive methods).")
    skipped = "".join(f" {s['optimizer']} not run: {s['why']}." for s in comp.skipped)
    note = "" if comp.honours_param else (
        " The task's configure_optimizer ignores params['optimizer']: the comparison built each "
        "optimizer itself; use the choice in the task's own code.")
    reason = (f"{comp.reason}; each trained {comp.share_s:.2f} s from the same seeded start at its own "
              f"rate.{heard}{skipped}{note}")
    margin = (1 - chosen.val_loss / mine.val_loss) if chosen and mine and mine.val_loss > 0 else 0.0
    confidence = "medium" if comp.choice != comp.current and margin > 0.1 else "low"
    if comp.choice == comp.current and len(comp.trials) > 1:
        confidence = "medium"
    effect = ""
    if chosen is not None:
        effect = f"validation loss {chosen.val_loss:.4g} after {chosen.time_s:.2f} s"
        if mine is not None and mine is not chosen:
            effect += f" against {mine.val_loss:.4g} for {comp.current} ({margin:.0%} lower)"
    row = Recommendation("optimizer", comp.choice, reason, evidence, confidence, effect)
    if chosen is None or comp.choice == comp.current:
        return row
    if mine is None:  # the task's own optimizer has no figure beside the other's: nothing is compared
        why = next((x["why"] for x in comp.skipped if x["optimizer"] == comp.current), "it was not trained")
        return keep_unless_better(
            row, comp.current, inconclusive=f"the task's {comp.current} has no validation loss to compare ({why})",
            would_decide=f"a range test of {comp.current} that finds a rate (a wider min_lr..max_lr), "
            "then the comparison")
    _, se = paired_gain(mine, chosen)
    tie = max(KEEP_TOLERANCE * abs(mine.val_loss), NOISE_SIGMAS * se if se is not None else 0.0)
    return keep_unless_better(row, comp.current, effect=MeasuredEffect("val_loss", mine.val_loss, chosen.val_loss,
                                                                      False, tie=tie))
