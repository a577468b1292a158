"""Exploding gradients: the global gradient norm spikes far above its running median."""

from __future__ import annotations

import math
import statistics
from typing import Any

from .._findings import Finding
from .._history import History, LayerSample
from ._base import BaseCheck, fmt

#: std * sqrt(fan_in) of PyTorch's default init of Linear/Conv (kaiming_uniform, a=sqrt(5)).
DEFAULT_INIT_SCALE = 1.0 / math.sqrt(3.0)


class ExplodingGradients(BaseCheck):
    cause = "exploding_gradients"

    def check(self, history: History) -> Finding | None:
        spikes = history.spikes()
        culprit = _culprit(history)
        nf = history.nonfinite
        grads_nonfinite = nf is not None and nf.get("phase") == "backward"
        if not spikes and not grads_nonfinite:
            return None
        if (not culprit and len(spikes) < 2 and not grads_nonfinite
                and max(r["ratio"] for r in spikes) < 3 * history.spike_factor):
            return None
        first: dict[str, Any] = (dict(spikes[0]) if spikes else  # no spike: the grads went NaN
                                 {"step": nf["step"], "grad_norm": math.inf,  # type: ignore[index]
                                  "median": math.nan, "ratio": math.inf})
        peak: dict[str, Any] = dict(max(spikes, key=lambda r: r["ratio"])) if spikes else first
        evidence: dict[str, Any] = {"spikes": len(spikes), "first_spike_grad_norm": first["grad_norm"],
                                    "running_median": first["median"], "first_spike_ratio": first["ratio"],
                                    "max_ratio": peak["ratio"], "max_ratio_step": peak["step"],
                                    "spike_factor": history.spike_factor}
        layer = None
        if culprit:
            evidence["culprit"] = culprit
            layer = culprit["layer"]
            summary = (f"gradient norm spiked to {fmt(peak['ratio'])}x its running median (step {peak['step']}); "
                       f"layer {layer} ({culprit['type']}) has weights {fmt(culprit['times_reference'])}x the scale "
                       f"of the other layers (std*sqrt(fan_in) {fmt(culprit['weight_scale'])})")
            fix = (f"re-initialise {layer} at the default scale (e.g. nn.init.kaiming_uniform_); "
                   "clip gradients (grad_clip, proftune.GradGuard) as a guard")
        else:
            where = _first_layer_of_spike(history, first["step"])
            if where:
                evidence["first_layer"] = where
                layer = where["layer"]
            summary = (f"{len(spikes)} gradient norm spikes, up to {fmt(peak['ratio'])}x the running median "
                       f"(first at step {first['step']}{', starting in layer ' + layer if layer else ''})")
            fix = "clip gradients (param grad_clip or proftune.GradGuard), lower the learning rate, or add normalisation"
        severity = "error" if culprit or grads_nonfinite or peak["ratio"] >= 100 else "warning"
        return Finding(self.cause, severity, summary, fix, evidence, 0.9 if culprit else 0.6,
                       step=first["step"], layer=layer, root=bool(culprit))


def _culprit(history: History) -> dict[str, Any] | None:
    """A Linear/Conv layer whose weights are far off the default init scale at the first sample,
    and the activation gain it brings."""
    if not history.samples:
        return None
    step, stats = history.samples[0]
    scales: dict[str, float] = {}
    for name, s in stats.items():
        w = s.get("weight") or {}
        if name in history.fan_in and "std" in w and math.isfinite(w["std"]):
            scales[name] = float(w["std"]) * math.sqrt(history.fan_in[name])
    for name, scale in scales.items():
        others = [v for k, v in scales.items() if k != name]
        ref = statistics.median(others) if others else DEFAULT_INIT_SCALE
        if scale >= 10 * DEFAULT_INIT_SCALE and scale >= 10 * ref:
            return {"layer": name, "type": history.types.get(name), "weight_scale": scale,
                    "reference_scale": ref, "times_reference": scale / ref,
                    "activation_gain": _gain(history, stats, name, step), "sampled_step": step}
    return None


def _gain(history: History, stats: dict[str, dict[str, Any]], layer: str, step: int) -> float | None:
    """RMS of ``layer``'s output over the RMS of the layer before it in forward order."""
    prev: float | None = history.input_rms.get(step)
    for name, s in stats.items():
        act = s.get("activation") or {}
        if "std" not in act:
            continue
        rms = math.sqrt(float(act["std"]) ** 2 + float(act.get("mean", 0.0)) ** 2)
        if name == layer:
            return rms / prev if prev else None
        prev = rms
    return None


def _first_layer_of_spike(history: History, spike_step: int) -> dict[str, Any] | None:
    """At the first sampled step at or after the spike, the first layer (forward order) whose
    gradient norm grew most against its own earlier median."""
    before = [(s, st) for s, st in history.samples if s < spike_step]
    after = [(s, st) for s, st in history.samples if s >= spike_step]
    if not before or not after:
        return None
    step, stats = after[0]
    best: dict[str, Any] | None = None
    for name, s in stats.items():
        found = _layer_growth(name, s, before, step)
        if found is None:
            continue
        if found["ratio"] >= history.spike_factor:
            return found
        if best is None or found["ratio"] > best["ratio"]:
            best = found
    return best


def _layer_growth(name: str, stats: dict[str, Any], before: list[LayerSample], step: int) -> dict[str, Any] | None:
    g = (stats.get("grad") or {}).get("norm")
    base = [float((st.get(name, {}).get("grad") or {}).get("norm", math.nan)) for _, st in before]
    base = [b for b in base if math.isfinite(b) and b > 0]
    if g is None or not base or not math.isfinite(float(g)):
        return None
    median = statistics.median(base)
    return {"layer": name, "grad_norm": float(g), "baseline": median, "ratio": float(g) / median,
            "sampled_step": step}
