"""What each layer costs (time, params, MACs from the Profile) beside what it contributes.

The contribution is measured by mean ablation: a forward hook replaces the layer's output by
its mean over the batch, so the layer passes on no information about the sample; the metric
drop on the validation data is what the layer's per-sample computation is worth. The tensors
inside any output structure are replaced (an RNN's ``(output, h)``, a PackedSequence, a dict);
where none can be, the layer is reported as not measured, never as worth nothing (a GRU that
carried the model once read "costs only 0 accuracy" and was advised for removal).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils._pytree import tree_flatten

from .._records import JsonRecord
from ..profile import LayerProfile, Profile
from ..task import Task
from ..train import evaluate_model

__all__ = ["LayerFinding", "LayerValue", "MeanAblation", "layer_values", "mean_ablation_hook"]

#: A layer whose time share is this many times its value share (and at least MIN_TIME_SHARE
#: of the step) costs much more than it contributes.
COST_RATIO = 2.0
MIN_TIME_SHARE = 0.10
#: A layer without which the metric keeps at most this share of the model's gain over its constant
#: prediction (chance) is one the model cannot work without.
ESSENTIAL_LEFT = 0.25


@dataclass(frozen=True)
class LayerValue(JsonRecord):
    """One layer: its measured costs and its measured contribution to the metric."""

    WHAT: ClassVar[str] = "a layer value"

    name: str
    type: str
    params: int
    macs: int
    #: Its share of the step's forward+backward time (the profile's: at its fastest timed step), and
    #: the middle half of its per-step times on that scale: a finding needs the share beyond noise.
    time_share: float | None
    params_share: float | None
    macs_share: float | None
    #: Metric drop (in metric units, positive = worse) when the output is replaced by its mean.
    drop: float
    #: ``drop`` over the sum of the drops of all layers measured (0..1).
    value_share: float
    finding: str | None = None
    action: str | None = None
    #: False: its output could not be replaced by a mean (``note`` says why); ``drop`` is then no measurement.
    measured: bool = True
    #: The model cannot work without it (``note`` says why): compression keeps it, no advice removes it.
    essential: bool = False
    note: str | None = None
    time_share_q1: float | None = None
    time_share_q3: float | None = None


@dataclass(frozen=True)
class LayerFinding(JsonRecord):
    """A layer that costs far more time than it is worth, and what to do about it."""

    WHAT: ClassVar[str] = "a layer finding"
    layer: str
    finding: str
    action: str | None = None


def _batch_size(module: nn.Module, inputs: Any) -> int | None:
    """The batch size of a layer's call, from its first input (a PackedSequence's first step,
    an RNN's batch dimension by ``batch_first``); None where no input is a tensor."""
    first = inputs[0] if isinstance(inputs, tuple) and inputs else inputs
    if isinstance(first, PackedSequence):
        return int(first.batch_sizes[0])
    if isinstance(module, nn.RNNBase) and isinstance(first, torch.Tensor):
        return int(first.size(0 if module.batch_first else 1)) if first.dim() == 3 else 1
    leaves = [t for t in tree_flatten(first)[0] if isinstance(t, torch.Tensor) and t.dim() >= 1]
    return int(leaves[0].size(0)) if leaves else None


