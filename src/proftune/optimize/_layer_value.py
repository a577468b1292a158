"""What each layer costs (time, params, MACs from the Profile) beside what it contributes.

The contribution is measured by mean ablation: a forward hook replaces the layer's output by
its mean over the batch, so the layer passes on no information about the sample; the metric
drop on the validation data is what the layer's per-sample computation is worth.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from .._records import JsonRecord
from ..profile import Profile
from ..task import Task
from ..train import evaluate_model

__all__ = ["LayerFinding", "LayerValue", "layer_values", "mean_ablation_hook"]

#: A layer whose time share is this many times its value share (and at least MIN_TIME_SHARE
#: of the step) costs much more than it contributes.
COST_RATIO = 2.0
MIN_TIME_SHARE = 0.10


@dataclass(frozen=True)
class LayerValue(JsonRecord):
    """One layer: its measured costs and its measured contribution to the metric."""

    WHAT: ClassVar[str] = "a layer value"

    name: str
    type: str
    params: int
    macs: int
    time_share: float | None
    params_share: float | None
    macs_share: float | None
    #: Metric drop (in metric units, positive = worse) when the output is replaced by its mean.
    drop: float
    #: ``drop`` over the sum of the drops of all layers measured (0..1).
    value_share: float
    finding: str | None = None
    action: str | None = None


@dataclass(frozen=True)
class LayerFinding(JsonRecord):
    """A layer that costs far more time than it is worth, and what to do about it."""

    WHAT: ClassVar[str] = "a layer finding"
    layer: str
    finding: str
    action: str | None = None


def mean_ablation_hook(_module: nn.Module, _inputs: Any, output: Any) -> Any:
    """Forward hook: the output replaced by its mean over the batch (dim 0), same shape."""
    if isinstance(output, torch.Tensor) and output.dim() >= 1 and output.is_floating_point():
        return output.mean(dim=0, keepdim=True).expand_as(output).contiguous()
    return output


def _candidates(model: nn.Module, prof: Profile | None) -> list[tuple[str, nn.Module]]:
    """Layers with parameters (leaves), in model order; those the profile times when it has them."""
    timed = {lp.name for lp in prof.layers} if prof is not None else set()
    out = []
    for name, module in model.named_modules():
        if not name or any(True for _ in module.children()):
            continue
        if not any(True for _ in module.parameters(recurse=False)):
            continue
        if timed and name not in timed:
            continue
        out.append((name, module))
    return out


def _advice(layer_type: str) -> str:
    if layer_type == "Linear":
        return ("shrink it or prune its output features (structured); a large FC head after "
                "convolutions is usually replaced by global average pooling + a small Linear")
    if layer_type.startswith("Conv"):
        return "prune its output channels (structured pruning) or narrow the block"
    if "Norm" in layer_type:
        return "fuse it with the layer before it for inference (torch.compile / conv-bn folding)"
    return "shrink or remove it and re-measure"


def layer_values(task: Task, model: nn.Module, *, metric: str, higher_is_better: bool,
                 profile: Profile | None, device: torch.device, batch_size: int,
                 deadline: float | None = None) -> tuple[float, list[LayerValue], list[str]]:
    """(baseline metric, one LayerValue per layer, notes); stops measuring at ``deadline``."""
    model = model.to(device).eval()
    base = float(evaluate_model(task, model, device, batch_size)[metric])
    notes: list[str] = []
    by_name = {lp.name: lp for lp in profile.layers} if profile is not None else {}
    drops: list[tuple[str, nn.Module, float]] = []
    for name, module in _candidates(model, profile):
        if deadline is not None and time.monotonic() >= deadline:
            notes.append(f"time budget spent: layers after {drops[-1][0] if drops else 'none'} not measured")
            break
        handle = module.register_forward_hook(mean_ablation_hook)
        try:
            value = float(evaluate_model(task, model, device, batch_size)[metric])
        finally:
            handle.remove()
        drop = (base - value) if higher_is_better else (value - base)
        drops.append((name, module, drop if math.isfinite(drop) else float("inf")))
    total = sum(max(d, 0.0) for _, _, d in drops if math.isfinite(d)) or 1.0
    out: list[LayerValue] = []
    for name, module, drop in drops:
        lp = by_name.get(name)
        share = min(max(drop, 0.0) / total, 1.0) if math.isfinite(drop) else 1.0
        tshare = lp.time_share if lp is not None else None
        ltype = lp.type if lp is not None else type(module).__name__
        finding = action = None
        if lp is not None and tshare is not None and tshare >= MIN_TIME_SHARE and tshare >= COST_RATIO * share:
            finding = (f"{name} ({ltype}) takes {tshare:.0%} of the step time, "
                       f"{(lp.params_share or 0):.0%} of the params and {(lp.macs_share or 0):.0%} of "
                       f"the MACs, but replacing its output by its mean costs only {drop:.4g} {metric} "
                       f"({share:.0%} of the measured contribution)")
            action = _advice(ltype)
        out.append(LayerValue(
            name=name, type=ltype, params=int(lp.params if lp is not None else
                                              sum(p.numel() for p in module.parameters())),
            macs=int(lp.macs if lp is not None else 0), time_share=tshare,
            params_share=lp.params_share if lp is not None else None,
            macs_share=lp.macs_share if lp is not None else None,
            drop=drop, value_share=share, finding=finding, action=action))
    return base, out, notes


def keep_layers(values: Sequence[LayerValue]) -> list[str]:
    """Layers worth more than they cost: a large value share at a small time share."""
    return [v.name for v in values
            if v.value_share >= 0.25 and (v.time_share or 0.0) * COST_RATIO <= v.value_share]
