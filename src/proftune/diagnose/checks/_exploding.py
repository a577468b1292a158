"""Exploding gradients: the gradient norm jumps far above its running median, grows step over step
until it is non-finite, or every layer is initialised so large that activations grow with depth."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..._records import JsonRecord
from ...profile import LayerStatistics
from .._findings import Finding
from .._history import History, LayerSample, NonFinite, StepRecord, grad_norm
from ._base import BaseCheck, fmt

#: std * sqrt(fan_in) of PyTorch's default init of Linear/Conv (kaiming_uniform, a=sqrt(5)).
DEFAULT_INIT_SCALE = 1.0 / math.sqrt(3.0)
#: std * sqrt(fan_in) of He (Kaiming) init for ReLU, the largest of the standard inits.
HE_SCALE = math.sqrt(2.0)
#: A network whose activations grow this much from the input to its last weight layer at the
#: first step is over-scaled (a He-initialised ReLU net keeps them about constant).
OVERSCALE_GAIN = 100.0


@dataclass(frozen=True)
class Growth(JsonRecord):
    """The gradient norm grew ``ratio`` times from ``from_norm`` at ``from_step`` to ``grad_norm`` at ``step``."""

    step: int
    grad_norm: float
    from_step: int
    from_norm: float
    ratio: float


@dataclass(frozen=True)
class Culprit(JsonRecord):
    """A layer initialised ``times_reference`` times the scale (std * sqrt(fan_in)) of the others."""

    layer: str
    type: str | None
    weight_scale: float
    reference_scale: float
    times_reference: float
    activation_gain: float | None
    sampled_step: int


@dataclass(frozen=True)
class Overscale(JsonRecord):
    """Every weight layer initialised above He scale: activations grow ``gain`` times to ``last_layer``."""

    layers: int
    median_scale: float
    times_he: float
    gain: float
    gain_per_layer: float
    last_layer: str
    sampled_step: int


@dataclass(frozen=True)
class LayerGrowth(JsonRecord):
    """A layer's gradient norm at ``sampled_step`` against the median of its earlier samples."""

    layer: str
    grad_norm: float
    baseline: float
    ratio: float
    sampled_step: int


class ExplodingGradients(BaseCheck):
    cause = "exploding_gradients"
    explains = (
        "lr_too_high",
        "nan_inf",
        "dead_units",
        "lr_too_low",
        "oscillating_loss",
        "saturated_activations",
        "no_warmup",
    )

    def check(self, history: History) -> Finding | None:
        spikes = history.spikes()
        growth = early_growth(history)
        culprit = _culprit(history)
        overscale = None if culprit else _overscale(history)
        nf = history.nonfinite
        grads_nonfinite = nf is not None and nf.get("phase") == "backward"
        if not (spikes or growth or grads_nonfinite or overscale or culprit):
            return None
        peak = max(spikes, key=lambda r: r["ratio"]) if spikes else None
        jumps = _loss_jumps(history, spikes)
        if peak is not None and not (culprit or overscale or growth or grads_nonfinite):
            early = [r["grad_norm"] for r in history.steps[:10] if math.isfinite(r["grad_norm"])]
            felt = jumps >= max(2, len(spikes) / 2)
            if not felt and (peak["ratio"] < 3 * history.spike_factor
                             or (early and peak["grad_norm"] < 0.1 * statistics.median(early))):
                return None  # spikes the loss did not feel, or off a near-zero median late in training
        evidence: dict[str, object] = {"spikes": len(spikes), "spikes_with_loss_jump": jumps,
                                       "spike_factor": history.spike_factor,
                                       "first_grad_norms": [r["grad_norm"] for r in history.steps[:5]]}
        if peak is not None:
            first = spikes[0]
            evidence.update(first_spike_step=first["step"], first_spike_grad_norm=first["grad_norm"],
                            running_median=first["median"], first_spike_ratio=first["ratio"],
                            max_ratio=peak["ratio"], max_ratio_step=peak["step"])
        if growth:
            evidence["early_growth"] = growth.to_dict()
        if nf is not None:
            evidence["nonfinite_step"] = nf["step"]
        onset = min(s for s in (spikes[0]["step"] if spikes else None, growth.step if growth else None,
                                nf["step"] if grads_nonfinite and nf else None) if s is not None) \
            if (spikes or growth or grads_nonfinite) else 1
        what = _what_happened(history, peak, growth, nf)
        layer = None
        if culprit:
            evidence["culprit"] = culprit.to_dict()
            layer = culprit.layer
            summary = (f"layer {layer} ({culprit.type}) is initialised at {fmt(culprit.times_reference)}x "
                       f"the scale of the other layers (std*sqrt(fan_in) {fmt(culprit.weight_scale)} vs "
                       f"{fmt(culprit.reference_scale)}); {what}")
            fix = (f"re-initialise {layer} at the default scale (e.g. nn.init.kaiming_uniform_); "
                   "clip gradients (grad_clip, proftune.GradGuard) as a guard")
            onset = min(onset, culprit.sampled_step)
        elif overscale:
            evidence["overscale"] = overscale.to_dict()
            layer = overscale.last_layer
            summary = (f"the {overscale.layers} weight layers are initialised at {fmt(overscale.times_he)}x "
                       f"He scale (median std*sqrt(fan_in) {fmt(overscale.median_scale)}; He {fmt(HE_SCALE)}, "
                       f"PyTorch's default {fmt(DEFAULT_INIT_SCALE)}): activations grow "
                       f"{fmt(overscale.gain_per_layer)}x per layer, {fmt(overscale.gain)}x from the input "
                       f"to the output of layer {layer} at step {overscale.sampled_step}; {what}")
            fix = ("initialise at He scale (nn.init.kaiming_normal_(weight, nonlinearity='relu')) or keep "
                   "PyTorch's default init, or add normalisation layers; clip gradients "
                   "(grad_clip, proftune.GradGuard) as a guard")
            onset = min(onset, overscale.sampled_step)
        else:
            where = _first_layer_of_spike(history, spikes[0]["step"]) if spikes else None
            if where:
                evidence["first_layer"] = where.to_dict()
                layer = where.layer
            summary = what + (f"; the first layer to grow was {layer}" if layer else "")
            fix = ("clip gradients (param grad_clip or proftune.GradGuard), lower the learning rate, "
                   "or add normalisation")
        big = (peak is not None and peak["ratio"] >= 100) or growth is not None
        severity = "error" if culprit or overscale or grads_nonfinite or big or nf is not None else "warning"
        confidence = 0.9 if culprit or overscale else 0.75 if (growth or grads_nonfinite) else 0.6
        return Finding(self.cause, severity, summary, fix, evidence, confidence, step=onset, layer=layer,
                       root=bool(culprit or overscale))


