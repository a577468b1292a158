"""Trade-off plots of a compress sweep: metric vs parameters and metric vs latency (PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .._optional import pyplot
from .._paths import replacing
from ._pipeline import Candidate

__all__ = ["PLOT_FILES", "plot_tradeoffs"]

#: The files a ``--plot`` folder receives.
PLOT_FILES = ("metric_vs_params.png", "metric_vs_latency.png")


def plot_tradeoffs(cands: Sequence[Candidate], selected: Candidate | None, folder: Path, *,
                   metric: str) -> list[str]:
    """Write ``metric_vs_params.png`` and ``metric_vs_latency.png`` into ``folder``; return the paths.

    Every candidate is a point labelled by method and ratio; the Pareto front is joined, the
    baseline is a square and the selected candidate a star.
    """
    plt = pyplot("plot_dir=")
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for (key, label), fname in zip((("params", "parameters"), ("latency_ms", "latency at batch 1 (ms)")),
                                   PLOT_FILES, strict=True):
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for c in cands:
            marker = "s" if c.method == "baseline" else "o"
            ax.scatter(getattr(c, key), c.metric, marker=marker, s=40,
                       color="tab:blue" if c.pareto else "tab:gray", zorder=3)
            ax.annotate(f"{c.method} {c.ratio:g}" if c.ratio else c.method, (getattr(c, key), c.metric),
                        fontsize=7, xytext=(4, 3), textcoords="offset points")
        front = sorted((c for c in cands if c.pareto), key=lambda c: getattr(c, key))
        if len(front) > 1:
            ax.plot([getattr(c, key) for c in front], [c.metric for c in front], color="tab:blue",
                    lw=1, label="Pareto front (metric vs goal)")
        if selected is not None:
            ax.scatter(getattr(selected, key), selected.metric, marker="*", s=220, color="tab:red",
                       zorder=4, label="selected")
        ax.set_xlabel(label)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        path = folder / fname
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=120)
        plt.close(fig)
        paths.append(str(path))
    return paths
