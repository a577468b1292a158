"""Saturated activations: sigmoid/tanh layers whose outputs sit in their flat tails, where the
derivative is below 1% of its peak and almost no gradient flows back."""

from __future__ import annotations

import statistics

from .._findings import Finding
from .._history import History
from ._base import BaseCheck, fmt

#: A layer is saturated when this fraction of its outputs or more is in the flat tails.
SATURATED_FRAC = 0.5
#: Standardised inputs have an RMS of about 1; this much more points at the data.
LARGE_INPUT_RMS = 10.0


class SaturatedActivations(BaseCheck):
    cause = "saturated_activations"
    explains = ("vanishing_gradients", "lr_too_low", "slow_convergence")

    def check(self, history: History) -> Finding | None:
        per_layer = _per_layer(history)
        hidden = {k: v for k, v in per_layer.items() if not _is_output(history, k)}
        if not hidden:
            return None
        means = {k: statistics.fmean(f for _, f, _ in v) for k, v in hidden.items()}
        layer = max(means, key=means.__getitem__)
        if means[layer] < SATURATED_FRAC:
            return None
        rows = hidden[layer]
        onset = next(s for s, f, _ in rows if f >= SATURATED_FRAC)
        first_step = min(history.saturation)
        at_init = onset == first_step
        kind = rows[0][2]
        tail = "|y| > 0.99" if kind == "Tanh" else "y < 0.01 or y > 0.99"
        before = _layer_before(history, layer)
        x_rms = history.input_rms.get(first_step)
        evidence: dict[str, object] = {"saturated_frac": means[layer], "type": kind, "sampled_steps": len(rows),
                                       "per_layer": means, "saturated_from_init": at_init,
                                       "layer_before": before, "input_rms": x_rms}
        summary = (f"{kind} outputs of {layer} sit in the flat tails ({tail}, derivative < 1% of its peak) "
                   f"{means[layer]:.0%} of the time, from step {onset}{' (at init)' if at_init else ''}")
        if x_rms is not None and x_rms >= LARGE_INPUT_RMS:
            summary += f"; the inputs are not standardised (RMS {fmt(x_rms)}, standardised: about 1)"
            fix = ("standardise the inputs (zero mean, unit variance per feature); then keep the "
                   "layers' default or Xavier init")
        else:
            fix = (f"initialise {before or 'the layer before it'} with nn.init.xavier_uniform_ (gain "
                   f"{'5/3' if kind == 'Tanh' else '1'}), add LayerNorm/BatchNorm before the activation, "
                   "lower the learning rate, or use ReLU/GELU")
        severity = "error" if means[layer] >= 0.9 else "warning"
        return Finding(self.cause, severity, summary, fix, evidence, 0.9 if at_init else 0.7,
                       step=onset, layer=layer, root=at_init)


def _per_layer(history: History) -> dict[str, list[tuple[int, float, str]]]:
    out: dict[str, list[tuple[int, float, str]]] = {}
    for step in sorted(history.saturation):
        for name, s in history.saturation[step].items():
            out.setdefault(name, []).append((step, float(s["saturated_frac"]), str(s["type"])))
    return out


def _forward_order(history: History) -> list[str]:
    return list(history.samples[0][1]) if history.samples else list(history.types)


def _is_output(history: History, layer: str) -> bool:
    """No weight layer runs after ``layer``: it is the model's output activation (a sigmoid
    output of a well-trained binary classifier is saturated, and should be)."""
    order = _forward_order(history)
    if layer not in order:
        return False
    return not any(n in history.fan_in for n in order[order.index(layer) + 1:])


def _layer_before(history: History, layer: str) -> str | None:
    order = _forward_order(history)
    if layer not in order:
        return None
    return next((n for n in reversed(order[:order.index(layer)]) if n in history.fan_in), None)
