"""Precision decided by measurement: a lower precision only where its timed step on this machine
is faster beyond noise, twice over, and a short training with it matches fp32.

The rule on the profile (``precision_rule``) says where a lower precision could pay (the device
runs it natively, matmul/conv dominate the step); a share near its threshold flips between runs,
and an assumed speed-up is no measurement. So the candidate is timed against fp32 on the task's
own steps at one thread, alternated in rounds; the rounds form two halves, each of which must
find it faster by ``MARGIN`` (a flip between them means "not decided": fp32 is kept); and the same
seed trained a few steps in each precision must end at the same loss within noise.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .._records import JsonRecord
from ..task import Task
from ..train import Callback, FitState, fit
from ._lr_ladder import loss_trend
from ._records import Recommendation

__all__ = ["MARGIN", "PrecisionCheck", "check_precision", "checked_precision_row"]

#: The candidate's step must be at least this much faster (10%) in both halves of the rounds.
MARGIN = 0.10
#: Timed steps of a round (after ``WARMUP`` untimed ones), rounds per half.
TIMED_STEPS, WARMUP, ROUNDS = 6, 2, 3
#: Steps of the short training each precision runs from the same seed.
MATCH_STEPS = 30


class _Steps(Callback):
    def __init__(self) -> None:
        self.ms: list[float] = []
        self.losses: list[float] = []

    def on_step_end(self, state: FitState) -> None:
        self.ms.append(float(state.timing.get("step_ms", math.nan)))
        self.losses.append(float(state.loss) if state.loss is not None else math.nan)


@dataclass(frozen=True)
class PrecisionCheck(JsonRecord):
    """What the check measured: per-round step medians (ms) of each precision, the halves'
    ratios (candidate / fp32), the short trainings' final losses, and the verdict."""

    WHAT: ClassVar[str] = "a precision check"
    candidate: str
    fp32_ms: list[float]
    candidate_ms: list[float]
    half_ratios: list[float]
    fp32_loss: float | None
    candidate_loss: float | None
    loss_tolerance: float | None
    faster: bool
    decided: bool
    matches: bool

    @property
    def adopt(self) -> bool:
        return self.faster and self.decided and self.matches

    def describe(self) -> str:
        ratios = " and ".join(f"{r:.2f}" for r in self.half_ratios)
        step = (f"{self.candidate} step {statistics.median(self.candidate_ms):.3g} ms vs fp32 "
                f"{statistics.median(self.fp32_ms):.3g} ms at one thread (ratio {ratios} in two halves of "
                f"{ROUNDS} alternated rounds; faster means <= {1 / (1 + MARGIN):.2f} in both)")
        if self.fp32_loss is None or self.candidate_loss is None:
            loss = f"the {MATCH_STEPS}-step trainings gave no finite loss to compare"
        else:
            loss = (f"{MATCH_STEPS} steps from one seed end at loss {self.candidate_loss:.4g} vs fp32 "
                    f"{self.fp32_loss:.4g} (tolerance {self.loss_tolerance or 0.0:.2g})")
        return f"{step}; {loss}"


def _run(task: Task, params: dict[str, Any], precision: str, *, steps: int, device: torch.device,
         seed: int) -> _Steps:
    cb = _Steps()
    fit(task, {**params, "precision": precision}, max_steps=steps, device=device, seed=seed, callbacks=[cb],
        evaluate=False, threads=1)
    return cb


def check_precision(task: Task, params: dict[str, Any], candidate: str, *, device: torch.device,
                    seed: int = 0) -> PrecisionCheck:
    """Time ``candidate`` against fp32 on the task's steps (alternated rounds, two halves), and
    train both ``MATCH_STEPS`` steps from ``seed``."""
    fp32_ms: list[float] = []
    cand_ms: list[float] = []
    for r in range(2 * ROUNDS):
        order = ("fp32", candidate) if r % 2 == 0 else (candidate, "fp32")  # neither always goes first
        for p in order:
            times = _run(task, params, p, steps=WARMUP + TIMED_STEPS, device=device, seed=seed).ms[WARMUP:]
            finite = [t for t in times if math.isfinite(t)]
            (fp32_ms if p == "fp32" else cand_ms).append(statistics.median(finite) if finite else math.nan)
    halves = []
    for h in range(2):
        a, b = fp32_ms[h * ROUNDS:(h + 1) * ROUNDS], cand_ms[h * ROUNDS:(h + 1) * ROUNDS]
        halves.append(statistics.median(b) / statistics.median(a) if statistics.median(a) > 0 else math.inf)
    bar = 1.0 / (1.0 + MARGIN)
    verdicts = [r <= bar for r in halves]
    faster, decided = all(verdicts), len(set(verdicts)) == 1
    base = loss_trend(_run(task, params, "fp32", steps=MATCH_STEPS, device=device, seed=seed).losses)
    low = loss_trend(_run(task, params, candidate, steps=MATCH_STEPS, device=device, seed=seed).losses)
    matches, tol = False, None
    if base is not None and low is not None:
        _, end32, noise, window = base
        tol = max(0.02 * abs(end32), 3.0 * noise / math.sqrt(window))
        matches = abs(low[1] - end32) <= tol
    return PrecisionCheck(candidate=candidate, fp32_ms=fp32_ms, candidate_ms=cand_ms, half_ratios=halves,
                          fp32_loss=base[1] if base else None, candidate_loss=low[1] if low else None,
                          loss_tolerance=tol, faster=faster, decided=decided, matches=matches)


def checked_precision_row(row: Recommendation, task: Task, params: dict[str, Any], *, device: torch.device,
                          seed: int, measure: bool = True) -> Recommendation:
    """The rule's row where it keeps fp32; else the candidate only where :func:`check_precision`
    measured it faster in both halves and matching fp32's training, fp32 otherwise (with why)."""
    if row.value in (None, "fp32"):
        return row
    if not measure:
        return Recommendation("precision", "fp32", f"keep fp32: the rule suggested {row.value}, but the time given "
                              f"held no timed comparison to confirm it ({row.reason})", dict(row.evidence), "low",
                              "none: fp32, not measured against the rule's candidate")
    check = check_precision(task, params, str(row.value), device=device, seed=seed)
    evidence = {**row.evidence, "check": check.to_dict()}
    if check.adopt:
        return dataclasses.replace(row, reason=f"{row.reason} Measured here: {check.describe()}.",
                                   evidence=evidence, confidence="high",
                                   effect=f"step x{check.half_ratios[-1]:.2f} (measured)")
    why = ("not decided: the two halves disagree" if not check.decided else
           f"{check.candidate} is not faster by {MARGIN:.0%}" if not check.faster else
           f"{check.candidate}'s short training does not match fp32's")
    return Recommendation("precision", "fp32", f"keep fp32: {why} ({check.describe()}); the rule alone "
                          f"suggested {check.candidate} ({row.reason})", evidence, "medium",
                          "none: fp32, as measured here")
