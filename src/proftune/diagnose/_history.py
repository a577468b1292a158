"""What a :class:`HealthCheck` recorded of a run: the one record every check reads.

The recorder fills it while training runs; the checks (``diagnose/checks/``) only read it, so a
check can be tested on a History built by hand.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch

from .._records import JsonRecord
from ..profile import LayerStatistics
from ._lrtest import RangeTest

__all__ = ["DecayProbe", "EarlyRise", "History", "LabelOrder", "LayerSample", "LossRise", "NanProbe", "NonFinite",
           "Oscillation", "Plateau", "Saturation", "SlowProgress", "StalledTail", "StepRecord", "WarmupProbe",
           "grad_norm"]

#: (1-based step, per-layer statistics of :class:`proftune.profile.LayerStats` at that step).
LayerSample = tuple[int, dict[str, LayerStatistics]]


def grad_norm(stats: LayerStatistics) -> float:
    """A layer's sampled gradient norm (NaN: not gathered)."""
    norm = (stats.get("grad") or {}).get("norm")
    return math.nan if norm is None else float(norm)


class Saturation(TypedDict):
    """A saturating layer's output at one step: its type and the share of its outputs saturated."""

    type: str
    saturated_frac: float


class StepRecord(TypedDict):
    """One optimizer step: its loss, global gradient norm and lr, and the norm's running median."""

    step: int
    loss: float
    grad_norm: float
    lr: float | None
    median: float
    ratio: float  # grad_norm / median (NaN until the median is known)


class _NonFiniteAt(TypedDict):
    step: int
    phase: str  # "forward", "backward" or "loss"
    layer: str | None
    type: str | None
    inputs_finite: bool | None
    loss: float


class NonFinite(_NonFiniteAt, total=False):
    """The first step whose loss or gradients were NaN/Inf: where (``phase``, the first ``layer``
    in forward order and its ``type``) and what else was finite then."""

    grad_norm: float
    weights_finite: bool
    nonfinite_values: float
    layers_finite: bool


@dataclass(frozen=True)
class NanProbe(JsonRecord):
    """The run again at ``probe_lr`` (``factor`` x ``lr``) up to ``steps`` past its first NaN at
    ``nan_step``: where the probe's loss turned non-finite (None: never), and whether the NaN follows the rate."""

    lr: float
    probe_lr: float
    factor: float
    steps: int
    nan_step: int
    probe_nan_step: int | None
    follows_lr: bool


@dataclass(frozen=True)
class DecayProbe(JsonRecord):
    """``steps`` more steps of the trained run at ``lr`` and at ``decayed_lr``: the mean train loss
    of the second half of each, and how much lower the decayed one is (``relative_gain``)."""

    steps: int
    lr: float
    decayed_lr: float
    constant_loss: float
    decayed_loss: float
    relative_gain: float


@dataclass(frozen=True)
class WarmupProbe:
    """The loss of the first ``steps`` steps of the run again at ``lr`` with a linear warm-up over ``warmup_steps``."""

    steps: int
    warmup_steps: int
    lr: float
    losses: list[float]


@dataclass(frozen=True)
class LossRise(JsonRecord):
    """The smoothed loss rose back by more than half of the progress made (or blew up): its start,
    its low before the rise, the peak after it (inf: it blew up), where it ended, and the rise's onset."""

    start_loss: float
    min_loss: float
    min_step: int
    min_loss_overall: float
    peak_loss: float
    peak_step: int
    final_loss: float
    onset: int
    ended_above_start: bool
    #: Spread over mean of the last fifth of the step losses (None: fewer than two finite ones).
    tail_cv: float | None


@dataclass(frozen=True)
class Oscillation(JsonRecord):
    """The loss climbed back up ``rises`` times between windows of ``window_steps`` steps."""

    rises: int
    windows: int
    window_steps: int
    first_rise_step: int
    largest_rise: float
    largest_rise_step: int
    start_loss: float
    final_loss: float
    low: float


@dataclass(frozen=True)
class Plateau(JsonRecord):
    """The smoothed loss fell by ``relative_drop`` (under 10%) over ``steps`` steps."""

    start_loss: float
    final_loss: float
    relative_drop: float
    steps: int


@dataclass(frozen=True)
class SlowProgress(JsonRecord):
    """The loss fell by ``relative_drop`` over ``steps`` steps, the last quarter making ``last_quarter_share``."""

    start_loss: float
    final_loss: float
    relative_drop: float
    last_quarter_share: float
    steps: int


@dataclass(frozen=True)
class EarlyRise(JsonRecord):
    """The largest climb of the smoothed loss above its running low, ``rise`` a fraction of the starting loss."""

    rise: float
    peak_step: int
    peak_loss: float
    low_step: int
    low_loss: float
    start_loss: float