class MeanAblation:
    """Forward hook: every floating tensor of the layer's output, in any structure (tuples such as
    an RNN's ``(output, h)``, lists, dicts, PackedSequence), replaced by its mean over the batch
    dimension, same shape, so that the layer passes on nothing about the sample. ``ablated``
    counts the tensors replaced, ``why`` says why none could be (then the layer is not measured)."""

    def __init__(self) -> None:
        self.ablated = 0
        self.why: str | None = None

    def __call__(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        batch = _batch_size(module, inputs)
        rnn = isinstance(module, nn.RNNBase)
        if batch is None or batch < 2:
            self.why = (f"a batch of {batch} sample(s) has no mean to replace it by" if batch is not None
                        else "its inputs hold no tensor to read the batch size from")
            return output
        new = self._replace(output, batch, dim=((0 if module.batch_first else 1) if rnn else None),
                            rest=1 if rnn else None)
        if not self.ablated:
            self.why = (f"its output ({type(output).__name__}) holds no floating tensor with the batch "
                        f"dimension ({batch})")
        return new

    def _replace(self, out: Any, batch: int, *, dim: int | None, rest: int | None) -> Any:
        """``out`` with its tensors ablated: ``dim`` for the first tensor met, ``rest`` for the others
        (an RNN's output, then its hidden states); None: the first dimension of the batch's size."""
        if isinstance(out, PackedSequence):  # its data holds every sample's steps: their mean
            if out.data.is_floating_point() and out.data.dim() >= 1:
                self.ablated += 1
                return out._replace(data=out.data.mean(dim=0, keepdim=True).expand_as(out.data).contiguous())
            return out
        if isinstance(out, torch.Tensor):
            d = dim if dim is not None else next((i for i in range(out.dim()) if out.size(i) == batch), None)
            if not out.is_floating_point() or d is None or d >= out.dim() or out.size(d) != batch:
                return out
            self.ablated += 1
            return out.mean(dim=d, keepdim=True).expand_as(out).contiguous()
        if isinstance(out, (tuple, list)):
            items = []
            for i, item in enumerate(out):
                items.append(self._replace(item, batch, dim=dim if i == 0 else rest, rest=rest))
            if isinstance(out, tuple) and hasattr(out, "_fields"):  # a named tuple
                return type(out)(*items)
            return type(out)(items)
        if isinstance(out, dict):
            replaced = {k: self._replace(v, batch, dim=None, rest=None) for k, v in out.items()}
            try:
                return type(out)(replaced)
            except TypeError:  # a mapping type built otherwise: a plain dict holds the same tensors
                return replaced
        return out


def mean_ablation_hook(module: nn.Module, inputs: Any, output: Any) -> Any:
    """Forward hook: the output's tensors replaced by their mean over the batch (see :class:`MeanAblation`)."""
    return MeanAblation()(module, inputs, output)


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


def _beyond_noise(layer: LayerProfile, value_share: float) -> bool:
    """Its share of the step is told from the load's noise (timed on two steps or more) and its share
    at its fastest clears both bars (a share read on one step states no finding)."""
    low = layer.time_share
    return (not layer.share_within_noise and low is not None and low >= MIN_TIME_SHARE
            and low >= COST_RATIO * value_share)


def _advice(layer_type: str) -> str:
    if layer_type == "Linear":
        return ("shrink it or prune its output features (structured); a large FC head after "
                "convolutions is usually replaced by global average pooling + a small Linear")
    if layer_type.startswith("Conv"):
        return "prune its output channels (structured pruning) or narrow the block"
    if "Norm" in layer_type:
        return "fuse it with the layer before it for inference (torch.compile / conv-bn folding)"
    return "shrink or remove it and re-measure"


def _ablated(task: Task, model: nn.Module, module: nn.Module, *, metric: str, device: torch.device,
             batch_size: int) -> tuple[float | None, str | None]:
    """(the metric with ``module``'s output replaced by its batch mean, None and why where the
    replacement could not be made)."""
    hook = MeanAblation()
    handle = module.register_forward_hook(hook)
    try:
        value = float(evaluate_model(task, model, device, batch_size)[metric])
    finally:
        handle.remove()
    if not hook.ablated:
        return None, hook.why or "its output was never replaced"
    return value, None


def _essential(name: str, module: nn.Module, value: float, *, base: float, chance: float | None,
               recurrent: int, higher_is_better: bool) -> str | None:
    """Why the model cannot work without this layer (None: it can): it is the model's only
    recurrent layer, or without it the metric falls most of the way to the model's own constant
    prediction (its output replaced by its mean: chance)."""
    if isinstance(module, nn.RNNBase) and recurrent == 1:
        return f"{name} is the model's only recurrent layer"
    if chance is None or not math.isfinite(value):
        return None
    gain = (base - chance) if higher_is_better else (chance - base)
    kept = (value - chance) if higher_is_better else (chance - value)
    if gain > 0 and kept <= ESSENTIAL_LEFT * gain:
        return (f"without it the metric falls to {value:.4g}, {1 - max(kept, 0.0) / gain:.0%} of the way from "
                f"{base:.4g} to the constant prediction's {chance:.4g}")
    return None


def layer_values(task: Task, model: nn.Module, *, metric: str, higher_is_better: bool,
                 profile: Profile | None, device: torch.device, batch_size: int,
                 deadline: float | None = None) -> tuple[float, list[LayerValue], list[str]]:
    """(baseline metric, one LayerValue per layer, notes); stops measuring at ``deadline``. A
    layer whose output could not be replaced is listed as not measured (never as worth 0), and a
    layer the model cannot work without gets no advice to remove it."""
    model = model.to(device).eval()
    base = float(evaluate_model(task, model, device, batch_size)[metric])
    chance, _ = _ablated(task, model, model, metric=metric, device=device, batch_size=batch_size)
    notes: list[str] = []
    by_name = {lp.name: lp for lp in profile.layers} if profile is not None else {}
    recurrent = sum(isinstance(m, nn.RNNBase) for m in model.modules())
    drops: list[tuple[str, nn.Module, float, str | None]] = []
    for name, module in _candidates(model, profile):
        if deadline is not None and time.monotonic() >= deadline:
            notes.append(f"time budget spent: layers after {drops[-1][0] if drops else 'none'} not measured")
            break
        value, why = _ablated(task, model, module, metric=metric, device=device, batch_size=batch_size)
        if value is None:
            notes.append(f"{name} ({type(module).__name__}) not measured: {why}")
            drops.append((name, module, math.nan, f"not measured: {why}"))
            continue
        drop = (base - value) if higher_is_better else (value - base)
        drops.append((name, module, drop if math.isfinite(drop) else float("inf"),
                      _essential(name, module, value, base=base, chance=chance, recurrent=recurrent,
                                 higher_is_better=higher_is_better)))
    total = sum(max(d, 0.0) for _, _, d, _ in drops if math.isfinite(d)) or 1.0
    out: list[LayerValue] = []
    for name, module, drop, note in drops:
        lp = by_name.get(name)
        measured = not math.isnan(drop)
        share = (min(max(drop, 0.0) / total, 1.0) if math.isfinite(drop) else 1.0) if measured else 0.0
        tshare = lp.time_share if lp is not None else None
        ltype = lp.type if lp is not None else type(module).__name__
        finding = action = None
        essential = measured and note is not None
        costly = tshare is not None and tshare >= MIN_TIME_SHARE and tshare >= COST_RATIO * share
        if measured and not essential and lp is not None and costly and _beyond_noise(lp, share):
            finding = (f"{name} ({ltype}) takes {tshare:.0%} of the step time{lp.share_range()}, "
                       f"{(lp.params_share or 0):.0%} of the params and {(lp.macs_share or 0):.0%} of "
                       f"the MACs, but replacing its output by its mean costs only {drop:.4g} {metric} "
                       f"({share:.0%} of the measured contribution)")
            action = _advice(ltype)
        elif essential:
            notes.append(f"{name} ({ltype}) is kept whole: {note}")
        elif measured and lp is not None and costly:
            notes.append(f"{name} ({ltype}): no finding from its {tshare:.0%} of the step time{lp.share_range()}, "
                         "within the load's noise of the bar")
        out.append(LayerValue(
            name=name, type=ltype, params=int(lp.params if lp is not None else
                                              sum(p.numel() for p in module.parameters())),
            macs=int(lp.macs if lp is not None else 0), time_share=tshare,
            params_share=lp.params_share if lp is not None else None,
            macs_share=lp.macs_share if lp is not None else None,
            drop=drop if measured else 0.0, value_share=share, finding=finding, action=action,
            measured=measured, essential=essential, note=note,
            time_share_q1=lp.time_share_q1 if lp is not None else None,
            time_share_q3=lp.time_share_q3 if lp is not None else None))
    return base, out, notes


def keep_layers(values: Sequence[LayerValue]) -> list[str]:
    """Layers worth more than they cost (a large value share at a small time share), and those the
    model cannot work without."""
    return [v.name for v in values
            if v.essential or (v.value_share >= 0.25 and (v.time_share or 0.0) * COST_RATIO <= v.value_share)]
