"""Precision decided by measurement: a lower precision only where its timed step on this machine
is faster beyond noise, in two measurements, and a short training with it is no worse than fp32's.

The rule on the profile (``precision_rule``) says where a lower precision could pay (the device
runs it natively, matmul/conv dominate the step); but its share is measured, and a share near its
threshold lands either side of it from one run to the next (bf16 in one ``recommend``, fp32 in the
next, on the same machine; measured 9%, 34%, 36%, 49% and 60% on one task in five runs under load).
So wherever the device has a candidate, the candidate is timed
against fp32 on the task's own steps at one thread, in alternated rounds (neither always first),
as two measurements (a third where they disagree): in each, the candidate's run must be faster by
``MARGIN`` than fp32's in ``PAIR_SHARE`` of the pairs of runs, which the load states of a shared
machine do not decide as they decide a median or a fastest run (two of three where a third was
taken); and the same seed trained a few steps in
each precision must end no worse than fp32 beyond noise. Otherwise fp32, with the figures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._records import JsonRecord
from .._train_params import TrainParams
from ..task import Task
from ..train import Callback, FitState, fit
from ._lr_ladder import loss_trend
from ._records import Recommendation

__all__ = ["MARGIN", "PAIR_SHARE", "PrecisionCheck", "check_precision", "checked_precision_row", "time_candidate",
           "timed_verdict"]

#: The candidate's step must be at least this much faster (10%), beyond the noise of the rounds.
MARGIN = 0.10
#: Timed steps of a round (after ``WARMUP`` untimed ones), rounds per half.
TIMED_STEPS, WARMUP, ROUNDS = 6, 2, 4
#: The share of pairs of runs in which the candidate, ``MARGIN`` slower, must still be faster.
PAIR_SHARE = 0.6
#: Steps of the short training each precision runs from the same seed.
MATCH_STEPS = 30

#: precision -> the median step time (ms) of one short run of the task in it.
PrecisionTimer = Callable[[str], float]


class _Steps(Callback):
    def __init__(self) -> None:
        self.ms: list[float] = []
        self.losses: list[float] = []

    def on_step_end(self, state: FitState) -> None:
        self.ms.append(float(state.timing.get("step_ms", math.nan)))
        self.losses.append(float(state.loss) if state.loss is not None else math.nan)


@dataclass(frozen=True)
class PrecisionCheck(JsonRecord):
    """What the check measured: per-round step medians (ms) of each precision, each measurement's
    ratio of medians (candidate / fp32), the short trainings' final losses, and the verdict."""

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
                f"{statistics.median(self.fp32_ms):.3g} ms at one thread (ratio of medians {ratios} "
                f"in {len(self.half_ratios)} measurements of {ROUNDS} alternated rounds; faster means {MARGIN:.0%} "
                f"faster in >= {PAIR_SHARE:.0%} of the pairs of runs of a measurement, in both, or in two of "
                "three where the first two disagreed)")
        if self.fp32_loss is None or self.candidate_loss is None:
            loss = f"the {MATCH_STEPS}-step trainings gave no finite loss to compare"
        else:
            loss = (f"{MATCH_STEPS} steps from one seed end at loss {self.candidate_loss:.4g} vs fp32 "
                    f"{self.fp32_loss:.4g} (no worse means within {self.loss_tolerance or 0.0:.2g} above it)")
        return f"{step}; {loss}"


def _run(task: Task, params: TrainParams, precision: str, *, steps: int, device: torch.device,
         seed: int) -> _Steps:
    cb = _Steps()
    fit(task, params.with_params(precision=precision), max_steps=steps, device=device, seed=seed, callbacks=[cb],
        evaluate=False, threads=1)
    return cb


def _step_timer(task: Task, params: TrainParams, *, device: torch.device, seed: int) -> PrecisionTimer:
    def measure(precision: str) -> float:
        times = _run(task, params, precision, steps=WARMUP + TIMED_STEPS, device=device, seed=seed).ms[WARMUP:]
        finite = [t for t in times if math.isfinite(t)]
        return statistics.median(finite) if finite else math.nan

    return measure


def timed_verdict(fp32_ms: list[float], cand_ms: list[float]) -> tuple[list[float], list[float], bool, bool]:
    """(each measurement's ratio of medians, each one's share of faster pairs, faster, decided) from
    alternated rounds, ``ROUNDS`` a measurement. The share is that of the pairs of runs (one of each
    precision, any two of the measurement) in which the candidate's run, ``MARGIN`` slower, is still
    faster than fp32's: the load on a shared machine puts each run in one of a few states (2.3, 4.4
    or 6.5 ms a step on one task), and a median or the fastest run reads whichever state the few
    runs of a precision happened to catch (bf16 read 0.7x in one ``recommend`` and 1.2x in the next).
    Faster: a share of at least ``PAIR_SHARE`` in both of two measurements, or in two of three where
    a third was taken because the first two disagreed; decided: two measurements agree."""
    ratios, shares = [], []
    for i in range(0, len(fp32_ms), ROUNDS):
        f = [t for t in fp32_ms[i:i + ROUNDS] if math.isfinite(t) and t > 0]
        c = [t for t in cand_ms[i:i + ROUNDS] if math.isfinite(t) and t > 0]
        if not f or not c:
            ratios.append(math.inf)
            shares.append(0.0)
            continue
        ratios.append(statistics.median(c) / statistics.median(f))
        shares.append(sum(y * (1.0 + MARGIN) < x for x in f for y in c) / (len(f) * len(c)))
    votes = [share >= PAIR_SHARE for share in shares]
    return ratios, shares, 2 * sum(votes) > len(votes), len(votes) >= 3 or len(set(votes)) == 1


