"""After the study: correlations, parameter importance, the Pareto front, and PNG plots.

Correlations are Pearson and Spearman between each parameter (min-max normalised, on a log
scale for log parameters) and the objective(s) and each profile metric. Importance is Optuna's
fANOVA and PED-ANOVA over the feasible complete trials.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from .._jsonsafe import is_finite_number
from .._paths import replacing
from ._constraints import PROFILE_METRICS, Objective
from ._records import TrialRecord
from ._space import Space

__all__ = ["PLOT_FILES", "Correlation", "correlations", "importance", "pareto_front", "plot_study"]

#: The files a study's ``plot`` folder receives (the last only from a PBT run), so that a command
#: can refuse to replace them before it starts.
PLOT_FILES = ("history.png", "correlations.png", "importance.png", "pareto.png", "pbt_schedule.png")

MIN_POINTS = 3
#: fANOVA's forest: 32 trees of at most 8 levels (<= 256 leaves each). Optuna's default (64 trees,
#: 64 levels) grows about a leaf per trial and its marginal variances cost grows with the leaves:
#: 31 s at 1,000 trials against 3.2 s here, importances within 0.005 of each other
#: (benchmarks/scale.py); below ~250 trials the trees are the same.
FANOVA_TREES = 32
FANOVA_MAX_DEPTH = 8


def _param_column(space: Space, name: str, records: Sequence[TrialRecord]) -> list[float | None]:
    try:
        p = space.param(name)
    except KeyError:
        p = None
    col: list[float | None] = []
    for r in records:
        v = r.params.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            col.append(None)
            continue
        x = float(v)
        if p is not None and p.log:
            x = math.log10(x) if x > 0 else None  # type: ignore[assignment]
        col.append(x)
    return col


def _normalise(xs: list[float]) -> list[float]:
    lo, hi = min(xs), max(xs)
    return [0.0 if hi == lo else (x - lo) / (hi - lo) for x in xs]


class Correlation(TypedDict):
    """A param (min-max normalised) against one target: Pearson and Spearman, their p-values, the points."""

    pearson: float
    pearson_p: float
    spearman: float
    spearman_p: float
    n: int


def _corr(xs: list[float], ys: list[float]) -> Correlation | None:
    from scipy import stats

    if len(xs) < MIN_POINTS or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    xn = _normalise(xs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pearson = stats.pearsonr(xn, ys)
        spearman = stats.spearmanr(xn, ys)
    return {"pearson": float(pearson[0]), "pearson_p": float(pearson[1]),
            "spearman": float(spearman[0]), "spearman_p": float(spearman[1]), "n": len(xs)}


def correlations(records: Sequence[TrialRecord], space: Space,
                 objectives: Sequence[Objective]) -> dict[str, dict[str, Correlation]]:
    """``{param: {target: Correlation}}`` for every numeric parameter.

    Targets: each objective (over feasible complete trials) and each profile metric that was
    measured (over every trial that measured it, infeasible ones included).
    """
    complete = [r for r in records if r.state == "complete" and r.values]
    measured = [m for m in PROFILE_METRICS if any(m in r.metrics for r in records)]
    out: dict[str, dict[str, Correlation]] = {}
    for p in space.params:
        per: dict[str, Correlation] = {}
        for i, o in enumerate(objectives):
            col = _param_column(space, p.name, complete)
            pairs = [(x, r.values[i]) for x, r in zip(col, complete, strict=True)
                     if x is not None and r.values is not None]
            res = _corr([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None
            if res:
                per[o.metric] = res
        for m in measured:
            if any(o.metric == m for o in objectives):
                continue
            rows = [r for r in records if m in r.metrics and r.metrics[m] is not None
                    and math.isfinite(float(r.metrics[m]))]
            col = _param_column(space, p.name, rows)
            pairs = [(x, float(r.metrics[m])) for x, r in zip(col, rows, strict=True) if x is not None]
            res = _corr([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None
            if res:
                per[m] = res
        if per:
            out[p.name] = per
    return out


def importance(study: Any, records: Sequence[TrialRecord], objectives: Sequence[Objective],
               *, seed: int = 0) -> dict[str, dict[str, dict[str, float | str]]]:
    """``{objective: {"fanova": {param: share}, "ped_anova": {...}}}`` over feasible complete trials
    (``{"error": why}`` for a method that failed)."""
    import optuna

    keep = {r.number for r in records if r.state == "complete"}
    # a trial whose result never reached the database (its tell lost) has no values to weigh
    trials = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
              if t.number in keep and t.params and t.values is not None]
    out: dict[str, dict[str, dict[str, float | str]]] = {}
    if len(trials) < 2:
        return out
    shadow = optuna.create_study(directions=[study_direction(o) for o in objectives])
    shadow.add_trials([optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                                 values=t.values) for t in trials])
    evaluators = {
        "fanova": lambda: optuna.importance.FanovaImportanceEvaluator(
            n_trees=FANOVA_TREES, max_depth=FANOVA_MAX_DEPTH, seed=seed),
        "ped_anova": lambda: optuna.importance.PedAnovaImportanceEvaluator(),
    }
    for i, o in enumerate(objectives):
        per: dict[str, dict[str, float | str]] = {}
        for name, make in evaluators.items():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    imp = optuna.importance.get_param_importances(
                        shadow, evaluator=make(), target=_target(i), normalize=True)
                per[name] = {k: float(v) for k, v in imp.items()}
            except (ValueError, RuntimeError, ZeroDivisionError, ArithmeticError, AssertionError) as exc:
                # values so large that the estimator's sums overflow (1e308) fail inside Optuna,
                # an AssertionError without a message among them: the study's result stands
                values = [t.values[i] for t in trials]
                why = str(exc) or type(exc).__name__
                per[name] = {"error": f"{why} ({o.metric} from {min(values):.6g} to {max(values):.6g})"}
        out[o.metric] = per
    return out


def study_direction(o: Objective) -> Any:
    from optuna.study import StudyDirection

    return StudyDirection.MAXIMIZE if o.direction == "maximize" else StudyDirection.MINIMIZE


def _target(i: int) -> Callable[[Any], float]:
    """The ``i``-th objective value of a trial (importance of one objective at a time)."""
    return lambda t: float(t.values[i])


def pareto_front(records: Sequence[TrialRecord], objectives: Sequence[Objective]) -> list[TrialRecord]:
    """The non-dominated feasible complete trials (the best one for a single objective).

    In lexicographic order of the (minimised) objectives a trial can only be dominated by one
    before it: for two objectives, by one with a second value no larger (a running minimum,
    O(n log n)); for more, by one already on the front (each trial compared with the front
    only, not with every other trial)."""
    signs = [1.0 if o.direction == "minimize" else -1.0 for o in objectives]
    keyed = sorted(((tuple(s * v for s, v in zip(signs, r.values, strict=True)), r)
                    for r in records if r.state == "complete" and r.values),
                   key=lambda kr: kr[0])
    if len(objectives) == 1:
        return [keyed[0][1]] if keyed else []
    front: list[tuple[tuple[float, ...], TrialRecord]] = []
    if len(objectives) == 2:
        lowest = math.inf  # the least second value of the groups of equal points before this one
        for _, group in itertools.groupby(keyed, key=lambda kr: kr[0]):
            members = list(group)
            second = members[0][0][1]
            if second < lowest:
                front.extend(members)
                lowest = second
        return [r for _, r in front]
    for kr, r in keyed:
        if not any(kq != kr and all(a <= b for a, b in zip(kq, kr, strict=True)) for kq, _ in front):
            front.append((kr, r))
    return [r for _, r in front]


def plot_study(records: Sequence[TrialRecord], objectives: Sequence[Objective],
               corr: dict[str, dict[str, Correlation]], imp: dict[str, dict[str, dict[str, float | str]]],
               front: Sequence[TrialRecord],
               out_dir: str | Path) -> list[str]:
    """Write history, correlation, importance and Pareto PNGs to ``out_dir``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    for name, draw in (("history", lambda: _plot_history(plt, records, objectives[0])),
                       ("correlations", lambda: _plot_correlations(plt, corr)),
                       ("importance", lambda: _plot_importance(plt, imp, objectives[0])),
                       ("pareto", lambda: _plot_pareto(plt, records, objectives, front))):
        fig = draw()
        if fig is None:
            continue
        fig.tight_layout()
        paths.append(str(out / f"{name}.png"))
        with replacing(paths[-1]) as tmp:
            fig.savefig(tmp, dpi=110)
        plt.close(fig)
    return paths


