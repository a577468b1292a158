"""Embedding tables: the index stream that reads them and the spectrum of what they learned.

- The index stream (:class:`IndexCounter`, a fit-loop callback): how often each row of every
  ``nn.Embedding`` / ``nn.EmbeddingBag`` is looked up while training; from the counts
  (:func:`index_stats`) the rows never touched, the share of lookups the top 1% and 10% of rows
  take, and the exponent of a Zipf law count ∝ rank^-s fitted to the head of the distribution.
- The spectrum (:func:`table_spectrum`): the singular values of a trained table over the rows
  the data touched; the dimension that keeps 90/95/99% of the energy (Σσ²), the stable rank
  Σσ²/σ₁², and the signal rank: the singular values above the noise floor that Gavish & Donoho
  (2014, "The optimal hard threshold for singular values is 4/√3") give for a matrix of that
  shape with unknown noise, τ = ω(β)·median(σ), and the signal dimensions: the dimension that
  keeps 90/95/99% of the energy above that floor, Σ(σ² − τ²)₊. A table wider than its data
  needs fits noise in the extra columns: that noise carries energy, so the raw energy
  dimensions overstate what the table uses; the energy above the floor does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import nn

from .._records import JsonRecord
from ..exceptions import ConfigError
from ..train import Callback, FitState

__all__ = ["EMBEDDING_TYPES", "IndexCounter", "IndexStats", "TableSpectrum", "embedding_tables",
           "index_stats", "table_spectrum", "zipf_exponent"]

EMBEDDING_TYPES = (nn.Embedding, nn.EmbeddingBag)
#: Counts below this are too noisy to fit the Zipf law on (the flat tail of a finite sample).
ZIPF_MIN_COUNT = 5
#: Singular values kept in the record (the head of the spectrum, where the decisions are).
KEPT_VALUES = 64


def embedding_tables(model: nn.Module) -> dict[str, nn.Module]:
    """Every ``nn.Embedding`` / ``nn.EmbeddingBag`` of ``model`` by its module path."""
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, EMBEDDING_TYPES)}


class IndexCounter(Callback):
    """Counts the rows each embedding table looks up during the first ``epochs`` training epochs.

    Forward hooks on the tables add ``bincount(indices)`` per call in training mode (the fit
    loop's evaluation runs in eval mode and is not counted).
    """

    def __init__(self, epochs: int = 1) -> None:
        self.epochs = epochs
        self.counts: dict[str, torch.Tensor] = {}
        self.dims: dict[str, int] = {}
        self._handles: list[Any] = []

    def attach(self, model: nn.Module) -> None:
        for name, table in embedding_tables(model).items():
            rows, dim = (int(n) for n in cast(torch.Tensor, table.weight).shape)
            self.counts[name] = torch.zeros(rows, dtype=torch.long)
            self.dims[name] = dim
            self._handles.append(table.register_forward_hook(self._hook(name, rows)))

    def _hook(self, name: str, rows: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not module.training or not args or not isinstance(args[0], torch.Tensor):
                return
            idx = args[0].detach().reshape(-1)
            self.counts[name] += torch.bincount(idx.long(), minlength=rows).cpu()[:rows]

        return hook

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def on_fit_start(self, state: FitState) -> None:
        self.attach(state.model)

    def on_epoch_end(self, state: FitState) -> None:
        if state.epoch >= self.epochs:
            self.detach()

    def on_fit_end(self, state: FitState) -> None:
        self.detach()

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self.detach()


@dataclass(frozen=True)
class IndexStats(JsonRecord):
    """How the training data reads one table (counts of lookups per row)."""

    WHAT: ClassVar[str] = "an embedding's index statistics"

    table: str
    rows: int
    dim: int
    lookups: int
    never_touched: int
    never_touched_share: float
    top1_share: float
    top10_share: float
    zipf_exponent: float | None
    zipf_r2: float | None
    #: Rows that together take 99% of the lookups, and the count of the least-read of them.
    rows_for_99: int
    count_at_99: int


def zipf_exponent(counts: torch.Tensor) -> tuple[float | None, float | None]:
    """``(s, r²)`` of log(count) = a − s·log(rank) over the rows counted at least
    ``ZIPF_MIN_COUNT`` times (None with fewer than 5 such rows)."""
    c = counts[counts >= ZIPF_MIN_COUNT].double().sort(descending=True).values
    if c.numel() < 5:
        return None, None
    x = torch.arange(1, c.numel() + 1, dtype=torch.float64).log()
    y = c.log()
    xm, ym = x.mean(), y.mean()
    slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
    pred = ym + slope * (x - xm)
    ss_res, ss_tot = float(((y - pred) ** 2).sum()), float(((y - ym) ** 2).sum())
    return -slope, (1 - ss_res / ss_tot) if ss_tot > 0 else None


def index_stats(table: str, counts: torch.Tensor, dim: int) -> IndexStats:
    """The sparsity figures of one table from its per-row lookup counts."""
    rows = int(counts.numel())
    total = int(counts.sum())
    ordered = counts.sort(descending=True).values
    share = ordered.double().cumsum(0) / max(total, 1)

    def top(frac: float) -> float:
        k = max(1, math.ceil(rows * frac))
        return float(share[k - 1]) if total else 0.0

    k99 = int((share < 0.99).sum()) + 1 if total else 0
    s, r2 = zipf_exponent(counts)
    never = int((counts == 0).sum())
    return IndexStats(table=table, rows=rows, dim=int(dim), lookups=total, never_touched=never,
                      never_touched_share=never / max(rows, 1), top1_share=top(0.01), top10_share=top(0.10),
                      zipf_exponent=s, zipf_r2=r2, rows_for_99=min(k99, rows),
                      count_at_99=int(ordered[min(k99, rows) - 1]) if total else 0)


@dataclass(frozen=True)
class TableSpectrum(JsonRecord):
    """The singular-value spectrum of a trained table (rows the data touched)."""

    WHAT: ClassVar[str] = "an embedding's spectrum"

    table: str
    rows_used: int
    dim: int
    singular_values: tuple[float, ...]
    energy_dims: dict[str, int]
    stable_rank: float
    signal_rank: int
    noise_threshold: float
    #: The dimensions keeping 90/95/99% of the energy above the noise floor.
    signal_dims: dict[str, int]


def _omega(beta: float) -> float:
    """Gavish & Donoho's ω(β) for unknown noise: τ = ω(β)·median singular value (β ≤ 1)."""
    return 0.56 * beta**3 - 0.95 * beta**2 + 1.82 * beta + 1.43


def table_spectrum(table: str, weight: torch.Tensor, counts: torch.Tensor | None = None) -> TableSpectrum:
    """Singular values of ``weight`` (rows x dim) over the rows ``counts`` says were looked up."""
    w = weight.detach().float().cpu()
    if counts is not None and bool((counts > 0).any()):
        w = w[counts.cpu() > 0]
    if not bool(torch.isfinite(w).all()):
        raise ConfigError(f"table_spectrum(weight=) of {table!r} holds non-finite values (NaN or inf): a training that "
                          "diverged; give the weights of a training whose loss stayed finite.")
    s = torch.linalg.svdvals(w.double())
    energy = s.pow(2)
    total = float(energy.sum())
    dims = _energy_dims(energy)
    rows, cols = w.shape
    beta = min(rows, cols) / max(rows, cols, 1)
    tau = _omega(beta) * float(s.median()) if s.numel() else 0.0
    return TableSpectrum(table=table, rows_used=int(rows), dim=int(cols),
                         singular_values=tuple(float(v) for v in s[:KEPT_VALUES]), energy_dims=dims,
                         stable_rank=total / float(energy[0]) if total > 0 else 0.0,
                         signal_rank=int((s > tau).sum()), noise_threshold=tau,
                         signal_dims=_energy_dims((energy - tau**2).clamp(min=0.0)))


def _energy_dims(energy: torch.Tensor) -> dict[str, int]:
    """The fewest leading components keeping 90/95/99% of ``energy`` (sorted, non-negative)."""
    total = float(energy.sum())
    if total <= 0:
        return {}
    cum = energy.cumsum(0) / total
    return {f"{int(p * 100)}%": int((cum < p - 1e-12).sum()) + 1 for p in (0.90, 0.95, 0.99)}
