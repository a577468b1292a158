"""The learning-rate range test: an exponential lr sweep through the fit loop, and its reading.

The sweep is a :class:`proftune.train.Callback` that sets the lr before each step and stops the
loop when the smoothed loss diverges; no private training loop. The reading
(:func:`suggest_lr`) is a pure function of the curve so that it can be tested on synthetic,
noisy curves.

Why not the steepest slope: the derivative of a noisy loss curve amplifies the noise, so the
steepest point jumps across decades between runs (Lightning-AI/pytorch-lightning#21141,
davidtvs/pytorch-lr-finder#106). We smooth the curve without lag (running median, then a
centred Gaussian), take the lr of the smoothed minimum, which moves little under noise, and
suggest one decade below it, clamped into the region where the loss falls.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from .._optimizers import DEFAULT_LR
from .._paths import replacing
from .._records import mapping, record_fields, stored_version
from .._train_params import TrainParams, as_train_params
from ..exceptions import ConfigError, DependencyError, ProblemCollector
from ..task import ClassificationTask, Task, TaskWrapper, load_task
from ..train import Callback, FitState, fit
from ._lr_ladder import LadderResult, run_lr_ladder

#: The suggestion sits this many times below the lr of the smoothed minimum (one decade:
#: Smith 2017, fastai's ``minimum/10``); clamped into the descending region.
SUGGEST_FACTOR = 10.0
#: Labels read, at most, to estimate a classification task's chance-level loss.
CHANCE_SAMPLES = 1 << 15


def chance_loss(task: Task, given: TrainParams, batch_size: int) -> float | None:
    """The training loss of the best constant prediction, where it is known: for a task whose loss is
    :class:`~proftune.ClassificationTask`'s cross-entropy, the entropy of its training labels (ln 10
    for ten balanced classes). None for any other loss. A loss that falls only to it has learned the
    labels' frequencies, not the inputs (a plateau-start CNN's loss from 3.64 back to 2.30)."""
    inner = task
    while isinstance(inner, TaskWrapper) and type(inner).loss is TaskWrapper.loss:
        inner = inner.inner
    if not isinstance(inner, ClassificationTask) or type(inner).loss is not ClassificationTask.loss:
        return None
    counts: dict[int, int] = {}
    seen = 0
    try:
        for batch in task.train_data(batch_size, given.params):
            y = batch[1] if isinstance(batch, (tuple, list)) and len(batch) == 2 else None
            if not isinstance(y, torch.Tensor) or y.dtype not in (torch.int64, torch.int32) or y.dim() != 1:
                return None  # soft or multi-dimensional targets: no one constant prediction to read
            for label, n in zip(*torch.unique(y, return_counts=True), strict=True):
                counts[int(label)] = counts.get(int(label), 0) + int(n)
            seen += int(y.numel())
            if seen >= CHANCE_SAMPLES:
                break
    except (TypeError, ValueError, IndexError):
        return None
    if seen < 2:
        return None
    return float(-sum((n / seen) * math.log(n / seen) for n in counts.values()))


@dataclass(frozen=True)
class _CurvePoint:
    """One point of the range test's curve as JSON holds it: the lr, the loss and its smoothing."""

    lr: float
    loss: float | None
    smoothed: float | None