def _what_happened(history: History, peak: Any, growth: Growth | None, nf: NonFinite | None) -> str:
    """The gradient-norm story of the run in one clause, with steps and values."""
    parts = []
    if growth:
        parts.append(f"the gradient norm grew from {fmt(growth.from_norm)} at step {growth.from_step} "
                     f"to {fmt(growth.grad_norm)} at step {growth.step} ({fmt(growth.ratio)}x)")
    if peak is not None:
        n = len(history.spikes())
        parts.append(f"the gradient norm jumped to {fmt(peak['grad_norm'])} at step {peak['step']}, "
                     f"{fmt(peak['ratio'])}x its running median of {fmt(peak['median'])}"
                     + (f" ({n} steps at >= {fmt(history.spike_factor)}x)" if n > 1 else ""))
    if nf is not None:
        where = f" in layer {nf['layer']}" if nf.get("layer") else ""
        parts.append(f"{'gradients' if nf.get('phase') == 'backward' else 'values'} turned non-finite "
                     f"at step {nf['step']}{where}")
    if not parts:
        first = next((r for r in history.steps if math.isfinite(r["grad_norm"])), None)
        return (f"the gradient norm was {fmt(first['grad_norm'])} at step {first['step']}" if first
                else "no finite gradient norm was recorded")
    return "; ".join(parts)


def _loss_jumps(history: History, spikes: list[Any]) -> int:
    """Spikes after which the loss of the next 3 steps averaged 1.5x or more the median of the 10
    steps before: spikes the training felt."""
    loss = {r["step"]: r["loss"] for r in history.steps}
    n = 0
    for r in spikes:
        before = [loss[s] for s in range(r["step"] - 10, r["step"]) if s in loss and math.isfinite(loss[s])]
        after = [loss[s] for s in range(r["step"] + 1, r["step"] + 4) if s in loss]
        if before and after and (not all(math.isfinite(v) for v in after)
                                 or statistics.fmean(after) >= 1.5 * statistics.median(before)):
            n += 1
    return n


