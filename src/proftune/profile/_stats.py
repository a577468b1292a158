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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
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
    """What a tensor's statistics need, taken without a host sync.

    A tensor of at most ``k`` values is copied whole (one op; a layer's output may be changed
    in place later, by a ``ReLU(inplace=True)``), to be stacked with every other whole copy of
    its length (:func:`_stack_summaries`) and reduced later. A larger one is reduced now to its exact sum, sum
    of squares, min and max (0-d tensors on its device) and a random sample of ``k`` values.
    ``keep`` holds on to the values for an exact second look should they hold NaN/Inf (weights:
    they outlive the step anyway). ``shape``: the tensor's shape (the units of a complete copy).
    """

    __slots__ = ("gen", "k", "moments", "n", "sample", "shape", "source")

    def __init__(self, x: torch.Tensor, k: int, gen: torch.Generator | None, *, keep: bool = False) -> None:
        self.n = n = x.numel()
        self.k, self.gen = k, gen
        self.shape = x.shape
        self.moments: tuple[torch.Tensor, ...] | None = None
        if n <= k and not keep:
            self.source = None
            self.sample = x.detach().to(torch.float32, copy=True).reshape(-1)
            return
        f = x.detach().reshape(-1).float()
        self.source = f if keep else None
        if n <= k:
            self.sample = f.clone()
            return
        lo, hi = torch.aminmax(f)
        self.moments = (f.sum(), torch.dot(f, f), lo, hi)
        self.sample = f.index_select(0, _sample_index(n, k, f.device, gen))

    @property
    def complete(self) -> bool:
        """Whether ``sample`` holds every value of the tensor."""
        return self.moments is None


def _reduce_rows(mat: torch.Tensor, *, moments: torch.Tensor | None = None) -> torch.Tensor | np.ndarray:
    """Rows ``[sum, sum of squares, min, max, p1, p50, p99, zero_frac]`` of the samples in
    ``mat``, one per row (percentiles by linear interpolation, as ``torch.quantile``).

    The rows are whole tensors, or samples of tensors whose ``[sum, sum of squares, min, max]``
    rows are ``moments``. NaN sorts last, so the max of a row shows one, as the max of the
    tensor would. On CPU in numpy (float64 sums; its vectorised sort is ~20x torch's there, and
    its small ops cost a third of torch's); elsewhere on the device, as a tensor."""
    if mat.device.type == "cpu":
        return _reduce_rows_numpy(mat, moments=moments)
    return _reduce_rows_torch(mat, moments=moments)


def _reduce_rows_numpy(mat: torch.Tensor, *, moments: torch.Tensor | None = None) -> np.ndarray:
    """:func:`_reduce_rows` of a CPU tensor, in numpy."""
    m = mat.numpy()
    o = np.sort(m, axis=1)
    # a diverged layer's inf/NaN values give inf/NaN statistics (the health checks read them);
    # numpy's "invalid value" warnings about them are not the user's news
    with np.errstate(invalid="ignore", over="ignore"):
        if moments is not None:
            mom = moments.numpy().astype(np.float64)
        else:
            mom = np.stack([m.sum(axis=1, dtype=np.float64), np.einsum("ij,ij->i", m, m, dtype=np.float64),
                            o[:, 0], o[:, -1]], axis=1)
        n = o.shape[1]
        cols = [mom]
        for q in _QUANTILES:
            pos = q * (n - 1)
            a = o[:, math.floor(pos)].astype(np.float64)
            cols.append((a + (o[:, math.ceil(pos)] - a) * (pos - math.floor(pos)))[:, None])
    cols.append((np.count_nonzero(m == 0, axis=1) / n)[:, None])
    return np.concatenate(cols, axis=1)


