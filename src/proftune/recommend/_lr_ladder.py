"""The lr ladder: a handful of constant rates half a decade apart, each trained a short fixed
number of steps from the same seed, read by where the training loss ended lowest.

Why, beside the range test: a model whose loss sits on a plateau at the start (a deep net with a
small init, a CNN whose loss stays at ln(10) for its first ~100 steps at a small rate) never shows
the exponential sweep a fall — by the time the loss could leave the plateau the sweep's rate has
grown past stability, and the test reads "the loss rose from the first step". Smith (2017) and
fastai's ``lr_find`` need enough steps per decade; the ladder gives each rate its own steps
instead. It decides only where the range test saw nothing, and says so in its evidence.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._records import JsonRecord, Reader, each
from .._train_params import TrainParams
from ..exceptions import ConfigError
from ..task import Task
from ..train import Callback, FitState, fit

__all__ = ["LADDER_FACTOR", "LadderResult", "LadderRung", "below_chance", "fell_beyond_noise", "loss_trend",
           "read_ladder", "run_lr_ladder"]

#: Neighbouring rungs are this factor apart: half a decade.
LADDER_FACTOR = math.sqrt(10.0)
#: Rungs added beyond an edge whose rung ended lowest (the best may lie further out).
MAX_EXTENSION = 2


@dataclass(frozen=True)
class LadderRung(JsonRecord):
    """One rate of the ladder: the training loss at its start and over its last quarter."""

    WHAT: ClassVar[str] = "an lr ladder rung"
    lr: float
    steps: int
    #: Mean loss of the first steps (the same model at every rung: one seed).
    start_loss: float | None
    #: Mean loss of the last quarter of the steps (None: it diverged).
    end_loss: float | None
    #: Robust spread of the last quarter's losses (its noise).
    noise: float | None
    diverged: bool

    def fell(self) -> bool:
        """Whether the loss fell beyond its noise (see :func:`fell_beyond_noise`)."""
        if self.diverged or self.end_loss is None or self.start_loss is None:
            return False
        return fell_beyond_noise(self.start_loss, self.end_loss, self.noise or 0.0, window=max(1, self.steps // 4))


def fell_beyond_noise(start: float, end: float, noise: float, *, window: int) -> bool:
    """A training loss fell from ``start`` to ``end`` (the mean of ``window`` steps whose robust
    spread is ``noise``) by more than 2% of the start and 3 standard errors."""
    margin = max(0.02 * abs(start), 3.0 * noise / math.sqrt(max(1, window)), 1e-12)
    return start - end > margin


def loss_trend(losses: list[float]) -> tuple[float, float, float, int] | None:
    """(start, end, noise, window) of a loss curve: the means of its first and last quarters and
    the last quarter's robust spread; None for fewer than 4 finite losses."""
    finite = [v for v in losses if math.isfinite(v)]
    if len(finite) < 4:
        return None
    q = max(2, len(finite) // 4)
    tail = finite[-q:]
    med = statistics.median(tail)
    return (statistics.fmean(finite[:q]), statistics.fmean(tail),
            1.4826 * statistics.median(abs(v - med) for v in tail), q)


@dataclass(frozen=True)
class LadderResult(JsonRecord):
    """The rungs (lowest rate first) and the one read as best (None: no rate learned)."""

    WHAT: ClassVar[str] = "an lr ladder"
    READERS: ClassVar[dict[str, Reader]] = {"rungs": each(LadderRung.from_dict)}
    rungs: list[LadderRung]
    best_lr: float | None
    message: str

    def describe(self) -> str:
        """The rungs in one line (rate -> end loss)."""
        return ", ".join(f"{r.lr:.3g}: {'diverged' if r.diverged else f'{r.end_loss:.4g}'}"
                         + ("" if r.fell() or r.diverged else " (no fall)") for r in self.rungs)


class _Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_step_end(self, state: FitState) -> None:
        self.losses.append(float(state.loss) if state.loss is not None else math.nan)


def _rung(lr: float, losses: list[float], steps: int) -> LadderRung:
    finite = [v for v in losses if math.isfinite(v)]
    diverged = len(finite) < len(losses) or len(losses) < steps
    if not losses:
        return LadderRung(lr=lr, steps=0, start_loss=None, end_loss=None, noise=None, diverged=True)
    head = losses[: max(2, len(losses) // 20)]
    start = statistics.fmean(head) if all(math.isfinite(v) for v in head) else None
    tail = losses[-max(2, len(losses) // 4):]
    if diverged or not all(math.isfinite(v) for v in tail):
        return LadderRung(lr=lr, steps=len(losses), start_loss=start, end_loss=None, noise=None, diverged=True)
    med = statistics.median(tail)
    noise = 1.4826 * statistics.median(abs(v - med) for v in tail)
    end = statistics.fmean(tail)
    # a loss far above its start (4x, the range test's rule) is a blow-up that stayed finite
    blown = start is not None and start > 0 and end > 4.0 * start
    return LadderRung(lr=lr, steps=len(losses), start_loss=start, end_loss=None if blown else end,
                      noise=noise, diverged=blown)


def below_chance(rung: LadderRung, chance: float | None) -> bool:
    """Whether the rung's loss ended below ``chance`` (the best constant prediction's loss; None:
    not known, so any fall counts) by more than 2% of it and 3 standard errors of its noise."""
    if chance is None:
        return True
    if rung.end_loss is None:
        return False
    margin = max(0.02 * chance, 3.0 * (rung.noise or 0.0) / math.sqrt(max(1, rung.steps // 4)))
    return rung.end_loss < chance - margin


def read_ladder(rungs: list[LadderRung], *, chance: float | None = None) -> LadderResult:
    """The rate whose loss ended lowest among those that fell beyond noise and below ``chance``
    (where known: a fall only to chance learned the labels' frequencies; None: none learned)."""
    ordered = sorted(rungs, key=lambda r: r.lr)
    learned = [r for r in ordered if r.fell() and below_chance(r, chance)]
    if not learned:
        at_chance = ("" if chance is None or not any(r.fell() for r in ordered) else
                     f" (those whose loss fell ended at chance level, {chance:.4g})")
        return LadderResult(rungs=ordered, best_lr=None,
                            message=(f"the loss fell beyond its noise and below chance at none of {len(ordered)} "
                                     f"rates {ordered[0].lr:.3g}..{ordered[-1].lr:.3g}{at_chance}"
                                     if chance is not None and ordered else
                                     f"the loss fell beyond its noise at none of {len(ordered)} rates "
                                     f"{ordered[0].lr:.3g}..{ordered[-1].lr:.3g}" if ordered else "no rung ran"))
    best = min(learned, key=lambda r: float(r.end_loss or math.inf))
    return LadderResult(rungs=ordered, best_lr=best.lr,
                        message=(f"lr {best.lr:.3g} ended lowest (training loss {best.start_loss:.4g} -> "
                                 f"{best.end_loss:.4g} over {best.steps} steps) of {len(ordered)} rates "
                                 f"half a decade apart"))


def _ladder_rates(centre: float, rungs: int) -> list[float]:
    below = rungs // 2
    return [centre * LADDER_FACTOR ** (k - below) for k in range(rungs)]


def run_lr_ladder(task: Task, params: TrainParams, *, centre_lr: float, rungs: int = 7, steps: int = 100,
                  batch_size: int | None = None, device: str | torch.device = "auto", seed: int = 0,
                  chance: float | None = None) -> LadderResult:
    """Train ``steps`` steps at each of ``rungs`` rates centred on ``centre_lr`` (half a decade
    apart, one seed), and up to two rungs more beyond an edge whose rate ended lowest (upward where
    no rate's loss fell and the top one was stable: a plateau). ``chance``: the best constant
    prediction's loss, where known; a rate whose loss fell only to it learned nothing."""
    if not (isinstance(centre_lr, (int, float)) and math.isfinite(centre_lr) and centre_lr > 0):
        raise ConfigError(f"the lr ladder needs a positive, finite centre, but got {centre_lr=}.")
    if isinstance(rungs, bool) or not isinstance(rungs, int) or rungs < 3:
        raise ConfigError(f"the lr ladder needs rungs >= 3 (an edge on each side), but got {rungs=}.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 8:
        raise ConfigError(f"the lr ladder needs steps >= 8 per rate (a start and an end to compare), "
                          f"but got {steps=}.")
    done: dict[float, LadderRung] = {}

    def train(lr: float) -> None:
        cb = _Losses()
        fit(task, params.with_params(lr=lr), max_steps=steps, batch_size=batch_size, device=device, seed=seed,
            callbacks=[cb], evaluate=False, stop_on_nan=True)
        done[lr] = _rung(lr, cb.losses, steps)

    for lr in _ladder_rates(float(centre_lr), rungs):
        train(lr)
    for _ in range(MAX_EXTENSION):
        reading = read_ladder(list(done.values()), chance=chance)
        ordered = sorted(done)
        if reading.best_lr is None:
            # nothing fell: a plateau at every rate tried goes on upward while the top rate is stable
            if done[ordered[-1]].diverged:
                break
            train(ordered[-1] * LADDER_FACTOR)
        elif reading.best_lr == ordered[-1]:
            train(ordered[-1] * LADDER_FACTOR)
        elif reading.best_lr == ordered[0]:
            train(ordered[0] / LADDER_FACTOR)
        else:
            break
    return read_ladder(list(done.values()), chance=chance)