#: Bumped when a field of :class:`LRFindResult`'s JSON changes meaning.
LR_FIND_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class LRFindResult:
    """What a range test measured and what it suggests.

    ``suggested_lr`` is None when the curve does not allow a suggestion; ``message`` says why
    (the loss diverged from the first step, or never fell), or gives a caveat.

    A frozen, versioned record: :func:`proftune.recommend.lr_find` builds it, its ``lr_find`` Run
    holds :meth:`to_dict` (the curve in the Run's curves, as ``lr_range``), and the report reads it
    back through :meth:`from_dict`.
    """

    suggested_lr: float | None
    #: Where the smoothed loss starts to fall.
    min_lr: float | None
    #: The last lr before the smoothed loss blows up (loses half of its drop again).
    max_lr: float | None
    #: The lr at the minimum of the smoothed loss.
    lr_at_min_loss: float | None
    lrs: tuple[float, ...]
    losses: tuple[float, ...]
    smoothed: tuple[float, ...]
    diverged: bool
    stop_reason: str | None
    message: str | None
    start_lr: float
    end_lr: float
    steps_planned: int
    batch_size: int
    optimizer: str
    rule: str = f"lr of the smoothed minimum / {SUGGEST_FACTOR:g}, clamped to the descending region"
    #: The loss of a model that predicts the labels' frequencies (None: not known), which the ladder reads.
    chance_loss: float | None = None
    #: The lr ladder that decided where the sweep saw no fall (None: the sweep decided, or no ladder ran).
    ladder: LadderResult | None = None
    #: The Run this test was recorded as (with ``store=``).
    run_id: int | None = None
    schema_version: int = LR_FIND_SCHEMA_VERSION

    @property
    def steps(self) -> int:
        """Steps run (fewer than planned when the loss diverged)."""
        return len(self.lrs)

    @property
    def curve(self) -> list[dict[str, float]]:
        """The sweep as points: each step's lr, loss and smoothed loss."""
        return [{"lr": lr, "loss": loss, "smoothed": sm}
                for lr, loss, sm in zip(self.lrs, self.losses, self.smoothed, strict=True)]

    def to_dict(self) -> dict[str, object]:
        return {
            "suggested_lr": self.suggested_lr,
            "min_lr": self.min_lr,
            "max_lr": self.max_lr,
            "lr_at_min_loss": self.lr_at_min_loss,
            "diverged": self.diverged,
            "stop_reason": self.stop_reason,
            "message": self.message,
            "rule": self.rule,
            "start_lr": self.start_lr,
            "end_lr": self.end_lr,
            "steps": self.steps,
            "steps_planned": self.steps_planned,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "run_id": self.run_id,
            "curve": self.curve,
            **({"extra": {"chance_loss": self.chance_loss}} if self.chance_loss is not None else {}),
            **({"ladder": self.ladder.to_dict()} if self.ladder is not None else {}),
            "schema_version": self.schema_version,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> LRFindResult:
        """The record back from :meth:`to_dict`'s JSON: an ``lr_find`` Run's result with its
        ``lr_range`` curve as ``curve`` (a point's null loss, once NaN, reads as NaN)."""
        what = "an LR range test"
        stored_version(d, what=what, current=LR_FIND_SCHEMA_VERSION)
        points = d.get("curve")
        if not isinstance(points, list):
            raise ConfigError(f"{what} needs its curve (a list of {{lr, loss, smoothed}}), but got curve={points!r}.")
        curve = [record_fields(_CurvePoint, p, what=f"{what}'s curve point") for p in points]

        def column(key: str) -> tuple[float, ...]:
            return tuple(float("nan") if p[key] is None else float(p[key]) for p in curve)

        kw = record_fields(cls, {k: v for k, v in d.items() if k != "curve"}, what=what, derived=("steps", "extra"),
                           exclude=("lrs", "losses", "smoothed"))
        kw["chance_loss"] = mapping(d.get("extra") or {}, what=f"{what}'s extra").get("chance_loss")
        if kw.get("ladder") is not None:
            kw["ladder"] = LadderResult.from_dict(kw["ladder"])
        return cls(**kw, lrs=column("lr"), losses=column("loss"), smoothed=column("smoothed"))


    def plot(self, path: str | Path) -> Path:
        """Write the curve (raw and smoothed loss over log lr, with the marks) as a PNG."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - matplotlib is in the report extra
            raise DependencyError(
                "plotting the curve (plot=) needs matplotlib: pip install 'proftune[report]'.") from exc
        out = Path(path)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        try:
            finite = [v if math.isfinite(v) else np.nan for v in self.losses]
            ax.plot(self.lrs, finite, color="0.7", lw=1, label="loss")
            ax.plot(self.lrs, self.smoothed, color="C0", lw=2, label="smoothed")
            marks = [("min_lr", self.min_lr, "C2"), ("max_lr", self.max_lr, "C3"),
                     ("suggested_lr", self.suggested_lr, "C1")]
            for label, value, color in marks:
                if value is not None:
                    ax.axvline(value, color=color, ls="--", lw=1.2, label=f"{label} {value:.2g}")
            ax.set_xscale("log")
            ax.set_xlabel("learning rate")
            ax.set_ylabel("training loss")
            title = f"LR range test ({self.optimizer}, batch {self.batch_size})"
            ax.set_title(title if self.message is None else f"{title}\n{self.message}", fontsize=9)
            sm = np.asarray(self.smoothed, dtype=float)
            if np.isfinite(sm).any():
                lo, hi = np.nanmin(sm), np.nanmax(sm[: max(3, len(sm) // 10)])
                span = max(hi - lo, 1e-6)
                ax.set_ylim(lo - 0.2 * span, hi + 0.6 * span)
            ax.legend(fontsize=8)
            fig.tight_layout()
            with replacing(out) as tmp:
                fig.savefig(tmp, dpi=110)
        finally:
            plt.close(fig)
        return out


# -- reading a curve ----------------------------------------------------------------------------


def smooth_curve(losses: np.ndarray) -> np.ndarray:
    """Lag-free smoothing: running median (kills spikes), then a centred Gaussian (kills jitter).

    Window sizes grow with the number of points (median over ~1/10 of them, Gaussian sigma
    ~1/40), so a 100-step test is smoothed over about a quarter of a decade on each side.
    """
    y = np.asarray(losses, dtype=float)
    n = len(y)
    if n < 3:
        return cast("np.ndarray[tuple[Any, ...], np.dtype[Any]]", y.copy())
    half = max(1, n // 20)
    med = np.array([np.median(y[max(0, i - half): i + half + 1]) for i in range(n)])
    sigma = max(1.0, n / 40)
    radius = int(3 * sigma)
    offsets = np.arange(-radius, radius + 1)
    kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
    out = np.empty(n)
    for i in range(n):
        idx = i + offsets
        ok = (idx >= 0) & (idx < n)
        out[i] = float(np.sum(kernel[ok] * med[idx[ok]]) / np.sum(kernel[ok]))
    return out


@dataclass(frozen=True)
class CurveReading:
    """The marks read off a range-test curve (see :func:`suggest_lr`)."""

    suggested_lr: float | None
    min_lr: float | None
    max_lr: float | None
    lr_at_min_loss: float | None
    smoothed: np.ndarray
    message: str | None


def suggest_lr(lrs: Any, losses: Any, *, diverged: bool = False, factor: float = SUGGEST_FACTOR,
               chance: float | None = None) -> CurveReading:
    """Read a range-test curve: where the loss starts to fall, its minimum, where it blows up.

    ``suggested_lr`` is the lr of the smoothed minimum divided by ``factor``, clamped into
    ``[min_lr, lr_at_min_loss]``; when that region is narrower than ``factor``, its geometric
    middle. No suggestion when the loss rose from the first step or never fell significantly
    (significance: a drop larger than both 2% of the start level and 3 noise standard errors),
    or fell only to ``chance`` (the best constant prediction's loss, where known) within that margin.
    """
    lr = np.asarray(lrs, dtype=float)
    raw = np.asarray(losses, dtype=float)
    finite = np.isfinite(raw)
    # the curve ends at its first non-finite loss: what follows is divergence
    end = int(np.argmin(finite)) if not finite.all() else len(raw)
    lr, y = lr[:end], raw[:end]
    n = len(y)
    if n < 5:
        smoothed = smooth_curve(y) if n else np.array([])
        full = np.concatenate([smoothed, np.full(len(raw) - n, np.nan)])
        reason = ("the loss was not finite after "
                  f"{n} step(s) (lr {lr[-1]:.3g})" if n else "the loss was not finite from the first step")
        return CurveReading(None, None, None, None, full,
                            f"the loss diverged from the first steps: {reason}; lower min_lr "
                            f"(it was {float(np.asarray(lrs, dtype=float)[0]):.3g}).")
    sm = smooth_curve(y)
    full_sm = np.concatenate([sm, np.full(len(raw) - n, np.nan)])
    head = max(2, n // 20)
    start_level = float(np.median(y[:head]))
    i_min = int(np.argmin(sm))
    drop = start_level - float(sm[i_min])
    resid = y - sm
    noise = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
    window = 2 * max(1, n // 20) + 1
    margin = max(0.02 * abs(start_level), 3.0 * noise / math.sqrt(window), 1e-12)
    significant = drop > margin
    if significant and chance is not None and float(sm[i_min]) > chance - max(0.02 * chance,
                                                                             3.0 * noise / math.sqrt(window)):
        return CurveReading(None, None, None, None, full_sm,
                            f"the loss fell from {start_level:.4g} only to {float(sm[i_min]):.4g}, chance level "
                            f"(the best constant prediction's loss is {chance:.4g}): it learned the labels' "
                            "frequencies, not the inputs, so no rate is read off it.")
    # blows up: first point after the minimum where the smoothed loss has lost half its drop
    above = np.nonzero(sm[i_min:] > float(sm[i_min]) + 0.5 * max(drop, 0.0))[0]
    i_blow = i_min + int(above[0]) if len(above) else None
    max_lr = float(lr[i_blow - 1]) if i_blow is not None and i_blow > 0 else float(lr[-1])
    blew_up = diverged or end < len(raw)  # a larger max_lr would only blow up sooner
    if not significant:
        rose = float(sm[-1]) > start_level or blew_up
        if i_min <= max(head, n // 10) and rose:
            msg = (f"the loss rose from the first step (start lr {lr[0]:.3g}, smoothed loss "
                   f"{start_level:.4g} -> {float(sm[-1]):.4g}): the range starts above the largest "
                   "stable lr; lower min_lr.")
        elif blew_up:
            msg = (f"the loss did not fall over lr {lr[0]:.3g}..{lr[-1]:.3g} before it blew up (drop "
                   f"{drop:.3g}, noise {noise:.3g}); lower min_lr or run more steps below lr {lr[-1]:.3g}.")
        else:
            msg = (f"the loss did not fall over lr {lr[0]:.3g}..{lr[-1]:.3g} (drop {drop:.3g}, "
                   f"noise {noise:.3g}); raise max_lr or run more steps.")
        return CurveReading(None, None, None, None, full_sm, msg)
    # starts to fall: after the last point before the minimum still within 10% of the start
    # (scanning back from the minimum, so an early dip of the noise does not count)
    level = start_level - 0.1 * drop
    still_high = np.nonzero(sm[:i_min] >= level)[0]
    i_fall = int(still_high[-1]) + 1 if len(still_high) else 0
    # the minimum: the middle (in log lr) of the band around the argmin within 10% of the drop,
    # which moves less under noise than the argmin of a flat-bottomed valley
    near = sm <= float(sm[i_min]) + 0.1 * drop
    lo = hi = i_min
    while lo > 0 and near[lo - 1]:
        lo -= 1
    while hi < n - 1 and near[hi + 1]:
        hi += 1
    lr_min = math.sqrt(float(lr[lo]) * float(lr[hi]))
    min_lr = min(float(lr[i_fall]), lr_min)
    if lr_min / min_lr >= factor:
        suggestion = lr_min / factor
    else:
        suggestion = math.sqrt(lr_min * min_lr)
    note = None
    if i_min >= n - 2 and not blew_up:
        note = (f"the loss was still falling at the end of the range (lr {lr[-1]:.3g}); the "
                "suggestion is a lower bound: raise max_lr to see the minimum.")
    return CurveReading(suggestion, min_lr, max_lr, lr_min, full_sm, note)


# -- running a range test -------------------------------------------------------------------------


class LRRangeCallback(Callback):
    """Sets an exponentially growing lr before each step; stops when the loss diverges.

    Divergence: a non-finite loss, or the bias-corrected EMA of the loss above
    ``diverge_factor`` times its best value (fastai's and torch-lr-finder's rule).
    """

    def __init__(self, lrs: np.ndarray, *, beta: float = 0.9, diverge_factor: float = 4.0,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        self.lrs = lrs
        self.beta = beta
        self.diverge_factor = diverge_factor
        self.optimizer = optimizer
        self.seen_lrs: list[float] = []
        self.losses: list[float] = []
        self.diverged = False
        self._avg = 0.0
        self._best = math.inf

    def on_fit_start(self, state: FitState) -> None:
        if self.optimizer is not None:
            state.optimizer = self.optimizer  # test the caller's own optimizer

    def on_step_start(self, state: FitState) -> None:
        assert state.optimizer is not None
        lr = float(self.lrs[min(state.step, len(self.lrs) - 1)])
        for group in state.optimizer.param_groups:
            group["lr"] = lr

    def on_step_end(self, state: FitState) -> None:
        loss = float(state.loss) if state.loss is not None else math.nan
        self.seen_lrs.append(float(self.lrs[min(state.step - 1, len(self.lrs) - 1)]))
        self.losses.append(loss)
        if not math.isfinite(loss):
            self.diverged = True
            state.request_stop(f"loss became {loss} at lr {self.seen_lrs[-1]:.3g}")
            return
        self._avg = self.beta * self._avg + (1 - self.beta) * loss
        smoothed = self._avg / (1 - self.beta ** len(self.losses))
        self._best = min(self._best, smoothed)
        if len(self.losses) > 1 and self._best > 0 and smoothed > self.diverge_factor * self._best:
            self.diverged = True
            state.request_stop(f"smoothed loss {smoothed:.4g} > {self.diverge_factor:g} x best "
                               f"{self._best:.4g} at lr {self.seen_lrs[-1]:.3g}")
        elif state.step >= len(self.lrs):
            state.request_stop("range test complete")


def validate_lr_range(min_lr: float, max_lr: float, steps: int) -> None:
    """One error naming every problem with the range: positive, finite, min below max, steps >= 5."""
    problems = ProblemCollector()
    for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            problems.add(f"{name}={value!r} must be a positive, finite number.")
    if not problems and not min_lr < max_lr:
        problems.add(f"min_lr={min_lr!r} must be below max_lr={max_lr!r}.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 5:
        problems.add(f"steps={steps!r} must be an integer >= 5 (the test needs a curve).")
    problems.raise_if_any(header="The LR range test is not well-formed, found the following errors:")


def run_lr_range_test(
    task: Task | str,
    params: TrainParams | Mapping[str, Any] | None = None,
    *,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    min_lr: float = 1e-7,
    max_lr: float = 10.0,
    steps: int = 100,
    batch_size: int | None = None,
    device: str | torch.device = "auto",
    seed: int = 0,
    beta: float = 0.9,
    diverge_factor: float = 4.0,
    callbacks: Sequence[Callback] = (),
) -> LRFindResult:
    """Run the range test through :func:`proftune.train.fit` and read its curve.

    A given ``model`` (and ``optimizer``, which then replaces the task's) is restored
    afterwards: weights, buffers, training mode, device and optimizer state. ``callbacks`` run
    beside the test's own (a deadline that stops it early leaves a shorter curve to read).
    """
    validate_lr_range(min_lr, max_lr, steps)
    task_obj = load_task(task)
    lrs = np.geomspace(min_lr, max_lr, steps)
    callback = LRRangeCallback(lrs, beta=beta, diverge_factor=diverge_factor, optimizer=optimizer)
    saved_model = saved_opt = None
    if model is not None:
        first = next(iter(model.parameters()), None)
        home = first.device if first is not None else torch.device("cpu")
        saved_model = (copy.deepcopy(model.state_dict()), model.training, home)
    if optimizer is not None:
        saved_opt = (copy.deepcopy(optimizer.state_dict()), [dict(g) for g in optimizer.param_groups])
    given = as_train_params(task_obj, params)  # validated once: fit takes the record as it is
    try:
        result = fit(task_obj, given, max_steps=steps, batch_size=batch_size, device=device, seed=seed,
                     callbacks=[callback, *callbacks], model=model, evaluate=False, stop_on_nan=True)
    finally:
        if saved_model is not None and model is not None:
            weights, training, home = saved_model
            model.to(home)
            model.load_state_dict(weights)
            model.train(training)
        if saved_opt is not None and optimizer is not None:
            optimizer.load_state_dict(saved_opt[0])
            for group, old in zip(optimizer.param_groups, saved_opt[1], strict=True):
                group["lr"] = old["lr"]
    chance = chance_loss(task_obj, given, int(result.params.get("batch_size", 32)))
    reading = suggest_lr(callback.seen_lrs, callback.losses, diverged=callback.diverged, chance=chance)
    opt_name = type(optimizer if optimizer is not None else result.optimizer).__name__
    return LRFindResult(
        suggested_lr=reading.suggested_lr, min_lr=reading.min_lr, max_lr=reading.max_lr,
        lr_at_min_loss=reading.lr_at_min_loss, lrs=tuple(callback.seen_lrs),
        losses=tuple(callback.losses),
        smoothed=tuple(float(v) for v in reading.smoothed),
        diverged=callback.diverged, stop_reason=result.stop_reason, message=reading.message,
        start_lr=float(min_lr), end_lr=float(max_lr), steps_planned=steps,
        batch_size=int(result.params.get("batch_size", 0)), optimizer=opt_name,
        chance_loss=chance,
    )


def decide_by_ladder(result: LRFindResult, task: Task, params: TrainParams, *,
                     steps: int, rungs: int = 7, device: str | torch.device = "auto", seed: int = 0) -> LRFindResult:
    """``result`` as it is where the sweep suggested a rate; else the lr ladder's rate (rungs half
    a decade apart around the task's lr, ``steps`` each, the sweep's batch and seed) with the
    ladder as its evidence. ``steps=0``: no ladder."""
    if result.suggested_lr is not None or steps <= 0:
        return result
    own = params.lr
    centre = float(own) if isinstance(own, (int, float)) and not isinstance(own, bool) and own > 0 else DEFAULT_LR
    ladder = run_lr_ladder(task, params, centre_lr=centre, rungs=rungs, steps=max(8, int(steps)),
                           batch_size=result.batch_size or None, device=device, seed=seed,
                           chance=result.chance_loss)
    sweep = result.message or "the range test suggested no rate"
    if ladder.best_lr is None:
        return dataclasses.replace(result, ladder=ladder,
                                   message=f"{sweep} The lr ladder decided nothing either: {ladder.message}.")
    return dataclasses.replace(
        result, ladder=ladder, suggested_lr=ladder.best_lr,
        rule=f"the lr ladder: {len(ladder.rungs)} constant rates half a decade apart, {max(8, int(steps))} "
             "steps each from one seed, the lowest final training loss among those whose loss fell",
        message=f"the range test saw no fall ({sweep.rstrip('.')}); {ladder.message}")