def early_growth(history: History) -> Growth | None:
    """Before the running median exists (or before a non-finite step), the gradient norm grew
    ``spike_factor`` times over its first value: an explosion too fast for the median."""
    first: StepRecord | None = None
    end = history.nonfinite["step"] if history.nonfinite else math.inf
    for r in history.steps:
        if r["step"] >= end or (math.isfinite(r["median"]) and first is not None):
            break
        g = r["grad_norm"]
        if not math.isfinite(g) or g <= 0:
            continue
        if first is None:
            first = r
            continue
        if g >= history.spike_factor * first["grad_norm"]:
            return Growth(step=r["step"], grad_norm=g, from_step=first["step"], from_norm=first["grad_norm"],
                          ratio=g / first["grad_norm"])
    return None


def _scales(history: History) -> tuple[int, dict[str, LayerStatistics], dict[str, float]] | None:
    """std * sqrt(fan_in) of every Linear/Conv layer at the first sampled step."""
    if not history.samples:
        return None
    step, stats = history.samples[0]
    scales: dict[str, float] = {}
    for name, s in stats.items():
        w = s.get("weight") or {}
        if name in history.fan_in and "std" in w and math.isfinite(w["std"]):
            scales[name] = float(w["std"]) * math.sqrt(history.fan_in[name])
    return step, stats, scales


def _culprit(history: History) -> Culprit | None:
    """A Linear/Conv layer whose weights are far off the scale of the others at the first sample,
    and the activation gain it brings."""
    found = _scales(history)
    if found is None:
        return None
    step, stats, scales = found
    for name, scale in scales.items():
        others = [v for k, v in scales.items() if k != name]
        ref = statistics.median(others) if others else DEFAULT_INIT_SCALE
        if scale >= 10 * DEFAULT_INIT_SCALE and scale >= 10 * ref:
            return Culprit(layer=name, type=history.types.get(name), weight_scale=scale, reference_scale=ref,
                           times_reference=scale / ref, activation_gain=_gain(history, stats, name, step),
                           sampled_step=step)
    return None


def _rms(act: Mapping[str, float]) -> float | None:
    if "std" not in act or not math.isfinite(float(act["std"])):
        return None
    return math.sqrt(float(act["std"]) ** 2 + float(act.get("mean", 0.0)) ** 2)


def _overscale(history: History) -> Overscale | None:
    """Every weight layer initialised above He scale, with activations growing through the depth
    by :data:`OVERSCALE_GAIN` or more at the first sampled step."""
    found = _scales(history)
    if found is None:
        return None
    step, stats, scales = found
    if len(scales) < 3:
        return None
    median = statistics.median(scales.values())
    x_rms = history.input_rms.get(step)
    weight_layers = [n for n in stats if n in scales and _rms(stats[n].get("activation") or {})]
    if median < 2 * HE_SCALE or not x_rms or len(weight_layers) < 3:
        return None
    last = weight_layers[-1]
    gain = (_rms(stats[last].get("activation") or {}) or 0.0) / x_rms
    if gain < OVERSCALE_GAIN:
        return None
    return Overscale(layers=len(scales), median_scale=median, times_he=median / HE_SCALE, gain=gain,
                     gain_per_layer=gain ** (1 / len(weight_layers)), last_layer=last, sampled_step=step)


def _gain(history: History, stats: dict[str, LayerStatistics], layer: str, step: int) -> float | None:
    """RMS of ``layer``'s output over the RMS of the layer before it in forward order."""
    prev: float | None = history.input_rms.get(step)
    for name, s in stats.items():
        rms = _rms(s.get("activation") or {})
        if rms is None:
            continue
        if name == layer:
            return rms / prev if prev else None
        prev = rms
    return None


def _first_layer_of_spike(history: History, spike_step: int) -> LayerGrowth | None:
    """At the first sampled step at or after the spike, the first layer (forward order) whose
    gradient norm grew most against its own earlier median."""
    before = [(s, st) for s, st in history.samples if s < spike_step]
    after = [(s, st) for s, st in history.samples if s >= spike_step]
    if not before or not after:
        return None
    step, stats = after[0]
    best: LayerGrowth | None = None
    for name, s in stats.items():
        found = _layer_growth(name, s, before, step)
        if found is None:
            continue
        if found.ratio >= history.spike_factor:
            return found
        if best is None or found.ratio > best.ratio:
            best = found
    return best


def _layer_growth(name: str, stats: LayerStatistics, before: list[LayerSample], step: int) -> LayerGrowth | None:
    g = (stats.get("grad") or {}).get("norm")
    base = [grad_norm(st[name]) for _, st in before if name in st]
    base = [b for b in base if math.isfinite(b) and b > 0]
    if g is None or not base or not math.isfinite(float(g)):
        return None
    median = statistics.median(base)
    return LayerGrowth(layer=name, grad_norm=float(g), baseline=median, ratio=float(g) / median, sampled_step=step)
