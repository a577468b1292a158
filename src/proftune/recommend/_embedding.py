"""Embedding size from the data: the ``embedding_dim`` row.

The task is trained once as it is, with the index stream of every embedding table counted in
its first epoch (``proftune.profile.IndexCounter``). Each table's recommended dimension keeps
95% of its trained spectrum's energy above the noise floor (see
``proftune.profile.table_spectrum``); a table whose long tail of rows is read rarely (the rows
outside the 99% of lookups are at least ``LONG_TAIL_ROWS`` of the table) also gets a frequency
threshold: rows read fewer times share ``ceil(rare / ROWS_PER_BUCKET)`` hashed buckets.

The effect is measured: the model is rebuilt at the recommended size and trained again for the
same steps from the same seed, and its metric is set beside the original's, with the
parameters, MACs (the profiler's one counter) and training memory (weights, gradients, optimizer
state) both models hold. The smaller model is built through the task's params where the task
says which param sets a table's columns (``embedding_params = {"user_emb": "dim", ...}``);
otherwise each table is replaced by a factorised one (:class:`FactorizedEmbedding`: rows x k
then k x d, so every layer after it keeps its shapes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from .._device import move_to_device
from .._records import JsonRecord
from .._train_params import TrainParams, as_train_params
from ..metrics import direction
from ..profile import IndexStats, Profile, TableSpectrum
from ..task import Task
from ..train import Callback, EarlyStopping, FitResult, fit, seed_everything
from ._full_batches import samples_per_epoch
from ._measurements import model_static_memory
from ._optimizer import Deadline
from ._records import MeasuredEffect, Recommendation, keep_unless_better

__all__ = ["FactorizedEmbedding", "HashedRows", "TablePlan", "plan_table", "recommend_embedding_dim"]

#: A table has a long tail when the rows outside the 99% of lookups are this share of it or more.
LONG_TAIL_ROWS = 0.10
#: Rare rows per hashed bucket.
ROWS_PER_BUCKET = 8
#: Tables narrower than this are left alone (biases, small categorical features).
MIN_DIM = 8
#: The recommended width keeps this share of the trained table's energy above the noise floor.
SIGNAL_ENERGY = "95%"
#: The resized model ties the original when its best metric is within this share of the original's.
METRIC_TIE = 0.01


class FactorizedEmbedding(nn.Module):
    """An ``nn.Embedding`` of ``rows x rank`` followed by a ``rank x dim`` projection: the table a
    model keeps at width ``dim`` while it holds rank-``rank`` rows (ALBERT's factorisation)."""

    def __init__(self, rows: int, rank: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(rows, rank)
        self.project = nn.Linear(rank, dim, bias=False)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.project(self.embedding(indices)))

    @property
    def weight(self) -> torch.Tensor:
        """The whole table, rows x dim (for code that reads ``table.weight``, e.g. to score all items)."""
        return cast(torch.Tensor, self.project(self.embedding.weight))


class HashedRows(nn.Module):
    """A table whose frequent rows keep their own row and whose rare rows share hashed buckets:
    ``remap[i]`` is row i's place in ``inner`` (rows ``0..kept-1`` own, ``kept..`` buckets)."""

    def __init__(self, inner: nn.Module, remap: torch.Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("remap", remap.long().clone())

    def forward(self, indices: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return cast(torch.Tensor, self.inner(cast(torch.Tensor, self.remap)[indices], *args, **kwargs))

    @property
    def weight(self) -> torch.Tensor:
        """The whole table as the original rows see it (rows x dim)."""
        return cast(torch.Tensor, self.inner.weight)[cast(torch.Tensor, self.remap)]


def hashed_remap(counts: torch.Tensor, min_count: int, buckets: int) -> torch.Tensor:
    """Row -> new row: rows read at least ``min_count`` times keep a row of their own (in order),
    the others go to one of ``buckets`` buckets by a multiplicative hash of their index."""
    keep = counts >= min_count
    remap = torch.empty(counts.numel(), dtype=torch.long)
    kept = int(keep.sum())
    remap[keep] = torch.arange(kept)
    rare = (~keep).nonzero().squeeze(1)
    remap[rare] = kept + (rare * 2654435761) % max(1, buckets)
    return remap


@dataclass(frozen=True)
class TablePlan:
    """What to do with one table: its new width, and for a long tail the threshold and buckets."""

    table: str
    dim: int
    new_dim: int
    rows: int
    min_count: int | None = None
    rows_kept: int | None = None
    buckets: int | None = None

    @property
    def new_rows(self) -> int:
        return self.rows if self.rows_kept is None else self.rows_kept + int(self.buckets or 0)

    def to_dict(self) -> dict[str, object]:
        return {"dim": self.dim, "recommended_dim": self.new_dim, "rows": self.rows, "new_rows": self.new_rows,
                "min_count": self.min_count, "rows_kept": self.rows_kept, "hash_buckets": self.buckets}


def spectrum_is_noise(spectrum: Any) -> bool:
    """Whether no singular value of the trained table stands above the noise floor."""
    return int(spectrum.signal_rank) == 0


def plan_table(stats: Any, spectrum: Any, counts: torch.Tensor) -> TablePlan:
    """The plan for one table from its index stats and spectrum (``proftune.profile`` records)."""
    dim = int(stats.dim)
    signal = int(spectrum.signal_dims.get(SIGNAL_ENERGY, spectrum.signal_rank) or 1)
    # a spectrum with nothing above the noise floor says the table has not learned yet, not that
    # it needs one column: its width is kept (see recommend_embedding_dim)
    new_dim = dim if dim < MIN_DIM or spectrum_is_noise(spectrum) else max(1, min(dim, signal))
    if new_dim >= 16:
        new_dim = min(dim, 8 * math.ceil(new_dim / 8))  # friendlier to matmul kernels
    rare_rows = stats.rows - stats.rows_for_99
    if stats.lookups == 0 or rare_rows < LONG_TAIL_ROWS * stats.rows:
        return TablePlan(stats.table, dim, new_dim, stats.rows)
    min_count = max(2, int(stats.count_at_99))
    rare = int((counts < min_count).sum())
    buckets = max(1, math.ceil(rare / ROWS_PER_BUCKET))
    if rare <= buckets:
        return TablePlan(stats.table, dim, new_dim, stats.rows)
    return TablePlan(stats.table, dim, new_dim, stats.rows, min_count=min_count,
                     rows_kept=stats.rows - rare, buckets=buckets)


# -- building and training the two models --------------------------------------------------------


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)


def _resized(task: Task, params: TrainParams, plans: list[TablePlan],
             counts: dict[str, torch.Tensor]) -> tuple[nn.Module, TrainParams, str]:
    """The model at the planned sizes, the params it was built from, and how it was built."""
    declared = dict(getattr(task, "embedding_params", None) or {})
    by_name = {p.table: p for p in plans}
    widths: dict[str, int] = {}
    through_params = [p for p in plans if p.table in declared and p.new_dim != p.dim]
    for p in through_params:
        param = declared[p.table]
        sharing = [q for q in plans if declared.get(q.table) == param]
        widths[param] = max(q.new_dim for q in sharing)  # tables that share a param share a width
    new_params = params.with_params(**widths) if widths else params
    model = task.build_model(new_params.params)
    how = [f"{declared[p.table]}={widths[declared[p.table]]}" for p in through_params]
    tables = {n: m for n, m in model.named_modules() if n in by_name}
    for name, table in tables.items():
        plan = by_name[name]
        width = int(cast(torch.Tensor, table.weight).shape[1])
        new: nn.Module = table
        rows = plan.new_rows
        if name not in declared and plan.new_dim < width:
            if isinstance(table, nn.EmbeddingBag):
                new = nn.EmbeddingBag(rows, width, mode=table.mode)  # a bag is summed before any projection
            else:
                new = FactorizedEmbedding(rows, plan.new_dim, width)
                how.append(f"{name}: factorised {plan.rows}x{plan.new_dim} + {plan.new_dim}x{width}")
        if plan.rows_kept is not None and plan.min_count is not None and plan.buckets is not None:
            remap = hashed_remap(counts[name], plan.min_count, plan.buckets)
            if new is table:
                new = _fewer_rows(table, remap, rows)
            new = HashedRows(new, remap)
            how.append(f"{name}: rows read < {plan.min_count} times hashed into {plan.buckets} buckets")
        if new is not table:
            _set_module(model, name, new)
    return model, new_params, "; ".join(dict.fromkeys(how)) or "no change"


def _fewer_rows(table: nn.Module, remap: torch.Tensor, rows: int) -> nn.Module:
    """``table`` with ``rows`` rows, each started from the task's own initial value of the first
    original row mapped to it (a fresh module would lose the task's initialisation)."""
    weight = cast(torch.Tensor, table.weight)
    if isinstance(table, nn.EmbeddingBag):
        new: nn.Module = nn.EmbeddingBag(rows, weight.shape[1], mode=table.mode)
    else:
        new = nn.Embedding(rows, weight.shape[1])
    first = torch.full((rows,), -1, dtype=torch.long)
    order = torch.arange(remap.numel())
    first.scatter_reduce_(0, remap, order, reduce="amin", include_self=False)
    with torch.no_grad():
        cast(torch.Tensor, new.weight).copy_(weight[first.clamp(min=0)])
    return new


def _primary_metric(task: Task, metrics: dict[str, float]) -> str:
    others = [k for k in metrics if k != "val_loss"]
    for name in others:
        try:
            direction(name, task=task)
            return name
        except Exception:  # noqa: BLE001 - a metric nothing gives a direction to is not comparable
            continue
    return "val_loss"


def _counts(model: nn.Module, example: Any, device: torch.device) -> tuple[int, int]:
    from ..profile import count_model

    c = count_model(model.to(device), move_to_device(example, device))
    return int(c.params_total), int(c.macs)


@dataclass(frozen=True)
class EmbeddingConfig:
    """The row's budget: seconds for both trainings together, the seed, the epochs at most
    (default twice the task's) and the patience of the early stop on the task's metric."""

    budget_s: float = 120.0
    seed: int = 0
    max_epochs: int | None = None
    patience: int = 2


def has_embeddings(task: Task, params: TrainParams, profile: Profile | None = None) -> bool:
    """Whether the task's model has an embedding table: from the profile's layers when it holds
    them (nothing built), else from a model built for the question."""
    if profile is not None and profile.layers:
        return any(layer.type.startswith(("Embedding", "EmbeddingBag")) for layer in profile.layers)
    from ..profile import embedding_tables

    seed_everything(0)
    return bool(embedding_tables(task.build_model(params.params)))


@dataclass(frozen=True)
class _Trained:
    """A model trained to its best epoch: the result, the best metric, its epoch, how it ended."""

    result: FitResult
    best: float
    best_epoch: int
    cut: bool


def _short(task: Task, trained: _Trained) -> bool:
    """Stopped by the time budget before the task's own epochs: too short a training to decide."""
    return trained.cut and trained.result.epochs <= task.default_epochs


def _epoch_seconds(task: Task, params: TrainParams, result: FitResult) -> float:
    """Seconds one epoch took here: the median full epoch, else the partial first one scaled up."""
    epochs = result.curves["epoch"]
    full = sorted(float(e["epoch_s"]) for e in epochs[:-1])
    if full:
        return full[len(full) // 2]
    bs = params.batch_size or 32
    per_epoch = samples_per_epoch(task, params, batch_size=bs, stop_after=1 << 30)
    return result.duration_s * per_epoch / max(1, result.samples)


def _needed_budget(task: Task, params: TrainParams, result: FitResult) -> str:
    """What would decide: the budget for two trainings of the task's own epochs at this machine's pace."""
    epoch_s = _epoch_seconds(task, params, result)
    need = 2 * task.default_epochs * epoch_s * 1.1
    return (f"embedding_budget_s={math.ceil(need)} (two trainings of the task's {task.default_epochs} epochs "
            f"at ~{epoch_s:.1f} s per epoch measured here; the {result.epochs} epoch(s) that ran "
            f"took {result.duration_s:.1f} s)")


def _train_to_best(task: Task, params: TrainParams, metric: str, cfg: EmbeddingConfig, *, epochs: int,
                   device: torch.device, model: nn.Module | None = None,
                   extra: tuple[Callback, ...] = ()) -> _Trained:
    """Train up to ``epochs`` with an early stop on ``metric`` (the best weights restored): a
    narrower table learns more slowly from a small init, and a wider one may peak early and
    overfit, so each model is compared at its own best epoch, not at a fixed step."""
    stop = EarlyStopping(metric, patience=cfg.patience, restore_best=True)
    deadline = Deadline(cfg.budget_s / 2, reason=f"embedding budget share of {cfg.budget_s / 2:.1f} s spent")
    result = fit(task, params, epochs=epochs, device=device, seed=cfg.seed, model=model,
                 callbacks=[*extra, stop, deadline])
    best = float(stop.best) if stop.best is not None else math.nan
    return _Trained(result, best, int(stop.best_at or result.epochs), deadline.hit)


def recommend_embedding_dim(task: Task, params: TrainParams | Mapping[str, Any], *, device: torch.device,
                            profile: Profile | None = None,
                            config: EmbeddingConfig | None = None) -> Recommendation | None:
    """The ``embedding_dim`` row, or None when the task's model has no embedding tables."""
    from ..profile import IndexCounter, embedding_tables, index_stats, table_spectrum
    from ..train import evaluate_model

    cfg = config or EmbeddingConfig()
    params = as_train_params(task, params)  # validated once: each training below takes the record
    if not has_embeddings(task, params, profile):
        return None
    epochs = int(cfg.max_epochs or 2 * task.default_epochs)
    seed_everything(cfg.seed)
    untrained = task.build_model(params.params)
    metric = _primary_metric(task, evaluate_model(task, untrained, device, params.batch_size or 32))
    del untrained
    counter = IndexCounter()
    original = _train_to_best(task, params, metric, cfg, epochs=epochs, device=device, extra=(counter,))
    stats = {n: index_stats(n, c, counter.dims[n]) for n, c in counter.counts.items()}
    tables = embedding_tables(original.result.model)
    weights = {n: cast(torch.Tensor, tables[n].weight) for n in stats}
    broken = sorted(n for n, w in weights.items() if not bool(torch.isfinite(w).all()))
    if broken:
        # a training that diverged (a rate 37x too high) leaves NaN in a table: no spectrum to read
        # (its singular values failed to converge and stopped the optimize loop's compute stage)
        current = {n: int(w.shape[1]) for n, w in weights.items()}
        row = Recommendation("embedding_dim", current, "no spectrum of a diverged table.",
                             {"metric": metric, "max_epochs": epochs, "seed": cfg.seed, "non_finite": broken}, "low")
        return keep_unless_better(row, current, would_decide="a training at these params that stays finite",
                                  inconclusive=(f"the training at these params diverged: {', '.join(broken)} "
                                                "held non-finite weights (NaN or inf)"))
    spectra = {n: table_spectrum(n, weights[n], counter.counts[n]) for n in stats}
    plans = [plan_table(stats[n], spectra[n], counter.counts[n]) for n in stats]
    evidence: dict[str, object] = {"tables": {n: {**stats[n].to_dict(), **spectra[n].to_dict(), **plan.to_dict()}
                                              for n, plan in zip(stats, plans, strict=True)},
                                   "metric": metric, "max_epochs": epochs, "patience": cfg.patience,
                                   "seed": cfg.seed}
    value = {p.table: p.new_dim for p in plans}
    current = {p.table: p.dim for p in plans}
    if _short(task, original):
        # the spectrum of a training cut short is that of a table still learning: nothing to read
        row = Recommendation("embedding_dim", value, _reason(plans, stats, spectra, "") + ".", evidence, "low", "")
        return keep_unless_better(
            row, current, would_decide=_needed_budget(task, params, original.result),
            inconclusive=(f"the original model's training hit the time budget after {original.result.epochs} "
                          f"of the task's {task.default_epochs} epochs, so its tables' spectra are those of "
                          "a model still learning"))
    noise = [p.table for p in plans if p.dim >= MIN_DIM and spectrum_is_noise(spectra[p.table])]
    if all(p.new_dim == p.dim and p.rows_kept is None for p in plans):
        row = Recommendation("embedding_dim", value, _reason(plans, stats, spectra, "keep every table: ") + ".",
                             evidence, "medium", "none: every table uses its columns")
        if not noise:
            return row
        return keep_unless_better(
            row, current, inconclusive=_noise_text(noise, spectra, original),
            would_decide=("a training in which the tables learn: more epochs or more "
                          "interactions per row" + (f"; {_needed_budget(task, params, original.result)}"
                                                    if original.cut else "")))
    seed_everything(cfg.seed)
    small, small_params, how = _resized(task, params, plans, counter.counts)
    resized = _train_to_best(task, small_params, metric, cfg, epochs=epochs, device=device, model=small)
    e = _effect(task, params, small_params, original, resized, metric)
    evidence.update(e.to_dict())
    evidence["built"] = how
    evidence["params_to_set"] = {k: v for k, v in small_params.params.items() if params.params.get(k) != v}
    up = direction(metric, task=task) == "max"
    effect = (f"params {e.original_params:,} -> {e.resized_params:,} ({-e.params_saved:+,}), MACs "
              f"{e.original_macs:,} -> {e.resized_macs:,}, training memory {e.memory_saved_bytes / 2**20:.2f} "
              f"MiB less; retrained: best {metric} {e.resized_metric:.4g} (epoch {resized.best_epoch}) vs "
              f"{e.original_metric:.4g} (epoch {original.best_epoch}) at the original size")
    reason = _reason(plans, stats, spectra, "") + f". Built as: {how}."
    if noise:
        reason += f" {_noise_text(noise, spectra, original)}: their widths are kept."
    row = Recommendation("embedding_dim", value, reason, evidence, "medium", effect)
    measured = MeasuredEffect(metric, float(e.original_metric), float(e.resized_metric), up,
                              tie=METRIC_TIE * max(abs(float(e.original_metric)), 1e-9))
    if _short(task, resized):
        return keep_unless_better(
            row, current, effect=measured, would_decide=_needed_budget(task, small_params, resized.result),
            inconclusive=(f"the resized model's training hit the time budget after {resized.result.epochs} of "
                          f"the task's {task.default_epochs} epochs"))
    return keep_unless_better(row, current, effect=measured)


def _noise_text(noise: list[str], spectra: dict[str, TableSpectrum], original: _Trained) -> str:
    tables = ", ".join(f"{n} (0 singular values above the noise floor {spectra[n].noise_threshold:.3g})"
                       for n in noise)
    return (f"the trained spectrum of {tables} is still noise after {original.result.epochs} epoch(s): "
            "the table has not learned enough to show the width it needs")


@dataclass(frozen=True)
class _ResizeEffect(JsonRecord):
    """The original and the resized model side by side: best metric, step time, metric curve,
    parameters, MACs and training memory (bytes)."""

    original_metric: float
    resized_metric: float
    original_best_epoch: int
    resized_best_epoch: int
    original_step_ms: float
    resized_step_ms: float
    original_curve: list[float]
    resized_curve: list[float]
    original_params: int
    resized_params: int
    params_saved: int
    original_macs: int
    resized_macs: int
    macs_saved: int
    original_memory_bytes: int
    resized_memory_bytes: int
    memory_saved_bytes: int


def _effect(task: Task, params: TrainParams, small_params: TrainParams, original: _Trained,
            resized: _Trained, metric: str) -> _ResizeEffect:
    example = task.example_batch(params.batch_size or 32)
    cpu = torch.device("cpu")
    m_orig, m_small = original.result.model, resized.result.model
    p0, m0 = _counts(m_orig, _inputs(task, m_orig, example), cpu)
    p1, m1 = _counts(m_small, _inputs(task, m_small, example), cpu)
    b0 = model_static_memory(task, m_orig, params)["total"]
    b1 = model_static_memory(task, m_small, small_params)["total"]
    return _ResizeEffect(
        original.best, resized.best, original.best_epoch, resized.best_epoch,
        1e3 * original.result.duration_s / max(1, original.result.steps),
        1e3 * resized.result.duration_s / max(1, resized.result.steps),
        _curve(original.result, metric), _curve(resized.result, metric),
        p0, p1, p0 - p1, m0, m1, m0 - m1, b0, b1, b0 - b1)


def _curve(result: FitResult, metric: str) -> list[float]:
    """The metric after each epoch (where the fit loop evaluated it)."""
    return [float(e[metric]) for e in result.curves["epoch"] if metric in e]


def _inputs(task: Task, model: nn.Module, batch: Any) -> Any:
    """What ``task.loss`` feeds ``model`` for ``batch`` (the inputs the counter needs)."""
    from .._device import capture_inputs

    return capture_inputs(task.loss, model.cpu().eval(), batch)


def _reason(plans: list[TablePlan], stats: dict[str, IndexStats], spectra: dict[str, TableSpectrum],
            head: str) -> str:
    parts = []
    for p in plans:
        st, sp = stats[p.table], spectra[p.table]
        zipf = f", Zipf s={max(st.zipf_exponent, 0.0):.2f}" if st.zipf_exponent is not None else ""
        part = (f"{p.table} ({p.rows}x{p.dim}): {st.never_touched} rows never read, top 1%/10% of rows take "
                f"{st.top1_share:.0%}/{st.top10_share:.0%} of lookups{zipf}; ")
        if p.dim < MIN_DIM:
            part += f"narrower than {MIN_DIM}: its width is kept"
        elif spectrum_is_noise(sp):
            part += (f"trained spectrum: 0 singular values above the noise floor {sp.noise_threshold:.3g} "
                     f"(still noise; stable rank {sp.stable_rank:.1f}) -> its width {p.dim} is kept")
        else:
            part += (f"trained spectrum: {sp.signal_rank} singular values above the noise floor "
                     f"{sp.noise_threshold:.3g}, 95% of the energy above it in {sp.signal_dims.get('95%')} dims "
                     f"(90/95/99% of all the energy in {sp.energy_dims.get('90%')}/"
                     f"{sp.energy_dims.get('95%')}/{sp.energy_dims.get('99%')}), stable rank "
                     f"{sp.stable_rank:.1f} -> dim {p.new_dim}")
        if p.rows_kept is not None:
            part += (f"; long tail: {p.rows - p.rows_kept} rows read < {p.min_count} times share "
                     f"{p.buckets} hashed buckets")
        parts.append(part)
    return head + "; ".join(parts)