def time_candidate(candidate: str, timer: PrecisionTimer) -> tuple[list[float], list[float], list[float], bool, bool]:
    """(fp32's runs, the candidate's runs, each measurement's ratio, faster, decided): two
    measurements of ``ROUNDS`` alternated rounds, a third where they disagree."""
    fp32_ms: list[float] = []
    cand_ms: list[float] = []

    def measure() -> None:
        for r in range(ROUNDS):
            order = ("fp32", candidate) if r % 2 == 0 else (candidate, "fp32")  # neither always goes first
            for p in order:
                (fp32_ms if p == "fp32" else cand_ms).append(timer(p))

    measure()
    measure()
    ratios, _, faster, decided = timed_verdict(fp32_ms, cand_ms)
    if not decided:
        measure()  # the two disagree: a third decides
        ratios, _, faster, decided = timed_verdict(fp32_ms, cand_ms)
    return fp32_ms, cand_ms, ratios, faster, decided


def check_precision(task: Task, params: TrainParams, candidate: str, *, device: torch.device,
                    seed: int = 0, timer: PrecisionTimer | None = None) -> PrecisionCheck:
    """Time ``candidate`` against fp32 on the task's steps (:func:`time_candidate`; ``timer`` times
    one short run in a precision, the task's own steps by default), and train both
    ``MATCH_STEPS`` steps from ``seed``."""
    fp32_ms, cand_ms, halves, faster, decided = time_candidate(
        candidate, timer or _step_timer(task, params, device=device, seed=seed))
    base = loss_trend(_run(task, params, "fp32", steps=MATCH_STEPS, device=device, seed=seed).losses)
    low = loss_trend(_run(task, params, candidate, steps=MATCH_STEPS, device=device, seed=seed).losses)
    matches, tol = False, None
    if base is not None and low is not None:
        _, end32, noise, window = base
        tol = max(0.02 * abs(end32), 3.0 * noise / math.sqrt(window))
        matches = low[1] - end32 <= tol  # no worse: a lower loss harms nothing
    return PrecisionCheck(candidate=candidate, fp32_ms=fp32_ms, candidate_ms=cand_ms, half_ratios=halves,
                          fp32_loss=base[1] if base else None, candidate_loss=low[1] if low else None,
                          loss_tolerance=tol, faster=faster, decided=decided, matches=matches)


def checked_precision_row(row: Recommendation, task: Task, params: TrainParams, *, device: torch.device,
                          seed: int, measure: bool = True, timer: PrecisionTimer | None = None) -> Recommendation:
    """The rule's row where the device has no faster precision; else the candidate only where
    :func:`check_precision` measured it faster beyond noise in two measurements and no worse in
    training, fp32 otherwise (with why). The rule's share threshold does not decide: the share is
    measured under whatever load there is, and lands either side of it from run to run."""
    candidate = row.evidence.get("candidate", row.value)
    if candidate in (None, "fp32"):
        return row
    if not measure:
        if row.value in (None, "fp32"):
            return row
        return Recommendation("precision", "fp32", f"keep fp32: the rule suggested {row.value}, but the time given "
                              f"held no timed comparison to confirm it ({row.reason})", dict(row.evidence), "low",
                              "none: fp32, not measured against the rule's candidate")
    check = check_precision(task, params, str(candidate), device=device, seed=seed, timer=timer)
    evidence = {**row.evidence, "check": check.to_dict()}
    if check.adopt:
        reason = (row.reason if row.value == candidate else
                  f"use {candidate} autocast (param precision={candidate}): the device runs it natively.")
        return Recommendation("precision", candidate, f"{reason} Measured here: {check.describe()}.",
                              evidence, "high", f"step x{statistics.median(check.half_ratios):.2f} (measured)")
    why = ("not decided: the two halves disagree" if not check.decided else
           f"{check.candidate} is not faster by {MARGIN:.0%} beyond noise" if not check.faster else
           f"{check.candidate}'s short training ends worse than fp32's")
    return Recommendation("precision", "fp32", f"keep fp32: {why} ({check.describe()}); the rule alone "
                          f"{'suggested ' + check.candidate if row.value == candidate else 'kept fp32'} "
                          f"({row.reason})", evidence, "medium", "none: fp32, as measured here")
