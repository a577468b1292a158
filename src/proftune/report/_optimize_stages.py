"""The optimize page's section of each stage, in the loop's order: baseline, health, layer value,
search (its history, importance and space), the final race, compression."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._jsonsafe import finite_float as _f
from .._optimizers import DEFAULT_LR
from .._units import format_bytes, format_ms, format_seconds
from ..compress import CompressResult
from ..exceptions import ConfigError
from ..optimize import (
    BaselineOutputs,
    CompressOutputs,
    FinalOutputs,
    HealthOutputs,
    LayerValueOutputs,
    OptimizeResult,
    SearchPlan,
    SearchStageOutputs,
    Story,
    TrialLog,
    VsBaseline,
)
from ..search import SearchResult
from ..track import RunRecord
from ._compress_page import candidate_charts, sensitivity_chart
from ._figures import PALETTE, bar, hline, layout, line, vline
from ._html import Cell, Page, Section, clipped, esc, fmt_number, plot_text
from ._optimize_run import OptimizeRun, fmt_num, fmt_param_value, fmt_pm, shorten
from ._tune_page import importance_charts

__all__ = ["ARM_STYLE", "baseline_section", "compression_section", "final_race_section", "health_section",
           "layer_value_section", "search_section"]


#: The arms of the search (where each trial's params came from) and how they are drawn.
ARM_STYLE = {"centre": (PALETTE[2], "diamond", "computed centre"), "defaults": ("#495057", "square", "task defaults"),
             "local": (PALETTE[1], "triangle-up", "local design"), "wide": (PALETTE[4], "square-open", "wide sample"),
             "tpe": (PALETTE[0], "circle", "TPE")}


# -- baseline and health -----------------------------------------------------------------------------
def baseline_section(page: Page, run: OptimizeRun, vs: VsBaseline) -> None:
    b = run.stage(BaselineOutputs)
    m = run.metric
    s = page.section("Baseline")
    nt, dflt = b.no_tricks, b.defaults
    vals = [("no tricks (1 seed)", nt.metrics.get(m)), ("task defaults (1 seed, health checks)", dflt.metrics.get(m)),
            ("task defaults (final race, mean)", vs.defaults.val.mean),
            ("result (final race, mean)", vs.final.val.mean)]
    vals = [(k, v) for k, v in vals if _f(v) is not None]
    s.para(f"Triangulation: the task's defaults beside a run with no tricks (AdamW at lr {DEFAULT_LR:g}, "
           "no weight decay, no dropout), trained as many epochs; their spread says how much tuning can "
           "matter here.", cls="muted")
    side = s.side(lambda t: t.kv([("no tricks", fmt_param_value(nt.params)), ("defaults", fmt_param_value(dflt.params)),
                                  ("epochs", dflt.epochs), ("spread", fmt_num(b.spread)),
                                  ("defaults' training", format_seconds(dflt.duration_s))], title="baseline"))
    if vals:
        s.chart({"data": [bar([k for k, _ in vals], [v for _, v in vals], m, color=PALETTE[0],
                              text=[fmt_num(v) for _, v in vals])],
                 "layout": layout(f"{m}: no tricks, the defaults and the result", y=m, showlegend=False, height=320)},
                side=side)
    else:
        s.html(side)
    diag = run.run(dflt.run_id)
    steps = diag.curve("step") if diag else []
    if steps and any(_f(p.get("loss")) is not None for p in steps):
        s.chart({"data": [line([p.get("step") for p in steps], [p.get("loss") for p in steps], "loss",
                               color=PALETTE[0], width=1.5)],
                 "layout": layout("the defaults' training loss per step (the health checks watched it)", x="step",
                                  y="loss", showlegend=False, height=280)})


def health_section(page: Page, run: OptimizeRun) -> None:
    h = run.stage(HealthOutputs)
    findings = run.stage(BaselineOutputs).findings
    s = page.section("Health")
    if findings:
        s.table(["severity", "cause", "what was seen", "fix"],
                [[f.severity, f.cause, clipped(f.summary, 140), clipped(f.fix, 100)] for f in findings],
                sortable=False, row_classes=[f.severity for f in findings],
                title="findings of the health checks on the defaults' training")
        if h.ignored:
            s.para("error findings were ignored (--ignore-findings)", cls="error")
    else:
        s.para("no findings: the defaults' training looked healthy to every check (NaN/Inf, exploding or "
               "vanishing gradients, dead units, unshuffled data, lr too high or low, overfitting)", cls="muted")
    s.kv([("step time", format_ms(h.step_time_ms)), ("peak memory of a step", format_bytes(h.peak_memory_bytes)),
          ("params", fmt_number(h.params)), ("MACs (forward)", fmt_number(h.macs)),
          ("throughput", f"{fmt_num(h.throughput)} samples/s")], title="the defaults' training step, profiled")


# -- layer value -------------------------------------------------------------------------------------
def layer_value_section(page: Page, run: OptimizeRun) -> None:
    lv = run.stage(LayerValueOutputs)
    s = page.section("Layer value")
    layers = lv.layers
    if not layers:
        s.para("no layers measured" + (f": {'; '.join(lv.notes)}" if lv.notes else ""), cls="muted")
        return
    s.para(f"Each layer's share of the step time beside its share of the measured contribution: the "
           f"{run.metric} lost when its output is replaced by its batch mean.", cls="muted")
    names = [f"{x.name} · {x.type}" for x in layers]
    data = [bar(names, [100 * (_f(getattr(x, k)) or 0) for x in layers], label, color=PALETTE[i])
            for i, (k, label) in enumerate((("time_share", "time share"), ("value_share", "value share"),
                                            ("params_share", "params share")))]
    s.chart({"data": data, "layout": layout("share of step time vs share of value per layer (%)", y="%",
                                            barmode="group", height=340)})
    base = _f(lv.metric)
    # the drop beside what is left of the metric: a drop near the whole metric is a layer the
    # model cannot do without (it falls to chance), not an accuracy misfiled as a drop
    s.table(["layer", "type", "params", "time", "value", f"{run.metric} drop",
             f"without it (of {fmt_num(base)})", "finding"],
            [[clipped(x.name, 28), x.type, x.params,
              Cell(f"{100 * (_f(x.time_share) or 0):.1f}%", sort=_f(x.time_share) or 0),
              Cell(f"{100 * (_f(x.value_share) or 0):.1f}%", sort=_f(x.value_share) or 0),
              Cell(fmt_num(x.drop), sort=_f(x.drop) or 0),
              fmt_num(base - x.drop if base is not None and _f(x.drop) is not None else None),
              clipped(x.finding or "", 40)]  # one line (whole on hover): the findings follow in full
             for x in layers])
    for f in lv.findings:
        s.para(f"layer {f.layer}: {f.finding}; {f.action}")
    if lv.keep:
        s.para("spared by compression (worth more than they cost): " + ", ".join(lv.keep), cls="muted")


# -- search ---------------------------------------------------------------------------------------
def search_section(page: Page, run: OptimizeRun) -> None:
    srch = run.stage(SearchStageOutputs)
    s = page.section("Search")
    s.kv([("study", srch.study), ("trials", srch.trials),
          ("states", ", ".join(f"{k} {v}" for k, v in srch.counts.items())),
          ("arms", ", ".join(f"{ARM_STYLE.get(k, ('', '', k))[2]} {v}" for k, v in srch.arms.items())),
          ("epochs per trial", srch.epochs_per_trial), ("pruner", srch.pruner),
          ("time", format_seconds(srch.duration_s)), ("why it stopped", srch.stop_reason)], title="the search")
    s.para("Where each trial's params came from (its arm): the first trials are the computed centre, the "
           "task's defaults and a local design around the centre (lr x3 and /3, half the batch, a hundredth "
           "of a weight decay nothing measured); then TPE "
           "proposes the rest from every finished trial, away from paused regions.", cls="muted")
    if srch.trials_log:
        _search_history(s, run, srch.trials_log, srch)
    else:
        s.para("the per-trial log is not in this run's record (recorded before it was); the best so far:", cls="muted")
        hist = [h for h in srch.history if isinstance(h, Sequence)]
        if hist:
            s.chart({"data": [{**line([h[0] for h in hist], [h[1] for h in hist], "best so far", color=PALETTE[2]),
                               "line": {"shape": "hv", "color": PALETTE[2], "width": 2}}],
                     "layout": layout(f"{run.metric}: best so far per trial", x="trial", y=run.metric)})
    if srch.flags:
        s.table(["cause", "region", "trials", "action"],
                [[f.cause, f.region, ", ".join(map(str, f.trials)), f.action] for f in srch.flags],
                sortable=False, title="yellow flags: regions paused")
    else:
        s.para("no yellow flags: no region had several trials fail for one cause", cls="muted")
    _space_table(s, srch.search_plan())
    if srch.top:
        s.table(["rank", f"{run.metric} mean ± std", "n", "trials", "arms", "params"],
                [[i + 1, fmt_pm(g.mean, g.std), g.n, ", ".join(map(str, g.trials)), ", ".join(sorted(set(g.arms))),
                  clipped(fmt_param_value(g.params), 110)] for i, g in enumerate(srch.top)],
                sortable=False, title="the best configurations (the final race takes the first ones)")
    imp = _study_importance(run, srch.study or run.r.study or "")
    if imp:
        s.html("<h3>parameter importance</h3>")
        importance_charts(s, imp)
    else:
        s.para("no parameter importance: it needs at least 2 completed trials of the study", cls="muted")


def _study_importance(run: OptimizeRun, study: str) -> dict[str, dict[str, dict[str, float | str]]]:
    """The importance the study's newest tune Run holds ({} without one it can read)."""
    if run.store is None or not study:
        return {}
    tunes = run.store.list_runs(kind="tune", study=study, limit=1)
    if not tunes or not tunes[0].result:
        return {}
    try:
        return SearchResult.from_dict(dict(tunes[0].result)).importance
    except ConfigError:  # a tune Run of an older proftune: the section says there is none
        return {}


