"""Per-layer statistics of weights, activations and gradients, gathered for one step at a time.

:class:`LayerStats` attaches for one step (a sampled step of the :class:`Monitor`, the
statistics step of :func:`proftune.profile`) and is detached after it, so a model pays nothing
on the steps that are not sampled. Percentiles of large tensors come from a seeded random
sample (``sample_size`` elements, default 1024: the rank of p1/p99 is off by about 0.3
percentile points, the zero fraction by at most 1.6 points, two standard errors), drawn on a
private generator so that the training's random stream is left untouched. Means, standard
deviations and ranges are exact.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import nn

from .._tensors import l2_norm
from ._layers import LayerHooks, output_tensors

__all__ = ["LayerStats", "tensor_stats"]

_QUANTILES = (0.01, 0.5, 0.99)


_INDEX_CACHE: dict[tuple[int, int, str], torch.Tensor] = {}


def _sample_index(n: int, k: int, device: torch.device, gen: torch.Generator | None) -> torch.Tensor:
    """``k`` random positions in ``[0, n)``, drawn once per size and reused (cheap, repeatable)."""
    key = (n, k, str(device))
    idx = _INDEX_CACHE.get(key)
    if idx is None:
        if len(_INDEX_CACHE) > 256:
            _INDEX_CACHE.clear()
        idx = torch.randint(0, n, (k,), generator=gen, device=device)
        _INDEX_CACHE[key] = idx
    return idx


class _Summary:
    """The exact moments and range of a tensor (no host sync) and a random sample of it for the
    percentiles and the fraction of exact zeros."""

    __slots__ = ("moments", "n", "nonfinite", "sample")

    def __init__(self, x: torch.Tensor, k: int, gen: torch.Generator | None) -> None:
        f = x.detach().reshape(-1).float()
        n = f.numel()
        total, sq = f.sum(), torch.dot(f, f)
        self.nonfinite = 0
        if not bool(torch.isfinite(total + sq)):  # rare: only then count the bad values
            finite = torch.isfinite(f)
            self.nonfinite = n - int(finite.sum())
            f = f[finite]
            total, sq = f.sum(), torch.dot(f, f)
        self.n = m = f.numel()
        if m == 0:
            self.moments = torch.full((4,), float("nan"))
            self.sample = f
            return
        lo, hi = torch.aminmax(f)
        self.moments = torch.stack([total, sq, lo, hi])
        self.sample = f if m <= k else f[_sample_index(m, k, f.device, gen)]


def _percentiles(samples: list[torch.Tensor]) -> list[list[float]]:
    """p1, p50, p99 (linear interpolation, as ``torch.quantile``) and the zero fraction of each
    sample: one sort of the samples padded into one matrix, whatever their lengths."""
    if not samples:
        return []
    dev = samples[0].device
    lens = torch.tensor([t.numel() for t in samples], device=dev)
    mat = torch.full((len(samples), int(lens.max())), float("nan"), device=dev)
    for i, t in enumerate(samples):
        mat[i, : t.numel()] = t
    zeros = (mat == 0).sum(dim=1) / lens
    ordered = mat.sort(dim=1).values  # NaN padding sorts last
    cols = []
    for q in _QUANTILES:
        pos = q * (lens - 1).to(torch.float32)
        lo = pos.floor().long()
        hi = pos.ceil().long()
        frac = pos - lo
        a = ordered.gather(1, lo[:, None])[:, 0]
        b = ordered.gather(1, hi[:, None])[:, 0]
        cols.append(a + (b - a) * frac)
    cols.append(zeros)
    return torch.stack(cols, dim=1).double().cpu().tolist()


def _finish(summaries: list[_Summary]) -> list[dict[str, Any]]:
    """Turn summaries into stat dicts; all percentiles of one device in one sort."""
    pct: dict[int, list[float]] = {}
    by_dev: dict[str, list[int]] = {}
    for i, s in enumerate(summaries):
        if s.sample.numel():
            by_dev.setdefault(str(s.sample.device), []).append(i)
    for idxs in by_dev.values():
        for i, row in zip(idxs, _percentiles([summaries[i].sample for i in idxs]), strict=True):
            pct[i] = row
    moments = torch.stack([s.moments.double().cpu() for s in summaries]).tolist() if summaries else []
    out = []
    nan = float("nan")
    for i, s in enumerate(summaries):
        total, sq, lo, hi = moments[i]
        m = s.n
        mean = total / m if m else nan
        var = max(sq / m - mean * mean, 0.0) if m else nan
        p1, p50, p99, zero_frac = pct.get(i, (nan, nan, nan, nan))
        out.append({
            "numel": m + s.nonfinite, "nonfinite": s.nonfinite, "mean": mean, "std": math.sqrt(var),
            "min": lo, "max": hi, "p1": p1, "p50": p50, "p99": p99, "zero_frac": zero_frac,
        })
    return out


def tensor_stats(x: torch.Tensor, *, sample_size: int = 1024, generator: torch.Generator | None = None) -> dict[str, Any]:
    """Mean, std, min, max, p1/p50/p99, fraction of exact zeros and count of non-finite values.

    Moments and range are exact, over the finite values; percentiles and the zero fraction of
    tensors larger than ``sample_size`` elements come from a random sample of that size.
    """
    return _finish([_Summary(x, sample_size, generator)])[0]


#: A unit is dead when it outputs exactly zero for more than this fraction of the positions it
#: sees (samples, and spatial positions for a conv channel).
DEAD_UNIT_ZERO_FRAC = 0.9


#: Samples of the batch a unit is judged on (the first ones: 32 samples, times the spatial
#: positions of a conv channel, show a unit that is off >90% of the time; cheap on any batch).
DEAD_UNIT_ROWS = 32


def _dead_units(t: torch.Tensor) -> torch.Tensor | None:
    """Fraction of a layer's units (features: dim 1 of conv-like outputs of 4+ dims, else the
    last dim) that output zero more than :data:`DEAD_UNIT_ZERO_FRAC` of the time, over the
    first :data:`DEAD_UNIT_ROWS` samples of the batch; 0-dim, on the tensor's device (no host
    sync). None for outputs without a batch and a unit dimension."""
    if t.dim() < 2 or t.shape[0] < 2:
        return None
    sub = t.detach()[:DEAD_UNIT_ROWS]
    unit_dim = 1 if sub.dim() >= 4 else sub.dim() - 1
    dims = tuple(d for d in range(sub.dim()) if d != unit_dim)
    positions = sub.numel() // max(sub.shape[unit_dim], 1)
    # |sign| is 1 where a unit fired and 0 where it did not: the cheapest exact count on CPU
    zero_frac = 1.0 - torch.sign(sub).abs_().sum(dim=dims) / positions
    return (zero_frac > DEAD_UNIT_ZERO_FRAC).float().mean()


class LayerStats:
    """Weight, activation and gradient statistics per layer for the step it is attached to.

    Use: ``ls.attach(optimizer)``, run one forward/backward (and optimizer step), ``ls.detach()``,
    then ``ls.collect()``. With an optimizer, gradients are read just before its step and the
    update-to-weight ratio ``||w_after - w_before|| / ||w_before||`` is measured across it.
    Without a step, ``collect(optimizer)`` estimates the ratio from the optimizer's state
    (Adam/AdamW: ``lr * m_hat / (sqrt(v_hat) + eps)``; SGD: ``lr * momentum buffer or grad``).
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
        self._gens: dict[str, torch.Generator] = {}
        # ``hooks``: forward hooks shared with other parts (the Monitor's timer); one set is cheaper
        self._hooks = hooks if hooks is not None else LayerHooks(model)
        self._hooks.listeners.append(self._on_leaf)
        self._active = False  # the hooks may be shared: listen only while attached
        self._act: dict[str, _Summary] = {}
        self._dead: dict[str, torch.Tensor] = {}  # per layer: fraction of dead units (diagnose)
        self._order: dict[str, str] = {}  # layer path -> type, in the order layers ran
        self._calls: dict[str, int] = {}
        self._grads: dict[str, dict[str, Any]] | None = None
        self._before: dict[str, list[torch.Tensor]] | None = None
        self._updates: dict[str, float] | None = None
        self._update_total: float | None = None
        self._opt_handles: list[Any] = []
        self._params_cache: dict[str, list[torch.nn.Parameter]] | None = None

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
        self._dead.clear()
        self._order.clear()
        self._calls.clear()
        self._grads = None
        self._before = None
        self._updates = None
        self._update_total = None
        self._params_cache = None

    def __enter__(self) -> LayerStats:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    @property
    def attached(self) -> bool:
        return self._active and self._hooks.attached

    # -- hooks ------------------------------------------------------------------------------
    def _gen(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._gens:
            g = torch.Generator(device=device)
            g.manual_seed(self.seed)
            self._gens[key] = g
        return self._gens[key]

    def _on_leaf(self, name: str, mod: nn.Module, inputs: tuple[Any, ...], output: Any,
                 start: float, end: float) -> None:
        if not self._active:
            return
        self._order.setdefault(name, type(mod).__name__)
        self._calls[name] = self._calls.get(name, 0) + 1
        if not self.activations or name in self._act:
            return
        for t in output_tensors(output):
            if t.is_floating_point() and t.numel() > 0:
                self._act[name] = _Summary(t, self.sample_size, self._gen(t.device))
                dead = _dead_units(t)
                if dead is not None:
                    self._dead[name] = dead
                break

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._grads is None and self.gradients:
            self.capture_gradients()
        if self.weights and self._before is None:
            self._before = {name: [p.detach().clone() for p in ps]
                            for name, ps in self._layer_params().items()}

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._before is None or self._updates is not None:
            return
        params = self._layer_params()
        names = [n for n in params if len(self._before.get(n, [])) == len(params[n])]
        new = [p.detach() for n in names for p in params[n]]
        old = [o for n in names for o in self._before[n]]
        updates: dict[str, float] = {}
        upd_sq = w_sq = 0.0
        if new:
            diff = torch._foreach_sub(new, old)
            u_all = torch.stack([t.float().cpu() for t in torch._foreach_norm(diff)]).tolist()
            w_all = torch.stack([t.float().cpu() for t in torch._foreach_norm(old)]).tolist()
            i = 0
            for n in names:
                k = len(params[n])
                u2 = sum(v * v for v in u_all[i:i + k])
                w2 = sum(v * v for v in w_all[i:i + k])
                i += k
                upd_sq += u2
                w_sq += w2
                updates[n] = math.sqrt(u2) / math.sqrt(w2) if w2 > 0 else math.nan
        self._updates = updates
        self._update_total = math.sqrt(upd_sq) / math.sqrt(w_sq) if w_sq > 0 else None
        self._before = None  # the copies are not needed any more

    # -- reading ----------------------------------------------------------------------------
    def _layer_params(self) -> dict[str, list[torch.nn.Parameter]]:
        """Parameters per layer: each layer that ran owns its parameters (children included);
        parameters of modules that never ran as a layer go to their own module path."""
        if self._params_cache is not None and (self._order or not self._hooks.attached):
            return self._params_cache
        self._params_cache = self._find_layer_params()
        return self._params_cache

    def _find_layer_params(self) -> dict[str, list[torch.nn.Parameter]]:
        mods = dict(self.model.named_modules())
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

    def capture_gradients(self) -> dict[str, dict[str, Any]]:
        """Gradient norm and non-finite count per layer, read now (grads must be complete)."""
        layers = [(name, [p.grad.detach() for p in ps if p.grad is not None])
                  for name, ps in self._layer_params().items()]
        layers = [(name, gs) for name, gs in layers if gs]
        flat = [g for _, gs in layers for g in gs]
        norms = torch._foreach_norm(flat) if flat else []
        host = torch.stack([n.float().cpu() for n in norms]).tolist() if flat else []
        grads: dict[str, dict[str, Any]] = {}
        i = 0
        for name, gs in layers:
            mine = host[i:i + len(gs)]
            i += len(gs)
            norm = math.sqrt(sum(v * v for v in mine))
            bad = 0
            if not math.isfinite(norm):
                bad = sum(int((~torch.isfinite(g)).sum()) for g in gs)
            grads[name] = {"norm": norm, "nonfinite": bad}
        self._grads = grads
        return grads

    def grad_norm(self) -> float | None:
        """Global L2 norm of the gradients captured (``None`` before any)."""
        if not self._grads:
            return None
        return math.sqrt(sum(g["norm"] ** 2 for g in self._grads.values()))

    def update_ratio(self) -> float | None:
        """Global ``||update|| / ||weights||`` of the observed optimizer step (``None`` if none)."""
        return self._update_total

    def collect(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, dict[str, Any]]:
        """Per layer, in the order layers ran: ``weight``, ``activation`` and ``grad`` dicts.

        ``weight``: l2, mean, std, p1, p50, p99 (of the layer's weight matrices; all its
        parameters when it has none); ``activation``: mean, std, min, max, p1, p50, p99,
        zero_frac, nonfinite (of the layer's first floating output), dead_frac (share of its units
        that output zero over 90% of the time in this step); ``grad``: norm, nonfinite,
        update_ratio.
        """
        params = self._layer_params()
        grads = self._grads
        if self.gradients and grads is None:
            grads = self.capture_gradients()
        order = list(self._order) + [n for n in params if n not in self._order]
        mods = dict(self.model.named_modules())
        # every summary's percentiles in as few calls as possible
        keys: list[tuple[str, str]] = []
        summaries: list[_Summary] = []
        l2: dict[str, float] = {}
        for name in order:
            if self.weights and name in params:
                chosen = self._weights_of(mods.get(name), params[name])
                flat = torch.cat([p.detach().reshape(-1) for p in chosen])
                keys.append((name, "weight"))
                summaries.append(_Summary(flat, self.sample_size, self._gen(flat.device)))
                l2[name] = l2_norm(chosen)
            if self.activations and name in self._act:
                keys.append((name, "activation"))
                summaries.append(self._act[name])
        done = dict(zip(keys, _finish(summaries), strict=True))
        out: dict[str, dict[str, Any]] = {}
        for name in order:
            mod = mods.get(name)
            entry: dict[str, Any] = {"type": self._order.get(name, type(mod).__name__ if mod is not None else "?"),
                                     "calls": self._calls.get(name, 0)}
            w = done.get((name, "weight"))
            if w is not None:
                entry["weight"] = {"l2": l2[name], "mean": w["mean"], "std": w["std"], "p1": w["p1"],
                                   "p50": w["p50"], "p99": w["p99"], "numel": w["numel"],
                                   "nonfinite": w["nonfinite"]}
            a = done.get((name, "activation"))
            if a is not None:
                if name in self._dead:
                    a["dead_frac"] = float(self._dead[name])
                entry["activation"] = a
            if self.gradients and grads and name in grads:
                g = dict(grads[name])
                g["update_ratio"] = self._ratio(name, params.get(name, []), optimizer)
                entry["grad"] = g
            out[name] = entry
        return out

    @staticmethod
    def _weights_of(mod: nn.Module | None, ps: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
        named = dict(mod.named_parameters()) if mod is not None else {}
        weights = [p for n, p in named.items() if "weight" in n.rsplit(".", 1)[-1] and p.dim() > 1]
        return weights or ps

    def _ratio(self, name: str, ps: list[torch.nn.Parameter],
               optimizer: torch.optim.Optimizer | None) -> float | None:
        if self._updates is not None:
            r = self._updates.get(name)
            return None if r is None or math.isnan(r) else r
        if optimizer is None or not ps:
            return None
        upd = [u for u in (_estimated_update(optimizer, p) for p in ps) if u is not None]
        w = l2_norm(list(ps))
        return l2_norm(upd) / w if upd and w > 0 else None


def _estimated_update(optimizer: torch.optim.Optimizer, p: torch.nn.Parameter) -> torch.Tensor | None:
    """The update the optimizer's last step made to ``p``, rebuilt from its state (no weight decay)."""
    group = next((g for g in optimizer.param_groups if any(q is p for q in g["params"])), None)
    if group is None:
        return None
    state = optimizer.state.get(p, {})
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