@dataclass(frozen=True)
class LabelOrder(JsonRecord):
    """How far the batches' label sequence is from a shuffled one (:meth:`History.label_order`)."""

    adjacent_same_label: float
    expected_if_shuffled: float
    label_autocorrelation: float
    labels_per_batch: float
    expected_labels_per_batch: float
    batches_seen: int
    classes: int
    batch_size: float
    excess: float
    diversity: float


@dataclass(frozen=True)
class StalledTail(JsonRecord):
    """The last ``tail_steps`` steps made ``tail_progress`` of the run's progress at a noisy level."""

    start_loss: float
    tail_loss: float
    tail_noise: float
    tail_progress: float
    tail_steps: int


@dataclass
class History:
    """Signals of one run: every step, sampled per-layer statistics, epochs, labels, model facts.

    ``nonfinite`` describes the first step whose loss or gradients were NaN/Inf (``step``,
    ``phase`` forward/backward/loss, ``layer``, ``type``, ``inputs_finite``, ``loss``, ...).
    ``saturation`` holds, per sampled step, the fraction of each sigmoid/tanh layer's outputs in
    the flat tails (derivative below 1% of its peak). ``train_metrics`` are the task's metrics of
    the final model on its training data (``diagnose`` measures them; a Monitor has none).
    ``decay_probe``, ``warmup_probe`` and ``nan_probe`` are the short confirming runs of
    :mod:`._probes`.
    """

    spike_factor: float = 10.0
    dead_threshold: float = 0.9
    steps: list[StepRecord] = field(default_factory=list)
    samples: list[LayerSample] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    labels: list[torch.Tensor] = field(default_factory=list)
    nonfinite: NonFinite | None = None
    lr_test: RangeTest | None = None
    batchnorm: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    fan_in: dict[str, int] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    input_rms: dict[int, float] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    optimizer: str | None = None  # the optimizer's class name
    saturation: dict[int, dict[str, Saturation]] = field(default_factory=dict)
    train_metrics: dict[str, float] = field(default_factory=dict)
    decay_probe: DecayProbe | None = None
    warmup_probe: WarmupProbe | None = None
    nan_probe: NanProbe | None = None

    # -- derived signals that several checks share -----------------------------------------
    def losses(self) -> list[tuple[int, float]]:
        return [(r["step"], r["loss"]) for r in self.steps]

    def lr(self) -> float | None:
        """The last learning rate used, else the params' ``lr``."""
        for r in reversed(self.steps):
            if r["lr"] is not None:
                return float(r["lr"])
        lr = self.params.get("lr")
        return float(lr) if lr is not None else None

    def smoothed(self, beta: float = 0.8) -> list[tuple[int, float]]:
        """Bias-corrected exponential moving average of the finite losses."""
        out, avg = [], 0.0
        finite = [(s, v) for s, v in self.losses() if math.isfinite(v)]
        for i, (s, v) in enumerate(finite):
            avg = beta * avg + (1 - beta) * v
            out.append((s, avg / (1 - beta ** (i + 1))))
        return out

    def spikes(self) -> list[StepRecord]:
        """Steps whose gradient norm reached ``spike_factor`` times its running median."""
        return [r for r in self.steps if math.isfinite(r["ratio"]) and r["ratio"] >= self.spike_factor]

    def lr_rise(self) -> LossRise | None:
        """The loss rose back by more than half of the progress made (or blew up)."""
        curve = self.smoothed()
        if len(curve) < 5:
            return None
        start = statistics.fmean(v for _, v in curve[:3])
        found = _rise_onset(curve, start)
        blew_up = self.nonfinite is not None and not self.nan_not_lr()
        if found is None and not blew_up:
            return None
        final = curve[-1][1]
        tail = [v for s, v in self.losses()[-max(len(curve) // 5, 5):] if math.isfinite(v)]
        if found is None:
            assert self.nonfinite is not None
            low, low_step = min((v, s) for s, v in curve)
            found = (int(self.nonfinite["step"]), low, low_step, math.inf, int(self.nonfinite["step"]))
        onset, min_loss, min_step, peak_loss, peak_step = found
        return LossRise(start_loss=start, min_loss=min_loss, min_step=min_step,
                        min_loss_overall=min(v for _, v in curve), peak_loss=peak_loss,
                        peak_step=peak_step, final_loss=final, onset=onset,
                        ended_above_start=final > start,
                        tail_cv=statistics.pstdev(tail) / max(statistics.fmean(tail), 1e-12) if len(tail) > 1 else None)

    def nan_not_lr(self) -> bool:
        """Whether the NaN probe found the first NaN at the same step (or sooner) at a far lower
        rate: it does not follow the learning rate, so no rise of the loss is read from it."""
        return self.nan_probe is not None and not self.nan_probe.follows_lr

    def lrs(self) -> list[float]:
        """The learning rate of every step that recorded one."""
        return [float(r["lr"]) for r in self.steps if r["lr"] is not None]

    def label_order(self) -> LabelOrder | None:
        """How far the label sequence of the batches is from a shuffled one.

        ``excess``: how much more often consecutive samples share a label than under shuffling
        (0 shuffled, 1 always); ``diversity``: distinct labels per batch over what shuffled
        batches of that size hold (1 shuffled). None without integer labels of 2+ classes.
        """
        if len(self.labels) < 4:
            return None
        seq = torch.cat(self.labels)
        classes, counts = torch.unique(seq, return_counts=True)
        if classes.numel() < 2:
            return None
        p = counts.double() / counts.sum()
        expected_same = float((p**2).sum())
        same = float((seq[1:] == seq[:-1]).double().mean())
        bs = statistics.median(int(y.numel()) for y in self.labels)
        # each batch against a shuffled batch of its own size: an epoch's short last batch (3 of
        # 67 samples at batch 64) holds few labels by its size, not by the data's order
        expected_unique = statistics.fmean(float((1 - (1 - p) ** int(y.numel())).sum()) for y in self.labels)
        unique = statistics.fmean(int(torch.unique(y).numel()) for y in self.labels)
        ys = seq.double()
        autocorr = float(torch.corrcoef(torch.stack([ys[1:], ys[:-1]]))[0, 1]) if ys.std() > 0 else 0.0
        return LabelOrder(adjacent_same_label=same, expected_if_shuffled=expected_same,
                          label_autocorrelation=autocorr, labels_per_batch=unique,
                          expected_labels_per_batch=expected_unique, batches_seen=len(self.labels),
                          classes=int(classes.numel()), batch_size=bs,
                          excess=(same - expected_same) / max(1 - expected_same, 1e-9),
                          diversity=unique / max(expected_unique, 1e-9))

    def plateau(self) -> Plateau | None:
        """The smoothed loss fell by less than 10% over at least 30 steps."""
        curve = self.smoothed()
        if len(curve) < 30:
            return None
        n = max(len(curve) // 10, 3)
        start = statistics.fmean(v for _, v in curve[:n])
        end = statistics.fmean(v for _, v in curve[-n:])
        drop = (start - end) / max(abs(start), 1e-12)
        if drop >= 0.1:
            return None
        return Plateau(start_loss=start, final_loss=end, relative_drop=drop, steps=len(curve))


    def oscillation(self) -> Oscillation | None:
        """The loss climbs back up again and again: 3+ rises between consecutive windows of
        steps, each by 20% of the starting loss and 35% of its level at the time (smaller ones
        are the batch noise of a low loss)."""
        finite = [(s, v) for s, v in self.losses() if math.isfinite(v)]
        if len(finite) < 40:
            return None
        w = max(5, len(finite) // 40)
        windows = [finite[i:i + w] for i in range(0, len(finite) - w + 1, w)]
        means = [(ws[0][0], statistics.fmean(v for _, v in ws)) for ws in windows]
        start = max(means[0][1], finite[0][1])  # the first window may already be well below the start
        rises = [(s1, m1 - m0) for (_, m0), (s1, m1) in itertools.pairwise(means)
                 if m1 - m0 > 0.2 * start and m1 - m0 > 0.35 * m0]
        if len(rises) < 3:
            return None
        largest = max(rises, key=lambda r: r[1])
        return Oscillation(rises=len(rises), windows=len(means), window_steps=w, first_rise_step=rises[0][0],
                           largest_rise=largest[1], largest_rise_step=largest[0], start_loss=start,
                           final_loss=means[-1][1], low=min(m for _, m in means))

    def slow_progress(self) -> SlowProgress | None:
        """The loss falls, but slowly: it kept over 40% of its starting value (yet fell 10% or
        more, else it is a plateau) and the last quarter of the run still made a sixth or more
        of the progress, so it is far from converged and not flattening."""
        curve = self.smoothed()
        if len(curve) < 60:
            return None
        n = max(len(curve) // 20, 3)
        start = statistics.fmean(v for _, v in curve[:n])
        end = statistics.fmean(v for _, v in curve[-n:])
        q3 = statistics.fmean(v for _, v in curve[3 * len(curve) // 4 - n: 3 * len(curve) // 4])
        if start <= 0 or not (0.1 <= (start - end) / start <= 0.6):
            return None
        last_quarter = (q3 - end) / (start - end)
        if last_quarter < 1 / 6:
            return None
        return SlowProgress(start_loss=start, final_loss=end, relative_drop=(start - end) / start,
                            last_quarter_share=last_quarter, steps=len(curve))

    def update_ratio(self) -> float | None:
        """Median over sampled steps of the median per-layer ``||update|| / ||weight||``."""
        per_step = []
        for _, stats in self.samples:
            found = [(s.get("grad") or {}).get("update_ratio") for s in stats.values()]
            rs = [float(r) for r in found if r is not None and math.isfinite(float(r)) and r > 0]
            if rs:
                per_step.append(statistics.median(rs))
        return statistics.median(per_step) if per_step else None

    def constant_lr(self) -> float | None:
        """The learning rate when it never changed over the run, else None."""
        lrs = self.lrs()
        if not lrs or max(lrs) > min(lrs) * 1.0001:
            return None
        return lrs[0]

    def early_instability(self) -> EarlyRise | None:
        """In the first 20% of the steps (at most 200), the smoothed loss climbed back up from its
        low so far by 20%+ of the starting loss."""
        finite = [(s, v) for s, v in self.losses() if math.isfinite(v)]
        if len(finite) < 30:
            return None
        early = early_rise(finite[: max(10, min(200, len(finite) // 5))])
        return early if early is not None and early.rise >= 0.2 else None

    def stalled_high(self) -> dict[str, float] | None:
        """The smoothed loss of the last third is no lower than the middle third's while still
        above half the starting loss: training stopped far from converged."""
        curve = [v for _, v in self.smoothed()]
        if len(curve) < 30:
            return None
        k = len(curve) // 3
        start, mid, last = (statistics.fmean(curve[:3]), statistics.fmean(curve[k:2 * k]),
                            statistics.fmean(curve[2 * k:]))
        if last < 0.97 * mid or last < 0.5 * start:
            return None
        return {"start_loss": start, "middle_loss": mid, "last_loss": last}

    def stalled_tail(self) -> StalledTail | None:
        """The last 30% of the run made under 5% of the run's progress while the step loss stays
        noisy (std 10%+ of its level) well above zero: a floor that a lower rate would lower."""
        finite = [v for _, v in self.losses() if math.isfinite(v)]
        if len(finite) < 200:
            return None
        n = max(len(finite) // 20, 5)
        start = statistics.fmean(finite[:n])
        tail = finite[-int(0.3 * len(finite)):]
        third = max(len(tail) // 3, 1)
        a, b = statistics.fmean(tail[:third]), statistics.fmean(tail[-third:])
        level = statistics.fmean(tail)
        noise = statistics.pstdev(tail) / max(level, 1e-12)
        progress = (a - b) / max(start - b, 1e-12)
        if start <= b or progress >= 0.05 or noise < 0.1 or level < 0.05 * start:
            return None
        return StalledTail(start_loss=start, tail_loss=level, tail_noise=noise, tail_progress=progress,
                           tail_steps=len(tail))


def early_rise(losses: list[tuple[int, float]]) -> EarlyRise | None:
    """The largest climb of the smoothed loss (bias-corrected EMA, beta 0.8) above its running
    low, as a fraction of the starting loss (the first value)."""
    if len(losses) < 5:
        return None
    avg, low, low_step = 0.0, math.inf, 0
    best: EarlyRise | None = None
    start = losses[0][1]
    for i, (s, v) in enumerate(losses):
        avg = 0.8 * avg + 0.2 * v
        sm = avg / (1 - 0.8 ** (i + 1))
        if math.isfinite(low) and start > 0 and (best is None or (sm - low) / start > best.rise):
            best = EarlyRise(rise=(sm - low) / start, peak_step=s, peak_loss=sm, low_step=low_step, low_loss=low,
                             start_loss=start)
        if sm < low:
            low, low_step = sm, s
    return best


def _rise_onset(curve: list[tuple[int, float]], start: float) -> tuple[int, float, int, float, int] | None:
    """Where the smoothed loss first climbed back above its low, and its peak after that:
    (onset step, low before it, its step, peak loss, its step)."""
    low, low_step, onset, peak, peak_step = math.inf, 0, None, -math.inf, 0
    low_before, low_before_step = math.nan, 0
    for s, v in curve:
        if onset is None:
            progress = max(start - low, 0.1 * start) if math.isfinite(low) else 0.1 * start
            if math.isfinite(low) and v > low + 0.5 * progress and v > 1.2 * low:
                onset, low_before, low_before_step = s, low, low_step
        if v > peak and onset is not None:
            peak, peak_step = v, s
        if v < low:
            low, low_step = v, s
    if onset is None:
        return None
    return onset, low_before, low_before_step, peak, peak_step