def _search_history(s: Section, run: OptimizeRun, trials: Sequence[TrialLog], srch: SearchStageOutputs) -> None:
    """Every trial at its number: its value (or, without one, at the axis floor with why), by arm."""
    maximize = _maximize(run)
    values = [v for v in (_f(t.value) for t in trials) if v is not None]
    floor = (min(values) if maximize else max(values)) if values else 0.0
    data: list[dict[str, object]] = []
    for arm, (color, symbol, label) in ARM_STYLE.items():
        pts = [t for t in trials if (t.arm or "tpe") == arm and _f(t.value) is not None]
        if pts:
            data.append({"type": "scatter", "mode": "markers", "name": label, "x": [t.number for t in pts],
                         "y": [t.value for t in pts], "marker": {"size": 10, "color": color, "symbol": symbol},
                         "hovertext": [plot_text(f"trial {t.number} ({arm}): {t.state}, {format_seconds(t.duration_s)}")
                                       for t in pts],
                         "hovertemplate": "%{hovertext}<br>" + run.metric + " %{y:.4g}<extra></extra>"})
    no_value = [t for t in trials if _f(t.value) is None]
    if no_value:
        data.append({"type": "scatter", "mode": "markers", "name": "no value (pruned, infeasible, failed)",
                     "x": [t.number for t in no_value], "y": [floor] * len(no_value),
                     "marker": {"size": 10, "color": "#c92a2a", "symbol": "x"},
                     "hovertext": [plot_text(f"trial {t.number} ({t.arm}): {t.state}: "
                                             f"{shorten(str(t.reason or 'no reason recorded'), 160)}")
                                   for t in no_value],
                     "hovertemplate": "%{hovertext}<extra></extra>"})
    best, cur = [], None
    ordered = sorted(trials, key=lambda t: t.number)
    for t in ordered:
        v = _f(t.value)
        if v is not None and (cur is None or (v > cur if maximize else v < cur)):
            cur = v
        best.append(cur)
    data.append({**line([t.number for t in ordered], best, "best so far", color=PALETTE[3]),
                 "line": {"shape": "hv", "color": PALETTE[3], "width": 2}})
    shapes, notes = [], []
    dflt = next((t for t in trials if t.arm == "defaults" and _f(t.value) is not None), None)
    if dflt is not None and dflt.value is not None:
        sh, no = hline(float(dflt.value), f"the defaults: {fmt_num(dflt.value)}", color="#495057", dash="dot")
        shapes.append(sh)
        notes.append(no)
    if ordered:
        sh, no = vline(float(ordered[-1].number), "stopped: " + shorten(srch.stop_reason, 60), color="#c92a2a", y=1.0)
        no["xanchor"] = "right"
        shapes.append(sh)
        notes.append(no)
    for f in srch.flags:
        if f.trials:
            shapes.append({"type": "rect", "x0": min(f.trials) - 0.5, "x1": max(f.trials) + 0.5, "y0": 0, "y1": 1,
                           "xref": "x", "yref": "paper", "fillcolor": "rgba(250,176,5,0.15)", "line": {"width": 0}})
            notes.append({"x": (min(f.trials) + max(f.trials)) / 2, "y": 0.02, "xref": "x", "yref": "paper",
                          "text": f"yellow flag: {f.cause}", "showarrow": False,
                          "font": {"size": 11, "color": "#a05a00"}})
    numbers = [t.number for t in ordered]  # on the axis (a lone trial is not drawn on an axis from -1 to 1)
    xaxis = {"range": [min(numbers) - 0.5, max(numbers) + 0.5],
             "dtick": max(1, (max(numbers) - min(numbers) + 1) // 10)} if numbers else {}
    s.chart({"data": data, "layout": layout(f"{run.metric} of every trial, by arm", x="trial", y=run.metric,
                                            shapes=shapes, annotations=notes, height=400, xaxis=xaxis)})
    if len(values) < 2:  # no line to draw: say why, not an empty chart
        states = ", ".join(f"{v} {k.lower()}" for k, v in srch.counts.items() if v)
        s.para(f"{len(values)} of {len(trials)} trial(s) produced a value" + (f" ({states})" if states else "")
               + "; the red crosses are the others, each with why it ended"
               + (f"; the search stopped: {srch.stop_reason}" if srch.stop_reason else ""), cls="verdict bad")


def _maximize(run: OptimizeRun) -> bool:
    obj = run.res.objective if run.res is not None else ""
    if ":" in obj:
        return obj.split(":", 1)[1].startswith("max")
    return True


def _space_table(s: Section, plan: SearchPlan | None) -> None:
    if plan is None or not plan.space.params:
        return
    rows = []
    for p in plan.space.params:
        wide = (", ".join(fmt_num(c) for c in p.choices) if p.choices
                else f"{fmt_num(p.low)} … {fmt_num(p.high)}" + (" (log)" if p.log else ""))
        rows.append([p.name, wide, fmt_num(plan.centre.get(p.name)), clipped(plan.evidence.get(p.name, ""), 100)])
    s.table(["param", "range searched", "computed centre (the first trial)", "centre from"], rows,
            sortable=False, title="the space searched")
    if plan.space.fixed:
        s.para("fixed in every trial: " + ", ".join(f"{k} {fmt_num(v)}" for k, v in plan.space.fixed.items()),
               cls="muted")


# -- the final race ---------------------------------------------------------------------------------
def final_race_section(page: Page, run: OptimizeRun, res: OptimizeResult) -> None:
    race = run.stage(FinalOutputs).race
    vs = res.vs_baseline
    s = page.section("Final race")
    if race is None or not race.arms:
        s.para("the race's runs are not in this store", cls="muted")
        return
    plan = race.plan
    d_epochs = next((a.epochs for a in race.arms if a.name == "defaults"), None) or plan.epochs
    own = (f"; the defaults at their own {d_epochs} epoch(s), as the user runs them"
           if d_epochs != plan.epochs else "")
    s.para(f"The defaults and the search's best trained with the same seeds ({', '.join(map(str, race.seeds))})"
           f": each configuration as the search measured it ({plan.protocol or '-'}, {plan.epochs} "
           f"epoch(s)){own}; judged on validation, reported on held-out data ({vs.held_out_source or '-'}).",
           cls="muted")
    if race.note:
        s.para(f"final race: {race.note}", cls="muted")
    data = []
    for j, (split, label, symbol) in enumerate((("val", "validation", "circle"), ("test", "held out", "diamond"))):
        xs, ys, hover = [], [], []
        for a in race.arms:
            for r in a.runs:
                v = _f(getattr(r, split))
                if v is not None:
                    xs.append(a.name)
                    ys.append(v)
                    hover.append(plot_text(f"{a.name}, seed {r.seed}: {label} {fmt_num(v, 4)}"
                                           + (" (cut by the time limit)" if r.cut else "")))
        if not ys and split == "test":  # no held-out runs (an estimate instead): no empty box
            continue
        data.append({"type": "box", "name": label, "x": xs, "y": ys, "boxpoints": "all", "jitter": 0.4,
                     "pointpos": 0, "marker": {"color": PALETTE[j], "symbol": symbol, "size": 8},
                     "line": {"color": PALETTE[j]}, "fillcolor": "rgba(0,0,0,0)", "hovertext": hover,
                     "hoverinfo": "text"})
    s.chart({"data": data, "layout": layout(f"{run.metric} of every seed, per configuration", y=run.metric,
                                            boxmode="group", height=360)},
            side=s.side(lambda t: t.kv(_comparison_items(vs, res.story, prior_std=_f(plan.prior_std)),
                                       title="the decision")))
    cols = ["configuration", "seed", f"{run.metric}, validation", f"{run.metric}, held out", "epochs", "time", "run"]
    rows, classes = [], []
    for a in race.arms:
        for r in a.runs:
            rows.append([a.name, r.seed, Cell(fmt_num(r.val, 4), sort=_f(r.val) or 0),
                         Cell(fmt_num(r.test, 4), sort=_f(r.test) or 0), r.epochs,
                         format_seconds(r.duration_s) + (" (cut)" if r.cut else ""), r.run_id])
            classes.append("best" if a.name == race.chosen else "")
    s.table(cols, rows, row_classes=classes, title="every run of the race")
    s.table(["configuration", "where it came from", "search mean ± std (n)", "params"],
            [[a.name, clipped(a.source, 60), f"{fmt_pm(a.search_mean, a.search_std)} ({a.search_n})",
              clipped(fmt_param_value(a.params), 110)] for a in race.arms],
            sortable=False, title="the configurations")


#: The race's one-sided error rate, split among its tests (``proftune.optimize``'s ``ALPHA``).
_RACE_ALPHA = 0.05


def _bound_label(level: float) -> str:
    """The one stated confidence of the race's bound: 95%, and the level of each test where the
    race's error is split among several."""
    tests = max(1, round(_RACE_ALPHA / max(1.0 - level, 1e-12)))
    if tests == 1:
        return "95% one-sided"
    return f"95% for the race ({level:.1%} one-sided for each of its {tests} tests)"


def _bound_arithmetic(c: Any, prior_std: float | None) -> str | None:
    """How the bound follows from the gain and the noise, as numbers a reader can check:
    ``gain - q x sd / sqrt(n)``, with the noise it was judged against; None where it does not
    come out as the stored bound (a rank test decided)."""
    from scipy import stats

    gain, std, lower, n = _f(c.gain), _f(c.gain_std), _f(c.lower), len(c.seeds)
    if gain is None or lower is None or n < 1:
        return None
    level = float(c.level)
    ways: list[tuple[float, str]] = []
    if prior_std:
        sd = max(std or 0.0, prior_std * 2 ** 0.5)
        noise = (f"one seed's noise {prior_std:.3g} x √2 = {prior_std * 2 ** 0.5:.3g}"
                 + (f", the pairs' own spread {std:.3g}" if std is not None else ""))
        q = float(stats.norm.ppf(level))
        ways.append((gain - q * sd / n ** 0.5, f"{gain:+.3g} - {q:.2f} x {sd:.3g} / √{n} (normal; {noise})"))
    if std is not None and n > 1:
        q = float(stats.t.ppf(level, n - 1))
        ways.append((gain - q * std / n ** 0.5,
                     f"{gain:+.3g} - {q:.2f} x {std:.3g} / √{n} (Student's t, {n - 1} df, the pairs' own spread)"))
    return next((text for value, text in ways if abs(value - lower) <= 1e-9 + 1e-6 * abs(lower)), None)


def _comparison_items(vs: VsBaseline, story: Story, *, prior_std: float | None = None) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = [("decision", f"adopted {vs.leader}" if vs.adopted else "kept the defaults")]
    if prior_std:
        items.append(("seeds' noise", f"std {prior_std:.3g} of one seed (the search's repeats, at least the "
                                      "validation set's sampling noise)"))
    for split, label in (("val", "validation"), ("test", "held out")):
        c = getattr(vs.leader_vs_defaults, split)
        if c is None:
            continue
        gain = _f(c.gain)
        items.append((f"gain, {label}", "-" if gain is None else
                      f"{gain:+.3g}" + (f" ± {fmt_num(c.gain_std, 2)}" if _f(c.gain_std) is not None else "")
                      + f" over {len(c.seeds)} seed(s)"))
        if _f(c.lower) is not None:
            how = _bound_arithmetic(c, prior_std)
            items.append((f"lower bound, {label}", f"{float(c.lower):+.3g} at {_bound_label(float(c.level or 0.95))}"
                          + (f" = {how}" if how else "")))
        items.append((f"beyond noise, {label}", "yes" if c.beyond_noise else "no"))
    told = story.answer("did it help")
    cv = vs.leader_vs_defaults.val
    if told or (cv is not None and cv.reason):
        items.append(("why", told or (cv.reason if cv is not None else "")))
    return items


# -- compression ------------------------------------------------------------------------------------
def compression_section(page: Page, run: OptimizeRun, res: OptimizeResult) -> None:
    comp = run.stage(CompressOutputs)
    final = res.final
    s = page.section("Compression")
    if comp.skipped:
        s.para(f"not tried: {comp.skipped}", cls="muted")
        return
    sel = comp.selected
    verdict = str(res.vs_baseline.compression or comp.verdict or "")
    s.html(f'<p class="verdict {"good" if sel is not None else "bad"}">{esc(verdict)}</p>')
    for t in comp.plan or []:
        s.para(str(t), cls="muted")
    rep = _compress_record(run.run(comp.run_id))
    if rep is not None and rep.candidates:
        candidate_charts(s, rep)
        if rep.sensitivity:
            sensitivity_chart(s, rep)
    elif comp.candidates:
        s.table(["method", f"{run.metric}", "drop", "ms @1", "ms @batch", "size", "within budget"],
                [[c.method, fmt_num(c.metric, 4), fmt_num(c.metric_drop, 2), format_ms(c.latency_ms),
                  format_ms(c.latency_batch_ms), format_bytes(c.size_bytes), "yes" if c.within_budget else "no"]
                 for c in comp.candidates],
                title="candidates")
    if sel is not None:
        s.kv([("chosen", sel.method), (f"{run.metric} (validation / held out)",
                                       f"{fmt_num(sel.metric, 4)} / {fmt_num(sel.test_metric, 4)}"),
              ("latency at batch 1", f"{format_ms(sel.latency_ms)} (uncompressed {format_ms(final.latency_ms)})"),
              (f"latency at batch {final.batch_size or '-'}",
               f"{format_ms(sel.latency_batch_ms)} (uncompressed {format_ms(final.latency_batch_ms)})"),
              ("size", f"{format_bytes(sel.size_bytes)} (uncompressed "
                       f"{format_bytes(comp.baseline.size_bytes if comp.baseline is not None else None)})"),
              ("load it", str(comp.load or "-"))], title="the compressed model")


def _compress_record(crun: RunRecord | None) -> CompressResult | None:
    """The compress Run's record (None without one this proftune can read)."""
    if crun is None or not crun.result:
        return None
    try:
        return CompressResult.from_dict(dict(crun.result))
    except ConfigError:
        return None
