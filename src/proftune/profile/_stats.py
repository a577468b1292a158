"""Per-layer statistics of weights, activations and gradients, gathered for one step at a time.

:class:`LayerStats` attaches for one step (a sampled step of the :class:`Monitor`, the
statistics step of :func:`proftune.profile`) and is detached after it, so a model pays nothing
on the steps that are not sampled. Percentiles of large tensors come from a seeded random
sample (``sample_size`` elements, default 1024: the rank of p1/p99 is off by about 0.3
percentile points, the zero fraction by at most 1.6 points, two standard errors), drawn on a
private generator so that the training's random stream is left untouched. Means, standard
deviations and ranges are exact.

A step costs a few tensor ops per layer and no host sync per tensor. In its hook, a layer's
output of at most ``sample_size`` values is copied (one op); a larger one is reduced to four
0-d tensors (sum, sum of squares, min, max), a sample and the count of units that fired, all
left on the device. :meth:`LayerStats.gather` then reads the weights (like weights stacked: a
few ops per block) and stacks the activations' copies; the reduction (one sort per block of
like samples, numpy's on CPU, ~20x torch's there; percentiles, zero fractions, dead units) and
the one host copy per device come when the result is asked for (:class:`StepStats`): at once
for :meth:`LayerStats.collect`, when its profile is read for the Monitor. Gradient and update
norms are ``torch._foreach_norm`` calls over every parameter, one host copy per step. A tensor
holding NaN/Inf shows it in its min and max (they propagate NaN, and an Inf is the max or the
min); only then are its finite values summarised again: exactly for weights and for tensors
no larger than the sample, from the sample otherwise (the count of non-finite values is then
an estimate, marked ``"estimated": True``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import nn

from .._tensors import l2_norm
from ._layers import LayerHooks, output_tensors
from ._records import LayerStatistics
from ._summaries import StepStats, Summary, host_floats, stack_summaries, stack_weights, units_fired

__all__ = ["LayerStats"]


class LayerStats:
    """Weight, activation and gradient statistics per layer for the step it is attached to.

    Use: ``ls.attach(optimizer)``, run one forward/backward (and optimizer step), ``ls.detach()``,
    then ``ls.collect()``. With an optimizer, gradients are read just before its step and the
    update-to-weight ratio ``||w_after - w_before|| / ||w_before||`` is measured across it.
    Without a step, ``collect(optimizer)`` estimates the ratio from the optimizer's state
    (Adam/AdamW: ``lr * m_hat / (sqrt(v_hat) + eps)``; SGD: ``lr * momentum buffer or grad``).

    ``only``: the layer paths whose statistics are taken (``None``: every layer); the
    :class:`Monitor` sets it to a round-robin share of a deep model's layers. :meth:`grad_norm`
    is still the global norm (one fused norm over every gradient); :meth:`update_ratio` covers
    those layers only, and :meth:`update_norms` gives each one's update and weight norms, for a
    caller to combine across samples.
    """

    def __init__(self, model: nn.Module, *, activations: bool = True, gradients: bool = True,
                 weights: bool = True, sample_size: int = 1024, seed: int = 0,
                 hooks: LayerHooks | None = None) -> None:
        if sample_size < 16:
            raise ValueError(f"sample_size must be at least 16, but got {sample_size=}.")
        self.model = model
        self.activations, self.gradients, self.weights = activations, gradients, weights
        self.sample_size = int(sample_size)
        self.seed = int(seed)
        self.only: set[str] | None = None
        self._gens: dict[torch.device, torch.Generator] = {}
        # ``hooks``: forward hooks shared with other parts (the Monitor's timer); one set is cheaper
        self._hooks = hooks if hooks is not None else LayerHooks(model)
        self._hooks.listeners.append(self._on_leaf)
        self._active = False  # the hooks may be shared: listen only while attached
        self._act: dict[str, Summary] = {}
        self._fired: dict[str, tuple[torch.Tensor, int]] = {}  # per layer: units that fired (dead units)
        self._order: dict[str, str] = {}  # layer path -> type, in the order layers ran
        self._mods: dict[str, nn.Module] = {}
        self._calls: dict[str, int] = {}
        self._grads: dict[str, dict[str, float]] | None = None
        self._grad_total: float | None = None
        self._pending_grads: tuple[list[tuple[str, list[torch.Tensor]]], list[torch.Tensor]] | None = None
        self._before: list[torch.Tensor] | None = None
        self._updates: dict[str, float] | None = None
        self._update_norms: dict[str, tuple[float, float]] = {}
        self._update_total: float | None = None
        self._opt_handles: list[Any] = []
        # parameters per layer, found once per set of layer modules (walking a deep model's
        # modules on every sample cost as much as the statistics)
        self._params_key: tuple[int, ...] | None = None
        self._mods_key: tuple[int, ...] = ()
        self._mods_seen = 0  # len(self._mods) when _mods_key was built
        self._params_cache: dict[str, list[torch.nn.Parameter]] | None = None
        self._modules: dict[str, nn.Module] = {}  # path -> module, found with the parameters
        self._chosen: dict[str, list[torch.nn.Parameter]] = {}  # path -> the tensors of its weight stats

    # -- lifecycle --------------------------------------------------------------------------
    def attach(self, optimizer: torch.optim.Optimizer | None = None) -> LayerStats:
        """Start observing: forward hooks (layer order, activations) and, given an optimizer,
        hooks around its next step (gradients, update ratio)."""
        self.reset()
        self._hooks.attach()
        self._active = True
        if optimizer is not None and (self.gradients or self.weights):
            self._opt_handles.append(optimizer.register_step_pre_hook(self._before_step))
            self._opt_handles.append(optimizer.register_step_post_hook(self._after_step))
        return self

    def detach(self) -> None:
        """Remove every hook; what was gathered stays for :meth:`collect`."""
        self._active = False
        self._hooks.detach()
        for h in self._opt_handles:
            h.remove()
        self._opt_handles.clear()

    def reset(self) -> None:
        self._act.clear()
        self._fired.clear()
        self._order.clear()
        self._mods.clear()
        self._calls.clear()
        self._grads = None
        self._grad_total = None
        self._pending_grads = None
        self._before = None
        self._updates = None
        self._update_norms = {}
        self._update_total = None

    def release(self) -> None:
        """Drop the tensors gathered for the last :meth:`collect` (what ran, and the layers'
        parameters, are kept for the next step): a caller done with a step frees them now."""
        self._act.clear()
        self._fired.clear()
        self._pending_grads = None
        self._before = None

    def __enter__(self) -> LayerStats:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    @property
    def attached(self) -> bool:
        return self._active and self._hooks.attached

    # -- hooks ------------------------------------------------------------------------------
    def _gen(self, device: torch.device) -> torch.Generator:
        g = self._gens.get(device)
        if g is None:
            g = self._gens[device] = torch.Generator(device=device)
            g.manual_seed(self.seed)
        return g

    def _on_leaf(self, name: str, mod: nn.Module, inputs: tuple[Any, ...], output: Any,
                 start: float, end: float) -> None:
        if not self._active:
            return
        if name not in self._order:
            self._order[name] = type(mod).__name__
            self._mods[name] = mod
        self._calls[name] = self._calls.get(name, 0) + 1
        if not self.activations or name in self._act or (self.only is not None and name not in self.only):
            return
        for t in output_tensors(output):
            if t.is_floating_point() and t.numel() > 0:
                summary = self._act[name] = Summary(t, self.sample_size, self._gen(t.device))
                if not summary.complete:  # a complete copy's units are counted at collect, all at once
                    fired = units_fired(t)
                    if fired is not None:
                        self._fired[name] = fired
                break

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._grads is None and self._pending_grads is None and self.gradients:
            self._pending_grads = self._gradient_norms()
        if self.weights and self._before is None:
            params: list[torch.Tensor] = [p for ps in self._covered_params().values() for p in ps]
            with torch.no_grad():  # one fused copy of every parameter
                self._before = list(torch._foreach_mul(params, 1.0)) if params else []

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._before is None or self._updates is not None:
            return
        params = self._covered_params()
        new: list[torch.Tensor] = [p for ps in params.values() for p in ps]
        old, self._before = self._before, None  # the copies are not needed any more
        if not new or len(new) != len(old):
            self._updates, self._update_total = {}, None
            return
        with torch.no_grad():
            diff = torch._foreach_sub(new, old)
            norms = list(torch._foreach_norm(diff)) + list(torch._foreach_norm(old))
        pending = self._pending_grads
        grad_norms = pending[1] if pending is not None else []
        # the step's one host copy: gradient norms, update norms, weight norms
        host = host_floats(grad_norms + norms)
        if pending is not None:
            self._resolve_gradients(pending[0], host[:len(grad_norms)])
        host = host[len(grad_norms):]
        u_all, w_all = host[:len(new)], host[len(new):]
        updates: dict[str, float] = {}
        upd_sq = w_sq = 0.0
        i = 0
        for n, ps in params.items():
            k = len(ps)
            u2 = sum(v * v for v in u_all[i:i + k])
            w2 = sum(v * v for v in w_all[i:i + k])
            i += k
            upd_sq += u2
            w_sq += w2
            updates[n] = math.sqrt(u2) / math.sqrt(w2) if w2 > 0 else math.nan
            self._update_norms[n] = (math.sqrt(u2), math.sqrt(w2))
        self._updates = updates
        self._update_total = math.sqrt(upd_sq) / math.sqrt(w_sq) if w_sq > 0 else None

    # -- reading ----------------------------------------------------------------------------
    def _layer_params(self) -> dict[str, list[torch.nn.Parameter]]:
        """Parameters per layer: each layer that ran owns its parameters (children included);
        parameters of modules that never ran as a layer go to their own module path."""
        if self._mods_seen != len(self._mods):  # the tuple is built once per new layer set, not per call
            self._mods_seen = len(self._mods)
            self._mods_key = tuple(id(m) for m in self._mods.values())
        key = self._mods_key
        if self._params_cache is None or key != self._params_key:
            self._params_cache = self._find_layer_params()
            self._params_key = key
            self._chosen = {}
        return self._params_cache

    def _covered_params(self) -> dict[str, list[torch.nn.Parameter]]:
        params = self._layer_params()
        if self.only is None:
            return params
        return {n: ps for n, ps in params.items() if n in self.only}

    def names(self) -> list[str]:
        """Every path :meth:`collect` reports (layers in the order they ran, then modules that
        hold parameters without running as a layer); before any forward, the layers the hooks saw
        last, or the model's leaf modules."""
        order = list(self._order) or list(self._hooks.layers) or [
            n for n, m in self.model.named_modules() if next(m.children(), None) is None]
        return self._with_param_holders(order)

    def _with_param_holders(self, order: list[str]) -> list[str]:
        ran = set(order)
        return order + [n for n in self._layer_params() if n not in ran]

    def _find_layer_params(self) -> dict[str, list[torch.nn.Parameter]]:
        self._modules = mods = dict(self.model.named_modules())
        out: dict[str, list[torch.nn.Parameter]] = {}
        seen: set[int] = set()
        names = list(self._order) or [n for n, m in mods.items() if not any(True for _ in m.children())]
        for name in names:
            mod = mods.get(name)
            if mod is None:
                continue
            ps = [p for p in mod.parameters() if id(p) not in seen]
            seen.update(id(p) for p in ps)
            if ps:
                out[name] = ps
        for name, mod in mods.items():
            ps = [p for p in mod.parameters(recurse=False) if id(p) not in seen]
            seen.update(id(p) for p in ps)
            if ps:
                out.setdefault(name, []).extend(ps)
        return out

    def _gradient_norms(self) -> tuple[list[tuple[str, list[torch.Tensor]]], list[torch.Tensor]]:
        """Every layer's gradients (held, so that they can be looked at again should a norm be
        non-finite) and the norm of each, on its device: one fused op, no host copy."""
        layers = [(name, [p.grad for p in ps if p.grad is not None]) for name, ps in self._layer_params().items()]
        layers = [(name, gs) for name, gs in layers if gs]
        flat = [g for _, gs in layers for g in gs]
        with torch.no_grad():  # (no detach per tensor: no graph is made here either way)
            return layers, list(torch._foreach_norm(flat)) if flat else []

    def _resolve_gradients(self, layers: list[tuple[str, list[torch.Tensor]]], host: list[float]) -> None:
        """Per covered layer: gradient norm and non-finite count, from the host copy of the norms;
        the global norm over every layer."""
        grads: dict[str, dict[str, float]] = {}
        total = 0.0
        i = 0
        for name, gs in layers:
            sq = sum(v * v for v in host[i:i + len(gs)])
            i += len(gs)
            total += sq
            if self.only is not None and name not in self.only:
                continue
            norm = math.sqrt(sq)
            bad = 0
            if not math.isfinite(norm):  # rare: count the bad values of these gradients
                bad = sum(int((~torch.isfinite(g)).sum()) for g in gs)
            grads[name] = {"norm": norm, "nonfinite": bad}
        self._grads = grads
        self._grad_total = math.sqrt(total) if layers else None
        self._pending_grads = None

    def capture_gradients(self) -> dict[str, dict[str, float]]:
        """Gradient norm and non-finite count per layer, read now (grads must be complete):
        one fused norm over every gradient and one host copy."""
        layers, norms = self._pending_grads or self._gradient_norms()
        self._resolve_gradients(layers, host_floats(norms) if norms else [])
        return cast(dict, self._grads)

    def grad_norm(self) -> float | None:
        """Global L2 norm of the gradients captured, over every layer (``None`` before any)."""
        if self._pending_grads is not None:
            self.capture_gradients()
        return self._grad_total

    def update_ratio(self) -> float | None:
        """Global ``||update|| / ||weights||`` of the observed optimizer step (``None`` if none)."""
        return self._update_total

    def update_norms(self) -> dict[str, tuple[float, float]]:
        """Per layer of the observed optimizer step: ``(||update||, ||weights before||)``."""
        return dict(self._update_norms)

    def collect(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, LayerStatistics]:
        """Per layer, in the order layers ran: ``weight``, ``activation`` and ``grad`` dicts.

        ``weight``: l2, mean, std, p1, p50, p99 (of the layer's weight matrices; all its
        parameters when it has none); ``activation``: mean, std, min, max, p1, p50, p99,
        zero_frac, nonfinite (of the layer's first floating output), dead_frac (share of its units
        that output zero over 90% of the time in this step); ``grad``: norm, nonfinite,
        update_ratio. With ``only`` set, layers outside it have no ``weight`` or ``activation``.
        """
        return self.gather(optimizer).result()

    def gather(self, optimizer: torch.optim.Optimizer | None = None) -> StepStats:
        """What :meth:`collect` returns, read now but reduced when first asked for: the
        weights are read (stacked and sampled on the device), the activations are already."""
        params = self._layer_params()
        grads = self._grads
        if self.gradients and grads is None:
            grads = self.capture_gradients()
        order = self._with_param_holders(list(self._order))
        covered = order if self.only is None else [n for n in order if n in self.only]
        weighted = [n for n in covered if n in params] if self.weights else []
        rows = stack_weights([(n, "weight") for n in weighted], [self._chosen_weights(n) for n in weighted],
                              self.sample_size, self._gen)
        acts = [n for n in covered if n in self._act] if self.activations else []
        rows += stack_summaries([(n, "activation") for n in acts], [self._act[n] for n in acts])
        group_of = ({id(p): g for g in optimizer.param_groups for p in g["params"]}
                    if optimizer is not None and self._updates is None else {})
        entries: dict[str, LayerStatistics] = {}
        for name in order:
            mod = self._modules.get(name) or self._mods.get(name)
            entry: LayerStatistics = {"type": self._order.get(name, type(mod).__name__ if mod is not None else "?"),
                                      "calls": self._calls.get(name, 0)}
            if self.gradients and grads and name in grads:
                g: dict[str, float | None] = dict(grads[name])
                g["update_ratio"] = self._ratio(name, params.get(name, []), optimizer, group_of)
                entry["grad"] = g
            entries[name] = entry
        return StepStats(entries, rows, dict(self._fired))

    def _chosen_weights(self, name: str) -> list[torch.nn.Parameter]:
        """The tensors a layer's ``weight`` statistics cover: its weight matrices (all its
        parameters when it has none); found once per set of layer modules."""
        chosen = self._chosen.get(name)
        if chosen is None:
            mod = self._modules.get(name)
            named = dict(mod.named_parameters()) if mod is not None else {}
            chosen = [p for n, p in named.items() if "weight" in n.rsplit(".", 1)[-1] and p.dim() > 1]
            chosen = self._chosen[name] = chosen or self._layer_params()[name]
        return chosen

    def _ratio(self, name: str, ps: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer | None,
               group_of: Mapping[int, Mapping[str, Any]]) -> float | None:
        if self._updates is not None:
            r = self._updates.get(name)
            return None if r is None or math.isnan(r) else r
        if optimizer is None or not ps:
            return None
        upd = [u for u in (_estimated_update(group_of.get(id(p)), optimizer.state.get(p, {}), p) for p in ps)
               if u is not None]
        w = l2_norm(list(ps))
        return l2_norm(upd) / w if upd and w > 0 else None


def _estimated_update(group: Mapping[str, Any] | None, state: Mapping[str, Any],
                      p: torch.nn.Parameter) -> torch.Tensor | None:
    """The update the optimizer's last step made to ``p`` (of param group ``group``, with
    optimizer state ``state``), rebuilt from its state (no weight decay)."""
    if group is None:
        return None
    lr = float(group.get("lr", 0.0))
    if "exp_avg" in state and "exp_avg_sq" in state:
        b1, b2 = group.get("betas", (0.9, 0.999))
        t = float(state.get("step", 1))
        m_hat = state["exp_avg"] / (1 - b1**t)
        v_hat = state["exp_avg_sq"] / (1 - b2**t)
        return cast(torch.Tensor, lr * m_hat / (v_hat.sqrt() + float(group.get("eps", 1e-8))))
    if "momentum_buffer" in state and state["momentum_buffer"] is not None:
        return cast(torch.Tensor, lr * state["momentum_buffer"])
    if p.grad is not None:
        return lr * p.grad
    return None
