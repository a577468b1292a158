"""NaN/Inf: the loss or the gradients turned non-finite; names the layer that made the first one."""

from __future__ import annotations

from .._findings import Finding
from .._history import History, NanProbe, NonFinite
from ._base import BaseCheck, fmt
from ._exploding import early_growth

#: Layers that only overflow (a finite input times finite weights): a non-finite output of one
#: of them follows values that grew, not an op that is undefined on its input.
_OVERFLOW_ONLY = ("Linear", "Conv1d", "Conv2d", "Conv3d", "LazyLinear", "Bilinear", "Embedding")


class NanInf(BaseCheck):
    cause = "nan_inf"
    explains = ("lr_too_high", "exploding_gradients", "dead_units", "lr_too_low")

    def check(self, history: History) -> Finding | None:
        nf = history.nonfinite
        if nf is None:
            return None
        evidence = {k: v for k, v in nf.items() if k not in ("step", "layer")}
        probe = history.nan_probe
        if probe is not None:
            evidence["nan_probe"] = probe.to_dict()
        if history.nan_not_lr():
            assert probe is not None
            return _not_the_rate(self.cause, nf, probe, evidence)
        layer = nf.get("layer")
        produced = nf.get("phase") == "forward" and layer is not None and nf.get("inputs_finite")
        grew = any(r["step"] < nf["step"] for r in history.spikes()) or early_growth(history) is not None
        overflow = nf.get("type") in _OVERFLOW_ONLY
        if produced and not overflow:
            summary = (f"layer {layer} ({nf.get('type')}) produced non-finite outputs from finite inputs at "
                       f"step {nf['step']}")
            fix = (f"guard the op in {layer} (clamp its input, add an epsilon, use a numerically stable "
                   "form such as log1p/logsumexp)")
        elif produced:
            summary = (f"layer {layer} ({nf.get('type')}) overflowed to non-finite outputs at step {nf['step']} "
                       "(finite inputs; its weights or inputs had grown too large)")
            fix = "find what grew (gradient norm, weights): lower the learning rate, clip gradients, fix the init"
        elif nf.get("phase") == "forward" and layer is not None and nf.get("inputs_finite") is False:
            summary = f"the input batch of step {nf['step']} holds NaN/Inf; {layer} passed it on"
            fix = "clean the data (check the loader and the preprocessing for NaN/Inf, e.g. division by a zero std)"
        elif nf.get("phase") == "backward":
            summary = f"gradients became non-finite at step {nf['step']}" + (f" in {layer}" if layer else "")
            fix = "clip gradients (grad_clip, proftune.GradGuard), check ops with unbounded derivatives"
        else:
            summary = f"loss became {nf.get('loss')} at step {nf['step']}" + (f", first in {layer}" if layer else "")
            fix = "lower the learning rate, clip gradients, or guard the op that overflows"
        if probe is not None and probe.follows_lr:
            summary += (f"; re-run from the same start at lr {fmt(probe.probe_lr)} ({fmt(probe.factor)}x), "
                        f"it stayed finite through step {probe.steps}: the NaN follows the rate")
        root = bool((produced and not overflow) or nf.get("inputs_finite") is False) and not grew
        return Finding(self.cause, "error", summary, fix, evidence, 0.95 if root else 0.6,
                       step=nf["step"], layer=layer, root=root)


def _not_the_rate(cause: str, nf: NonFinite, probe: NanProbe, evidence: dict[str, object]) -> Finding:
    """The finding of a NaN that came at the same step (or sooner) at a far lower rate: what was
    measured, and where to look instead of the learning rate."""
    at = probe.probe_nan_step
    where = f", first in {nf['layer']}" if nf.get("layer") else ""
    summary = (f"loss became {nf.get('loss')} at step {nf['step']}{where}"
               f"; re-run from the same start at lr {fmt(probe.probe_lr)} ({fmt(probe.factor)}x the run's "
               f"{fmt(probe.lr)}), it became non-finite at step {at} {'too' if at == nf['step'] else '(sooner)'}: "
               "the NaN follows the number of steps or calls, not the learning rate")
    if nf.get("weights_finite") and nf.get("inputs_finite") and nf.get("layers_finite"):
        summary += "; the weights, the inputs and every layer's output of that step were finite (the loss made it)"
    elif nf.get("weights_finite"):
        summary += "; the weights of that step were finite"
    fix = ("lowering the learning rate will not help: look for what changes with the step or call count "
           "(a counter, a buffer or cache that grows, a schedule, a data item reached at that step) in the "
           + ("loss function" if nf.get("layers_finite") else "model and the loss"))
    return Finding(cause, "error", summary, fix, evidence, 0.95, step=nf["step"], layer=nf.get("layer"), root=True)
