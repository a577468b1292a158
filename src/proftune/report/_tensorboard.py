"""A Run in TensorBoard: scalars per step and epoch, histograms from the profile's statistics,
the profile's tables as text, and the hparams with the final metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from .._jsonsafe import finite_float
from .._jsonsafe import is_finite_number as _num
from .._optional import require
from ..track import RunRecord, Store

__all__ = ["export_tensorboard", "hparams_of", "quantile_histogram", "summary_writer"]


def summary_writer(logdir: str | Path) -> Any:
    """torch's ``SummaryWriter`` (needs the ``tensorboard`` package)."""
    require("tensorboard", feature="TensorBoard export")  # torch's writer imports it
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(logdir))


def hparams_of(config: Mapping[str, Any]) -> dict[str, bool | int | float | str]:
    """Scalar hyperparameters (``params`` flattened first, then the run's other settings)."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in (config.get("params") or {}).items():
        if isinstance(value, (bool, int, float, str)):
            out[str(key)] = value
    for key, value in config.items():
        if key != "params" and isinstance(value, (bool, int, float, str)) and key not in out:
            out[str(key)] = value
    return out


def export_tensorboard(run: int | RunRecord, logdir: str | Path, *, store: Store | str | None = None,
                       db: str | None = None) -> Path:
    """Write run ``run`` as TensorBoard events under ``logdir``; returns the folder.

    Scalars ``step/<name>`` (x: optimizer step) and ``epoch/<name>`` (x: epoch); for a profile,
    histograms ``weights|activations|gradients/<layer>`` rebuilt from the recorded percentiles
    (p1, p50, p99, min, max: the statistics hold quantiles, not every value) and the per-layer
    table as text; the run's params as hparams with its final metrics.
    """
    if isinstance(run, RunRecord):
        record = run
    else:
        st = store if isinstance(store, Store) else Store(store or db)
        record = st.get_run(int(run))
    folder = Path(logdir)
    folder.mkdir(parents=True, exist_ok=True)
    writer = summary_writer(folder)
    try:
        _scalars(writer, record)
        profile = record.result if record.kind == "profile" else None
        if isinstance(profile, Mapping) and profile.get("layers"):
            _profile(writer, profile)
        writer.add_text("run/overview", _overview_md(record), 0)
        metrics = {f"final/{k}": f for k, v in record.metrics.items() if (f := finite_float(v)) is not None}
        hp = hparams_of(record.config)
        if hp or metrics:
            writer.add_hparams(hp, metrics or {"final/none": 0.0}, run_name=".")
    finally:
        writer.close()
    return folder


def _scalars(writer: Any, r: RunRecord) -> None:
    for scope in ("step", "epoch"):
        for point in r.curve(scope):
            x: Any = point.get(scope)
            if not _num(x):
                continue
            for key, value in point.items():
                if key not in (scope, "epoch", "step") and _num(value):
                    writer.add_scalar(f"{scope}/{key}", float(value), int(x))
    for i, point in enumerate(r.curve("lr_range")):
        for key in ("loss", "smoothed", "lr"):
            if _num(point.get(key)):
                writer.add_scalar(f"lr_range/{key}", float(point[key]), i)
    for key in ("regret", "uniform_regret"):
        values = r.curves.get(key)
        for i, value in enumerate(values if isinstance(values, list) else []):
            if _num(value):
                writer.add_scalar(f"bandit/{key}", float(value), i + 1)


class QuantileHistogram(TypedDict):
    """Buckets from ``lo`` to each of ``edges``, holding ``counts`` of the ``n`` values."""

    lo: float
    edges: list[float]
    counts: list[float]
    n: float
    mean: float
    std: float


def quantile_histogram(stats: Mapping[str, Any]) -> QuantileHistogram | None:
    """A histogram from a layer's recorded quantiles: 1% of values below p1, 49% up to the
    median, 49% to p99, 1% above; the bucket edges are the quantiles (and min/max where recorded).
    ``{"lo", "edges", "counts", "n", "mean", "std"}``, or None when the quantiles are missing.
    TensorBoard and W&B draw the same buckets."""
    raw: list[Any] = [stats.get("numel"), stats.get("p1"), stats.get("p50"), stats.get("p99")]
    n, p1, p50, p99 = raw
    if not all(_num(v) for v in (n, p1, p50, p99)) or not n:
        return None
    n, p1, p50, p99 = float(n), float(p1), float(p50), float(p99)
    std = float(stats["std"]) if _num(stats.get("std")) else abs(p99 - p1) / 4.65
    mean = float(stats["mean"]) if _num(stats.get("mean")) else p50
    lo = float(stats["min"]) if _num(stats.get("min")) else p1 - (p50 - p1) * 0.25
    hi = float(stats["max"]) if _num(stats.get("max")) else p99 + (p99 - p50) * 0.25
    edges = [p1, p50, p99, max(hi, p99)]
    counts = [0.01 * n, 0.49 * n, 0.49 * n, 0.01 * n]
    # increasing right edges
    for i in range(1, len(edges)):
        edges[i] = max(edges[i], edges[i - 1] + 1e-12)
    return {"lo": min(lo, p1), "edges": edges, "counts": counts, "n": n, "mean": mean, "std": std}


def _histogram(writer: Any, tag: str, stats: Mapping[str, Any]) -> bool:
    h = quantile_histogram(stats)
    if h is None:
        return False
    n, mean, std = h["n"], h["mean"], h["std"]
    writer.add_histogram_raw(tag, min=h["lo"], max=h["edges"][-1], num=int(n), sum=mean * n,
                             sum_squares=n * (std * std + mean * mean), bucket_limits=h["edges"],
                             bucket_counts=h["counts"], global_step=0)
    return True


def _profile(writer: Any, p: Mapping[str, Any]) -> None:
    layers = [lay for lay in p.get("layers") or [] if isinstance(lay, Mapping)]
    for lay in layers:
        name = str(lay.get("name") or "model")
        stats = lay.get("stats") or {}
        for kind, folder in (("weight", "weights"), ("activation", "activations")):
            if isinstance(stats.get(kind), Mapping):
                _histogram(writer, f"{folder}/{name}", stats[kind])
        grad = stats.get("grad") or {}
        if _num(grad.get("norm")):
            writer.add_scalar(f"gradients/norm/{name}", float(grad["norm"]), 0)
        if _num(grad.get("update_ratio")):
            writer.add_scalar(f"gradients/update_ratio/{name}", float(grad["update_ratio"]), 0)
        for key in ("time_share", "forward_ms", "backward_ms"):
            if _num(lay.get(key)):
                writer.add_scalar(f"layers/{key}/{name}", float(lay[key]), 0)
    writer.add_text("profile/layers", _layers_md(layers), 0)
    step, mem = p.get("step") or {}, p.get("memory") or {}
    rows = [*(f"| step {k} | {v:.4g} |" for k, v in step.items() if _num(v)),
            *(f"| memory {k} | {int(v):,} |" for k, v in mem.items() if _num(v))]
    writer.add_text("profile/step_and_memory", "| what | value |\n|---|---|\n" + "\n".join(rows), 0)
    bottlenecks = [b.get("finding") for b in p.get("bottlenecks") or [] if isinstance(b, Mapping)]
    if bottlenecks:
        writer.add_text("profile/bottlenecks", "\n".join(f"- {b}" for b in bottlenecks), 0)
    gradp = p.get("grad") or {}
    for key in ("norm", "var", "update_ratio"):
        if _num(gradp.get(key)):
            writer.add_scalar(f"profile/grad_{key}", float(gradp[key]), 0)
    for key in ("time_ms", "throughput"):
        if _num(step.get(key)):
            writer.add_scalar(f"profile/step_{key}", float(step[key]), 0)
    if _num(mem.get("peak_bytes")):
        writer.add_scalar("profile/peak_memory_bytes", float(mem["peak_bytes"]), 0)


def _md(v: Any) -> str:
    text = f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _layers_md(layers: Sequence[Mapping[str, Any]]) -> str:
    cols = ("name", "type", "params", "macs", "forward_ms", "backward_ms", "activation_bytes", "time_share",
            "params_share", "macs_share")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_md(lay.get(c)) for c in cols) + " |" for lay in layers]
    return "\n".join(lines)


def _overview_md(r: RunRecord) -> str:
    env = r.env or {}
    rows = [("run", r.id), ("kind", r.kind), ("task", r.task), ("status", r.status),
            ("data fingerprint", (r.data_fingerprint or "-")[:8]), ("device", env.get("device")),
            ("torch", env.get("torch")), ("python", env.get("python")), ("git commit", env.get("git_commit"))]
    return "| field | value |\n|---|---|\n" + "\n".join(f"| {k} | {_md(v)} |" for k, v in rows)
