"""Summaries of the tensors one step of :class:`~._stats.LayerStats` collected: moments, ranges,
percentiles from a seeded sample, non-finite counts and dead units, reduced in blocks of like
tensors and copied to the host once per device (:class:`StepStats`). See ``_stats.py`` for the
costs and the sampling's error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from ._records import LayerStatistics

__all__ = ["DEAD_UNIT_ROWS", "DEAD_UNIT_ZERO_FRAC", "StepStats", "Summary", "host_floats", "stack_summaries",
           "stack_weights", "tensor_stats", "units_fired"]


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


class Summary:
    """What a tensor's statistics need, taken without a host sync.

    A tensor of at most ``k`` values is copied whole (one op; a layer's output may be changed
    in place later, by a ``ReLU(inplace=True)``), to be stacked with every other whole copy of
    its length (:func:`stack_summaries`) and reduced later. A larger one is reduced now to its exact sum, sum
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


def host_floats(tensors: Sequence[torch.Tensor]) -> list[float]:
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
                pct: Sequence[float]) -> dict[str, float]:
    m = n - nonfinite
    mean = total / m if m else math.nan
    var = max(sq / m - mean * mean, 0.0) if m else math.nan
    return {"numel": n, "nonfinite": nonfinite, "mean": mean, "std": math.sqrt(var), "min": lo, "max": hi,
            "p1": pct[0], "p50": pct[1], "p99": pct[2], "zero_frac": pct[3]}


def _nonfinite_stats(n: int, sample: torch.Tensor, source: torch.Tensor | None, k: int,
                     gen: torch.Generator | None) -> dict[str, float]:
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

    def stats(self, host_rows: list[list[float]]) -> list[dict[str, float]]:
        """Stat dicts (with ``l2``, the root of the sum of squares of every value) of the rows."""
        out = []
        for i, (total, sq, lo, hi, *pct) in enumerate(host_rows):
            # min and max propagate NaN and an Inf is one of them: both finite <=> every value is
            stats = (_stats_dict(self.numels[i], 0, total, sq, lo, hi, pct) if math.isfinite(lo) and math.isfinite(hi)
                     else _nonfinite_stats(self.numels[i], self.mat[i], self.sources[i], self.k, self.gen))
            stats["l2"] = math.sqrt(sq) if sq >= 0 else math.nan
            out.append(stats)
        return out


def stack_summaries(keys: Sequence[tuple[str, str]], summaries: Sequence[Summary]) -> list[_Rows]:
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


def stack_weights(keys: Sequence[tuple[str, str]], layers: Sequence[Sequence[torch.Tensor]], k: int,
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


def _reduce(rows: Sequence[_Rows]) -> dict[tuple[str, str], dict[str, float]]:
    """Stat dicts of every row, by key: a few ops per block and one host copy per device."""
    by_dev: dict[torch.device, list[_Rows]] = {}
    for r in rows:
        by_dev.setdefault(r.mat.device, []).append(r)
    out: dict[tuple[str, str], dict[str, float]] = {}
    for blocks in by_dev.values():
        host = _rows_to_host([_reduce_rows(r.mat, moments=r.moments) for r in blocks])
        at = 0
        for r in blocks:
            out.update(zip(r.keys, r.stats(host[at:at + len(r.keys)]), strict=True))
            at += len(r.keys)
    return out


def tensor_stats(
    x: torch.Tensor, *, sample_size: int = 1024, generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Mean, std, min, max, p1/p50/p99, fraction of exact zeros and count of non-finite values.

    Moments and range are exact, over the finite values; percentiles and the zero fraction of
    tensors larger than ``sample_size`` elements come from a random sample of that size.
    """
    s = Summary(x, sample_size, generator, keep=True)
    if not s.n:
        nan = math.nan
        return _stats_dict(0, 0, nan, nan, nan, nan, (nan,) * 4)
    out = _reduce(stack_summaries([("", "")], [s]))[("", "")]
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


def units_fired(t: torch.Tensor) -> tuple[torch.Tensor, int] | None:
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

    def __init__(self, entries: dict[str, LayerStatistics], rows: list[_Rows],
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
        self._done: dict[tuple[str, str], dict[str, float]] | None = None

    def kind(self, name: str, kind: str) -> dict[str, float] | None:
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

    def result(self) -> dict[str, LayerStatistics]:
        """Per layer, in the order layers ran: ``weight``, ``activation`` and ``grad`` dicts (see
        :meth:`LayerStats.collect`)."""
        out: dict[str, LayerStatistics] = {}
        for name, entry in self.entries.items():
            merged: LayerStatistics = {"type": entry["type"], "calls": entry["calls"]}
            for kind in self.kinds.get(name, ()):
                got = self.kind(name, kind)
                if got is None:
                    continue
                if kind == "weight":
                    merged["weight"] = dict(got)
                else:
                    merged["activation"] = dict(got)
            if "grad" in entry:
                merged["grad"] = dict(entry["grad"])
            out[name] = merged
        return out


#: What a layer's ``weight`` statistics hold.


_WEIGHT_KEYS = ("l2", "mean", "std", "p1", "p50", "p99", "numel", "nonfinite")