_COLORS = {"complete": "tab:blue", "pruned": "tab:orange", "infeasible": "tab:red",
           "failed": "black", "running": "grey"}


def _plot_history(plt: Any, records: Sequence[TrialRecord], o: Objective) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4))
    for state, color in _COLORS.items():
        pts = [(r.number, float(r.metrics[o.metric])) for r in records if r.state == state
               and o.metric in r.metrics and is_finite_number(r.metrics[o.metric])]
        if pts:
            ax.scatter([n for n, _ in pts], [v for _, v in pts], c=color, label=state, s=18,
                       marker="x" if state == "infeasible" else "o")
    best, trace = None, []
    for r in sorted(records, key=lambda r: r.number):
        if r.state == "complete" and r.values:
            v = r.values[0]
            if best is None or (v > best if o.direction == "maximize" else v < best):
                best = v
        trace.append((r.number, best))
    tr = [(n, b) for n, b in trace if b is not None]
    if tr:
        ax.step([n for n, _ in tr], [b for _, b in tr], where="post", c="tab:green", label="best feasible")
    unmeasured = [r.number for r in records if r.state == "infeasible"
                  and not is_finite_number(r.metrics.get(o.metric))]
    if unmeasured:  # gated before training: no objective, shown on the lower edge
        low = ax.get_ylim()[0]
        ax.scatter(unmeasured, [low] * len(unmeasured), c=_COLORS["infeasible"], marker="x", s=24,
                   label="infeasible (not trained)", clip_on=False)
    ax.set_xlabel("trial")
    ax.set_ylabel(o.metric)
    ax.set_title(f"optimisation history ({o.text})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return fig


def _plot_correlations(plt: Any, corr: dict[str, dict[str, Correlation]]) -> Any:
    if not corr:
        return None
    params = sorted(corr)
    targets = sorted({t for per in corr.values() for t in per})
    mat = np.full((len(params), len(targets)), np.nan)
    for i, p in enumerate(params):
        for j, t in enumerate(targets):
            if t in corr[p]:
                mat[i, j] = corr[p][t]["spearman"]
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(targets), 1.2 + 0.5 * len(params)))
    im = ax.imshow(mat, cmap="coolwarm", vmin=-1, vmax=1, aspect="auto")
    ax.set_xticks(range(len(targets)), targets, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(params)), params, fontsize=8)
    for i in range(len(params)):
        for j in range(len(targets)):
            if not np.isnan(mat[i, j]):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="Spearman")
    ax.set_title("parameter correlations")
    return fig