def _reduce_rows_torch(mat: torch.Tensor, *, moments: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`_reduce_rows` on the tensor's device, in torch ops (no host copy)."""
    ordered = mat.sort(dim=1).values
    if moments is None:
        moments = torch.stack([mat.sum(dim=1), (mat * mat).sum(dim=1), ordered[:, 0], ordered[:, -1]], dim=1)
    n = ordered.shape[1]
    cols = [moments]
    for q in _QUANTILES:
        pos = q * (n - 1)
        cols.append(torch.lerp(ordered[:, math.floor(pos)], ordered[:, math.ceil(pos)], pos - math.floor(pos))[:, None])
    cols.append(((mat == 0).sum(dim=1) / n)[:, None])
    return torch.cat(cols, dim=1)


def _rows_to_host(blocks: Sequence[torch.Tensor | np.ndarray]) -> list[list[float]]:
    """The rows of :func:`_reduce_rows` blocks (of one device) as lists of floats: one host copy."""
    if isinstance(blocks[0], np.ndarray):
        return cast(list, np.concatenate(cast(Sequence[np.ndarray], blocks)).tolist())
    return cast(list, torch.cat(cast(list[torch.Tensor], list(blocks))).double().cpu().tolist())


def _host_floats(tensors: Sequence[torch.Tensor]) -> list[float]:
    """The values of 0-d tensors as floats, in order: one host copy per device, not per tensor."""
    by_dev: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dev.setdefault(t.device, []).append(i)
    if len(by_dev) == 1:
        return torch.stack(list(tensors)).double().cpu().tolist()
    out = [math.nan] * len(tensors)
    for idxs in by_dev.values():
        values = torch.stack([tensors[i] for i in idxs]).double().cpu().tolist()
        for i, v in zip(idxs, values, strict=True):
            out[i] = v
    return out


def _stats_dict(n: int, nonfinite: int, total: float, sq: float, lo: float, hi: float,
                pct: Sequence[float]) -> dict[str, Any]:
    m = n - nonfinite
    mean = total / m if m else math.nan
    var = max(sq / m - mean * mean, 0.0) if m else math.nan
    return {"numel": n, "nonfinite": nonfinite, "mean": mean, "std": math.sqrt(var), "min": lo, "max": hi,
            "p1": pct[0], "p50": pct[1], "p99": pct[2], "zero_frac": pct[3]}


def _nonfinite_stats(n: int, sample: torch.Tensor, source: torch.Tensor | None, k: int,
                     gen: torch.Generator | None) -> dict[str, Any]:
    """The statistics of the finite values of a tensor of ``n`` values that holds NaN/Inf (rare:
    a host sync or two per such tensor). Exact from the kept values (``source``) or a complete
    ``sample``; else the sample's finite values stand for the tensor's, and the non-finite count
    is scaled from the sample (marked ``"estimated": True``)."""
    exact = source is not None or sample.numel() == n
    base = source if source is not None else sample
    good = base[torch.isfinite(base)].float()
    bad = base.numel() - good.numel()
    nonfinite = bad if exact else min(n, max(1, round(bad / base.numel() * n)))
    nan = math.nan
    if good.numel() == 0:
        out = _stats_dict(n, nonfinite, nan, nan, nan, nan, (nan, nan, nan, nan))
    else:
        pick = good
        if good.numel() > k:
            pick = good.index_select(0, _sample_index(good.numel(), k, good.device, gen))
        scale = (n - nonfinite) / good.numel()  # 1 when exact
        total, sq = float(good.sum()) * scale, float(torch.dot(good, good)) * scale
        pct = _rows_to_host([_reduce_rows(pick[None])])[0][4:]
        out = _stats_dict(n, nonfinite, total, sq, float(good.min()), float(good.max()), pct)
    if not exact:
        out["estimated"] = True
    return out


#: Like weights are stacked (copied) into blocks of at most this many values (16 MB in float32):
#: a few ops per block instead of per tensor, and a copy that stays small.
_BLOCK_VALUES = 1 << 22


@dataclass
class _Rows:
    """Like tensors of one step, stacked on their device to be reduced later, all at once.

    ``mat`` holds one row per tensor: the whole tensor (at most ``k`` values; ``moments`` None)
    or a ``k``-sample of it, with the whole tensor's ``[sum, sum of squares, min, max]`` in
    ``moments``. ``sources``: values kept for an exact second look at NaN/Inf (a weight's are the
    parameter's, as they are when reduced); ``shapes``: the tensors' shapes (the units of a whole
    activation)."""

    keys: list[tuple[str, str]]
    mat: torch.Tensor
    moments: torch.Tensor | None
    numels: list[int]
    shapes: list[tuple[int, ...]]
    sources: list[torch.Tensor | None]
    k: int
    gen: torch.Generator | None

    def stats(self, host_rows: list[list[float]]) -> list[dict[str, Any]]:
        """Stat dicts (with ``l2``, the root of the sum of squares of every value) of the rows."""
        out = []
        for i, (total, sq, lo, hi, *pct) in enumerate(host_rows):
            # min and max propagate NaN and an Inf is one of them: both finite <=> every value is
            stats = (_stats_dict(self.numels[i], 0, total, sq, lo, hi, pct) if math.isfinite(lo) and math.isfinite(hi)
                     else _nonfinite_stats(self.numels[i], self.mat[i], self.sources[i], self.k, self.gen))
            stats["l2"] = math.sqrt(sq) if sq >= 0 else math.nan
            out.append(stats)
        return out


def _stack_summaries(keys: Sequence[tuple[str, str]], summaries: Sequence[_Summary]) -> list[_Rows]:
    """The summaries stacked by device, sample length and kind (whole copies or samples): one
    stack per group, not a tensor per summary kept for later."""
    groups: dict[tuple[torch.device, int, bool], list[int]] = {}
    for i, s in enumerate(summaries):
        if s.n:
            groups.setdefault((s.sample.device, s.sample.numel(), s.complete), []).append(i)
    out = []
    for (_, _, complete), idxs in groups.items():
        mat = torch.stack([summaries[i].sample for i in idxs])
        moments = None if complete else torch.stack(
            [m for i in idxs for m in cast(tuple, summaries[i].moments)]).reshape(-1, 4)
        first = summaries[idxs[0]]
        out.append(_Rows([keys[i] for i in idxs], mat, moments, [summaries[i].n for i in idxs],
                         [tuple(summaries[i].shape) for i in idxs], [summaries[i].source for i in idxs],
                         first.k, first.gen))
    return out


def _stack_weights(keys: Sequence[tuple[str, str]], layers: Sequence[Sequence[torch.Tensor]], k: int,
                   gen_of: Callable[[torch.device], torch.Generator]) -> list[_Rows]:
    """Each layer's weights taken as one tensor, read now: weights of one size, device and dtype
    are stacked into blocks, reduced to their moments and a ``k``-sample (the same positions as
    one tensor's, ``_sample_index``) in a few ops per block; the copy goes at once."""
    flats = [ws[0].detach().reshape(-1) if len(ws) == 1 else torch.cat([w.detach().reshape(-1) for w in ws])
             for ws in layers]
    groups: dict[tuple[torch.device, int, torch.dtype], list[int]] = {}
    for i, f in enumerate(flats):
        if f.numel():
            groups.setdefault((f.device, f.numel(), f.dtype), []).append(i)
    out = []
    for (device, n, _), idxs in groups.items():
        gen = gen_of(device)
        columns = _sample_index(n, k, device, gen) if n > k else None
        step = max(1, _BLOCK_VALUES // n)
        for start in range(0, len(idxs), step):
            part = idxs[start:start + step]
            mat = (torch.stack([flats[i] for i in part]) if len(part) > 1 else flats[part[0]][None]).float()
            moments = None
            if columns is not None:
                moments = _row_moments(mat)
                mat = mat.index_select(1, columns)
            elif len(part) == 1:
                mat = mat.clone()  # a view of the parameter: the next step would change it
            # a single weight is a view of the parameter (kept for an exact look at NaN/Inf)
            sources = [flats[i] if len(layers[i]) == 1 else None for i in part]
            out.append(_Rows([keys[i] for i in part], mat, moments, [n] * len(part), [(n,)] * len(part),
                             sources, k, gen))
    return out


def _row_moments(mat: torch.Tensor) -> torch.Tensor:
    """``[sum, sum of squares, min, max]`` of each row (numpy on CPU: a third of torch's cost)."""
    if mat.device.type == "cpu":
        m = mat.numpy()
        return torch.from_numpy(np.stack([m.sum(axis=1, dtype=np.float64), np.einsum("ij,ij->i", m, m),
                                          m.min(axis=1), m.max(axis=1)], axis=1))
    lo, hi = torch.aminmax(mat, dim=1)
    return torch.stack([mat.sum(dim=1), (mat * mat).sum(dim=1), lo, hi], dim=1)


def _reduce(rows: Sequence[_Rows]) -> dict[tuple[str, str], dict[str, Any]]:
    """Stat dicts of every row, by key: a few ops per block and one host copy per device."""
    by_dev: dict[torch.device, list[_Rows]] = {}
    for r in rows:
        by_dev.setdefault(r.mat.device, []).append(r)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for blocks in by_dev.values():
        host = _rows_to_host([_reduce_rows(r.mat, moments=r.moments) for r in blocks])
        at = 0
        for r in blocks:
            out.update(zip(r.keys, r.stats(host[at:at + len(r.keys)]), strict=True))
            at += len(r.keys)
    return out


def tensor_stats(
    x: torch.Tensor, *, sample_size: int = 1024, generator: torch.Generator | None = None,
) -> dict[str, Any]:
    """Mean, std, min, max, p1/p50/p99, fraction of exact zeros and count of non-finite values.

    Moments and range are exact, over the finite values; percentiles and the zero fraction of
    tensors larger than ``sample_size`` elements come from a random sample of that size.
    """
    s = _Summary(x, sample_size, generator, keep=True)
    if not s.n:
        nan = math.nan
        return _stats_dict(0, 0, nan, nan, nan, nan, (nan,) * 4)
    out = _reduce(_stack_summaries([("", "")], [s]))[("", "")]
    del out["l2"]
    return out


#: A unit is dead when it outputs exactly zero for more than this fraction of the positions it
#: sees (samples, and spatial positions for a conv channel).
DEAD_UNIT_ZERO_FRAC = 0.9


#: Samples of the batch a unit is judged on (the first ones: 32 samples, times the spatial
#: positions of a conv channel, show a unit that is off >90% of the time; cheap on any batch).
DEAD_UNIT_ROWS = 32


def _unit_dims(shape: Sequence[int]) -> tuple[int, tuple[int, ...]] | None:
    """The unit dimension of a layer output of ``shape`` (features: dim 1 of conv-like outputs
    of 4+ dims, else the last dim) and the dimensions a unit is seen across; None for outputs
    without a batch and a unit dimension."""
    if len(shape) < 2 or shape[0] < 2:
        return None
    unit = 1 if len(shape) >= 4 else len(shape) - 1
    return unit, tuple(d for d in range(len(shape)) if d != unit)


def _units_fired(t: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """How often each of a layer's units output non-zero over the first
    :data:`DEAD_UNIT_ROWS` samples of the batch, on the tensor's device (no host sync), and the
    positions each unit was seen at (see :func:`_unit_dims`)."""
    dims = _unit_dims(t.shape)
    if dims is None:
        return None
    unit, over = dims
    sub = t.detach()[:DEAD_UNIT_ROWS]
    positions = sub.numel() // max(sub.shape[unit], 1)
    # |sign| is 1 where a unit fired and 0 where it did not: the cheapest exact count on CPU
    return torch.sign(sub).abs_().sum(dim=over), positions


def _fired_blocks(fired: dict[str, tuple[torch.Tensor, int]], rows: Sequence[_Rows]
                  ) -> list[tuple[list[str], torch.Tensor | np.ndarray, int]]:
    """``(layers, fired counts (layers x units), positions)`` blocks: the counts taken in the
    hooks of large outputs, and those of the whole copies of small ones (the activation rows of
    ``rows`` without moments), stacked by shape and counted together (in numpy on CPU)."""
    blocks: list[tuple[list[str], torch.Tensor | np.ndarray, int]] = [
        ([name], counts.reshape(1, -1), positions) for name, (counts, positions) in fired.items()]
    for r in rows:
        if r.moments is not None or r.keys[0][1] != "activation":
            continue
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, shape in enumerate(r.shapes):
            if _unit_dims(shape) is not None:
                by_shape.setdefault(shape, []).append(i)
        for shape, idxs in by_shape.items():
            unit, over = cast(tuple, _unit_dims(shape))
            axes = tuple(d + 1 for d in over)
            sub = (r.mat if len(idxs) == len(r.keys) else r.mat[idxs]).view(len(idxs), *shape)[:, :DEAD_UNIT_ROWS]
            positions = sub[0].numel() // max(shape[unit], 1)
            counts = (np.count_nonzero(sub.numpy(), axis=axes) if sub.device.type == "cpu"
                      else torch.sign(sub).abs_().sum(dim=axes))
            blocks.append(([r.keys[i][0] for i in idxs], counts, positions))
    return blocks


def _dead_fractions(blocks: list[tuple[list[str], torch.Tensor | np.ndarray, int]]) -> dict[str, float]:
    """Per layer, the fraction of its units that output zero more than
    :data:`DEAD_UNIT_ZERO_FRAC` of the time, from :func:`_fired_blocks`: one host copy per device."""
    on_device: dict[torch.device, list[int]] = {}
    host: dict[int, np.ndarray] = {}
    for i, (_, counts, _) in enumerate(blocks):
        if isinstance(counts, np.ndarray):
            host[i] = counts
        elif counts.numel():
            on_device.setdefault(counts.device, []).append(i)
    for idxs in on_device.values():
        flat = torch.cat([cast(torch.Tensor, blocks[i][1]).reshape(-1).double() for i in idxs]).cpu().numpy()
        at = 0
        for i in idxs:
            shape = tuple(blocks[i][1].shape)
            size = int(np.prod(shape))
            host[i] = flat[at:at + size].reshape(shape)
            at += size
    out: dict[str, float] = {}
    for i, counts in host.items():
        names, _, positions = blocks[i]
        if counts.size:
            dead = ((1.0 - counts / positions) > DEAD_UNIT_ZERO_FRAC).mean(axis=1)
            out.update(zip(names, dead.tolist(), strict=True))
    return out


class StepStats:
    """The statistics one step gathered (:meth:`LayerStats.gather`): per layer, its type, calls
    and gradient numbers now, and its weights and activations stacked on the device, reduced
    only when :meth:`result` (or :meth:`kind`) is first asked for. A Monitor keeps the steps that
    still hold some layer's latest statistics and reduces them when its profile is read, so a
    sampled step pays for reading the tensors, not for sorting them."""

    def __init__(self, entries: dict[str, dict[str, Any]], rows: list[_Rows],
                 fired: dict[str, tuple[torch.Tensor, int]]) -> None:
        #: Per layer, in the order layers ran: ``type``, ``calls`` and (covered layers) ``grad``.
        self.entries = entries
        #: Per layer, the kinds gathered for it (``weight``, ``activation``).
        self.kinds: dict[str, list[str]] = {}
        for r in rows:
            for name, kind in r.keys:
                self.kinds.setdefault(name, []).append(kind)
        self._rows = rows
        self._fired = fired
        self._done: dict[tuple[str, str], dict[str, Any]] | None = None

    def kind(self, name: str, kind: str) -> dict[str, Any] | None:
        """The ``weight`` or ``activation`` statistics of layer ``name`` (reducing them all first)."""
        if self._done is None:
            done = _reduce(self._rows)
            dead = _dead_fractions(_fired_blocks(self._fired, self._rows))
            for (layer, what), stats in done.items():
                if what == "activation":
                    del stats["l2"]
                    if layer in dead:
                        stats["dead_frac"] = dead[layer]
                else:
                    stats = {key: stats[key] for key in _WEIGHT_KEYS}
                done[(layer, what)] = stats
            self._done = done
            self._rows, self._fired = [], {}  # the tensors are not needed any more
        return self._done.get((name, kind))

    def result(self) -> dict[str, dict[str, Any]]:
        """Per layer, in the order layers ran: ``weight``, ``activation`` and ``grad`` dicts (see
        :meth:`LayerStats.collect`)."""
        out: dict[str, dict[str, Any]] = {}
        for name, entry in self.entries.items():
            merged = {"type": entry["type"], "calls": entry["calls"]}
            for kind in self.kinds.get(name, ()):
                got = self.kind(name, kind)
                if got is not None:
                    merged[kind] = dict(got)
            if "grad" in entry:
                merged["grad"] = dict(entry["grad"])
            out[name] = merged
        return out


#: What a layer's ``weight`` statistics hold.
_WEIGHT_KEYS = ("l2", "mean", "std", "p1", "p50", "p99", "numel", "nonfinite")


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
        self._act: dict[str, _Summary] = {}
        self._fired: dict[str, tuple[torch.Tensor, int]] = {}  # per layer: units that fired (dead units)
        self._order: dict[str, str] = {}  # layer path -> type, in the order layers ran
        self._mods: dict[str, nn.Module] = {}
        self._calls: dict[str, int] = {}
        self._grads: dict[str, dict[str, Any]] | None = None
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
                summary = self._act[name] = _Summary(t, self.sample_size, self._gen(t.device))
                if not summary.complete:  # a complete copy's units are counted at collect, all at once
                    fired = _units_fired(t)
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
        host = _host_floats(grad_norms + norms)
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
        grads: dict[str, dict[str, Any]] = {}
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

    def capture_gradients(self) -> dict[str, dict[str, Any]]:
        """Gradient norm and non-finite count per layer, read now (grads must be complete):
        one fused norm over every gradient and one host copy."""
        layers, norms = self._pending_grads or self._gradient_norms()
        self._resolve_gradients(layers, _host_floats(norms) if norms else [])
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

    def collect(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, dict[str, Any]]:
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
        rows = _stack_weights([(n, "weight") for n in weighted], [self._chosen_weights(n) for n in weighted],
                              self.sample_size, self._gen)
        acts = [n for n in covered if n in self._act] if self.activations else []
        rows += _stack_summaries([(n, "activation") for n in acts], [self._act[n] for n in acts])
        group_of = ({id(p): g for g in optimizer.param_groups for p in g["params"]}
                    if optimizer is not None and self._updates is None else {})
        entries: dict[str, dict[str, Any]] = {}
        for name in order:
            mod = self._modules.get(name) or self._mods.get(name)
            entry: dict[str, Any] = {"type": self._order.get(name, type(mod).__name__ if mod is not None else "?"),
                                     "calls": self._calls.get(name, 0)}
            if self.gradients and grads and name in grads:
                g = dict(grads[name])
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
               group_of: dict[int, dict[str, Any]]) -> float | None:
        if self._updates is not None:
            r = self._updates.get(name)
            return None if r is None or math.isnan(r) else r
        if optimizer is None or not ps:
            return None
        upd = [u for u in (_estimated_update(group_of.get(id(p)), optimizer.state.get(p, {}), p) for p in ps)
               if u is not None]
        w = l2_norm(list(ps))
        return l2_norm(upd) / w if upd and w > 0 else None


def _estimated_update(group: dict[str, Any] | None, state: dict[str, Any],
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
