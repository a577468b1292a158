"""Per-layer pruning sensitivity: prune each layer alone, measure the metric drop, set ratios.

Layers whose removal costs little metric are cut harder, sensitive ones are spared; the
parameter-weighted mean ratio stays at the requested one, so the model shrinks by about as
much as a uniform cut would.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ._prune import prunable_layers, prune_structured

__all__ = ["LayerSensitivity", "layer_sensitivity", "ratios_from_sensitivity"]


@dataclass(frozen=True)
class LayerSensitivity:
    """The metric drop (baseline minus pruned, in metric units) when ``layer`` alone is cut by ``ratio``."""

    layer: str
    params: int
    ratio: float
    drop: float
    #: What the layer is, for a reader: ``Conv2d 16→32 3x3``, ``Linear 256→64`` (its module path
    #: alone is ``0``, ``5``, ``10`` in an ``nn.Sequential``).
    module: str = ""


def describe_layer(layer: nn.Module) -> str:
    """The layer's type and shape, as a chart labels it: ``Conv2d 16→32 3x3``, ``Linear 256→64``."""
    kind = type(layer).__name__
    if isinstance(layer, nn.modules.conv._ConvNd):
        size = "x".join(str(k) for k in layer.kernel_size)
        return f"{kind} {layer.in_channels}→{layer.out_channels} {size}"
    if isinstance(layer, nn.Linear):
        return f"{kind} {layer.in_features}→{layer.out_features}"
    return kind


def layer_sensitivity(
    model: nn.Module,
    example: Any,
    *,
    ratio: float,
    baseline: float,
    score: Callable[[nn.Module], float],
    importance: str = "l2",
    ignored: Sequence[nn.Module] = (),
    round_to: int | None = None,
    taylor_loss: Callable[[nn.Module], Any] | None = None,
) -> list[LayerSensitivity]:
    """Prune each prunable, not ignored layer alone by ``ratio``; ``score`` is higher-is-better."""
    skip = {id(m) for m in ignored}
    out: list[LayerSensitivity] = []
    for name, layer in prunable_layers(model).items():
        if id(layer) in skip:
            continue
        trial = copy.deepcopy(model)
        target = dict(trial.named_modules())[name]
        trial_ignored = [dict(trial.named_modules())[n] for n, m in model.named_modules() if id(m) in skip]
        prune_structured(trial, example, 0.0, importance=importance, ignored=trial_ignored,
                         round_to=round_to, ratio_dict={target: ratio}, taylor_loss=taylor_loss)
        out.append(LayerSensitivity(layer=name, params=sum(p.numel() for p in layer.parameters()),
                                    ratio=ratio, drop=baseline - score(trial), module=describe_layer(layer)))
    return out


def ratios_from_sensitivity(
    sens: Sequence[LayerSensitivity], target: float, *, floor: float = 0.0, ceiling: float = 0.9,
    eps: float = 0.01,
) -> dict[str, float]:
    """Per-layer ratios inversely proportional to ``drop + eps``, clipped to [floor, ceiling],
    scaled so that their parameter-weighted mean equals ``target``.

    ``eps`` (metric units: 0.01 = one accuracy point) keeps a free layer from taking the whole cut.
    """
    if not sens:
        return {}
    weights = {s.layer: 1.0 / (max(s.drop, 0.0) + eps) for s in sens}
    size = {s.layer: max(s.params, 1) for s in sens}
    total = sum(size.values())
    scale = target * total / sum(weights[k] * size[k] for k in weights)
    ratios: dict[str, float] = {}
    for _ in range(20):  # scale, clip, rescale the layers that are not clipped
        ratios = {k: min(max(w * scale, floor), ceiling) for k, w in weights.items()}
        mean = sum(ratios[k] * size[k] for k in ratios) / total
        if abs(mean - target) < 1e-4:
            break
        free = [k for k in ratios if floor < ratios[k] < ceiling]
        if not free:
            break
        free_mass = sum(ratios[k] * size[k] for k in free)
        scale *= 1.0 + (target - mean) * total / max(free_mass, 1e-12)
    return ratios