def _plot_importance(plt: Any, imp: dict[str, dict[str, dict[str, float | str]]], o: Objective) -> Any:
    fan = (imp.get(o.metric) or {}).get("fanova") or {}
    fan = {k: v for k, v in fan.items() if isinstance(v, float)}
    if not fan:
        return None
    fig, ax = plt.subplots(figsize=(6, 1 + 0.4 * len(fan)))
    names = list(fan)[::-1]
    ax.barh(names, [fan[n] for n in names], color="tab:blue")
    ax.set_xlabel("fANOVA importance")
    ax.set_title(f"parameter importance ({o.metric})")
    return fig


def _plot_pareto(plt: Any, records: Sequence[TrialRecord], objectives: Sequence[Objective],
                 front: Sequence[TrialRecord]) -> Any:
    if len(objectives) < 2:
        return None
    a, b = objectives[0], objectives[1]
    done = [r for r in records if r.state == "complete" and r.values]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter([r.values[0] for r in done if r.values], [r.values[1] for r in done if r.values],
               c="tab:blue", s=16, label="feasible")
    pf = sorted((r for r in front if r.values), key=lambda r: r.values[0] if r.values else 0)
    ax.plot([r.values[0] for r in pf if r.values], [r.values[1] for r in pf if r.values],
            "o-", c="tab:red", label="Pareto front")
    ax.set_xlabel(a.text)
    ax.set_ylabel(b.text)
    ax.legend(fontsize=8)
    ax.set_title("Pareto front")
    return fig


