"""The page of a ``tune`` run and of a study: the best trial, scan, strategy, history, trials,
importance, correlations and the Pareto front."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._jsonsafe import is_finite_number as _num
from ..exceptions import ConfigError
from ..metrics import default_objective, split_objective
from ..track import RunRecord
from ._common import Context, fmt_pct, headline_stat, read_result, register_renderer, short_value
from ._figures import PALETTE, bar, finite, heatmap, layout, line, parallel
from ._html import Cell, Page, Section, clipped, esc, fmt_number, fmt_value, plot_text

if TYPE_CHECKING:  # search needs the [search] extra: its records are read where a study is drawn
    from ..search import ConstraintCheck, ScanResult, SearchResult, Statement, TrialRecord, TrialResult


@dataclass(frozen=True)
class _TrialRow:
    """One trial of a study as the page draws it, from its trial Run and the Run's TrialResult
    (None while it runs, or when it failed before it ended): ``number`` is the trial's (the
    Run's id without a result)."""

    number: int
    state: str
    reason: str | None
    params: Mapping[str, Any]
    metrics: Mapping[str, Any]
    constraints: Mapping[str, ConstraintCheck]
    duration_s: float | None
    run_id: int

    @classmethod
    def of(cls, run: RunRecord, result: TrialResult | None) -> _TrialRow:
        number = result.trial if result is not None and result.trial is not None else run.id
        state = result.state if result is not None else ("running" if run.status == "running" else run.status)
        return cls(number=number, state=str(state), reason=result.reason if result is not None else None,
                   params=p if isinstance(p := run.config.get("params"), Mapping) else {}, metrics=run.metrics,
                   constraints=result.constraints if result is not None else {}, duration_s=run.duration_s,
                   run_id=run.id)


# -- tune / study -----------------------------------------------------------------------------------------
@register_renderer("tune")
def _tune(page: Page, r: RunRecord, ctx: Context) -> None:
    trials = []
    if ctx.store is not None and r.study:
        trials = ctx.store.list_runs(kind="trial", study=r.study)
    study_sections(page, [r], trials)


def study_sections(page: Page, tunes: Sequence[RunRecord], trials: Sequence[RunRecord]) -> None:
    """A study from its tune runs (newest first) and trial runs: the best trial, the feasibility
    scan and the strategy, history (every trial), the trials, parallel coordinates, importance,
    correlations and the Pareto front."""
    from ..search import SearchResult, TrialResult

    latest = tunes[0] if tunes else None
    cfg = latest.config if latest else {}
    # the newest tune run's record (none while the first one runs: the trials alone)
    res = read_result(page, latest, SearchResult.from_dict) if latest is not None and latest.result else None
    if res is not None:
        objectives = [o.text for o in res.objectives]
        obj = [(o.metric, "max" if o.direction == "maximize" else "min") for o in res.objectives]
        constraints = [c.text for c in res.constraints]
    else:
        objectives, constraints = ([str(x) for x in v] if isinstance(v := cfg.get(k), list) else []
                                   for k in ("objectives", "constraints"))
        obj = [o for o in map(_objective, objectives) if o is not None]
    reported = {k for t in trials for k in (t.metrics or {})} or None
    obj = obj or [split_objective(default_objective(reported))]
    rows: list[_TrialRow] = []
    unread: list[str] = []
    for t in trials:
        try:  # a trial Run's record (none while it runs, or when it failed before it ended)
            tr = TrialResult.from_dict(dict(t.result)) if t.result else None
        except ConfigError as exc:
            tr = None
            unread.append(f"run {t.id}: {exc}")
        rows.append(_TrialRow.of(t, tr))
    rows.sort(key=lambda row: (row.number, row.run_id))
    s = page.section("Study")
    if unread:
        s.para(f"{len(unread)} trial run(s) cannot be read as their record: {unread[0]}", cls="error")
    _best_trial(s, res, obj)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    s.html('<div class="stats">' + "".join(
        f'<div class="stat"><div class="v">{n}</div><div class="l">{esc(k)}</div></div>'
        for k, n in sorted(counts.items())) + "</div>")
    s.kv([("study", latest.study if latest else "-"), ("objectives", ", ".join(objectives) or "-"),
          ("constraints", ", ".join(constraints) or "-"),
          ("sampler", res.sampler if res else cfg.get("sampler")), ("pruner", res.pruner if res else cfg.get("pruner")),
          ("search backend", _backend(res.backend) if res else "-"),
          ("epochs per trial", cfg.get("epochs")),
          ("trials trained / gated", f"{res.tally.trained} / {res.tally.gated}" if res else "- / -"),
          ("stopped by", (res.stopped if res else None) or "-"),
          ("tune runs", ", ".join(str(t.id) for t in tunes))])
    if res is not None:
        s.kv([(k.replace("_s", "").replace("_", " "), f"{float(v):.1f} s" if k.endswith("_s") else v)
              for k, v in res.compute().items()], title="where the time went")
        _scan_section(page, res.scan)
        _strategy_section(page, res.strategy)
    if not rows:
        s.para("no trials recorded for this study", cls="muted")
        return
    _history(page, rows, obj)
    _trial_table(page, rows, obj, [c.metric for c in res.constraints] if res else
                 [c.split("<")[0].split(">")[0].strip() for c in constraints])
    _parallel(page, rows, obj)
    _importance(page, res.importance if res else {}, complete=counts.get("complete", 0))
    _correlations(page, res.correlations if res else {})
    if len(obj) >= 2:
        _pareto(page, rows, obj, res.pareto if res else [])


def _backend(details: Mapping[str, Any]) -> str:
    """The backend that ran the trials, with what it reported of itself (``counted 1``)."""
    name = str(details.get("backend", "local"))
    extra = ", ".join(f"{k.replace('_', ' ')} {short_value(v)}" for k, v in details.items()
                      if k != "backend" and not isinstance(v, (list, dict)))
    return f"{name} ({extra})" if extra else name


def _best_trial(s: Section, res: SearchResult | None, obj: Sequence[tuple[str, str]]) -> None:
    """The best trial first: its number, objective values and params."""
    best, front = (res.best, res.pareto) if res is not None else (None, [])
    if len(obj) >= 2 and front:
        s.html(f'<p class="verdict good">Pareto front: {len(front)} trial(s) '
               f"({esc(', '.join('#' + str(f.number) for f in front[:12]))})</p>")
        return
    if best is None:
        s.html('<p class="verdict bad">no feasible trial finished: there is no best trial</p>')
        return
    values = ", ".join(f"{n} {fmt_value(n, best.metrics.get(n))}" for n, _ in obj if n in best.metrics)
    s.html(f'<p class="verdict good">best trial: #{esc(best.number)}: {esc(values)}</p>')
    s.para("its params: " + short_value(best.params), cls="muted")
    sel = res.selection if res is not None else None
    if sel is not None:
        interval = (f"95% interval [{fmt_number(sel.low)}, {fmt_number(sel.high)}]" if sel.se is not None
                    else "no interval: no configuration was evaluated twice")
        s.para(f"named best by its mean, not its best draw: {obj[0][0]} {fmt_number(sel.mean)} over "
               f"{sel.n} evaluation(s), {interval}; {sel.repeats} of {sel.evaluations} trials re-evaluated "
               f"leaders" + (f", {sel.neighbours} tried their neighbours" if sel.neighbours else ""))
    stats = [(k, v) for k, v in best.metrics.items() if _num(v)][:10]
    if stats:
        s.html('<div class="stats">' + "".join(
            f'<div class="stat"><div class="v">{esc(headline_stat(k, v))}</div>'
            f'<div class="l">{esc(k)} (best trial)</div></div>'
            for k, v in stats) + "</div>")


def _scan_section(page: Page, scan: ScanResult | None) -> None:
    """The feasibility scan: what it profiled, the bounds it fitted, its notes."""
    if scan is None:
        return
    s = page.section("Feasibility scan")
    s.para(f"{scan.profiles} configurations profiled, not trained, in {scan.duration_s:.1f} s"
           f" against {', '.join(scan.constraints)}; {fmt_pct(scan.feasible_share)} of them feasible"
           + ("; stopped once the bounds were stable" if scan.stopped_early else ""), cls="muted")
    if scan.bounds:
        s.table(["param", "bound", "scanned profiles that agree", "keeps"],
                [[b.param, f"{b.op} {short_value(list(b.value) if b.op == 'in' else b.value)}",
                  f"{b.agree} of {b.total}", ", ".join(b.constraints)]
                 for b in scan.bounds], sortable=False, title="the bounds the study samples inside")
    else:
        s.para("no bounds fitted: the study samples the whole space", cls="muted")
    for note in scan.notes:
        s.para(str(note), cls="muted")


def _strategy_section(page: Page, strategy: Sequence[Statement]) -> None:
    if not strategy:
        return
    s = page.section("Strategy")
    s.para("What the trials say to do next: per constraint the param that drives it, per param restrict, fix, "
           "widen or keep (partial Spearman rho with a bootstrap 95% interval).", cls="muted")
    s.table(["about", "what", "action", "why"],
            [[x.kind, x.subject, x.action, clipped(x.text, 140)] for x in strategy], sortable=False)


def _objective(text: str) -> tuple[str, str] | None:
    """``accuracy:max`` -> (accuracy, max); None when nobody knows the direction (a study stores its
    objectives with theirs, so only a hand-made record lacks one: it is left out, not guessed)."""
    try:
        return split_objective(text)
    except ConfigError:
        return None


def _history(page: Page, rows: Sequence[_TrialRow], obj: Sequence[tuple[str, str]]) -> None:
    """Every trial at its number: a value where it has one, else at the axis floor with why it has
    none (infeasible, pruned, failed) on hover."""
    s = page.section("Optimisation history")
    colors = {"complete": PALETTE[0], "infeasible": PALETTE[1], "pruned": "#868e96", "failed": "#c92a2a",
              "running": "#adb5bd"}
    for name, direction in obj:
        vals = [float(row.metrics[name]) for row in rows if _num(row.metrics.get(name))]
        floor = (min(vals) if direction == "max" else max(vals)) if vals else 0.0
        data: list[dict[str, object]] = []
        for state, color in colors.items():
            pts = [row for row in rows if row.state == state]
            with_v = [row for row in pts if _num(row.metrics.get(name))]
            without = [row for row in pts if not _num(row.metrics.get(name))]
            for group, label, symbol in ((with_v, state, "circle"), (without, f"{state}: no {name}", "x")):
                if not group:
                    continue
                data.append({"type": "scatter", "mode": "markers", "name": label,
                             "x": [row.number for row in group],
                             "y": [row.metrics[name] if symbol == "circle" else floor for row in group],
                             "marker": {"size": 9, "color": color, "symbol": symbol},
                             "hovertext": [plot_text(f"trial {row.number} ({row.state})"
                                                     + (f": {_clip(row.reason, 160)}" if row.reason else "")
                                                     + f"<br>{short_value(row.params)}") for row in group],
                             "hovertemplate": "%{hovertext}<extra></extra>" if symbol == "x"
                             else "%{hovertext}<br>" + name + " %{y:.4g}<extra></extra>"})
        best: list[float | None] = []
        cur: float | None = None
        for row in rows:
            v = finite(row.metrics.get(name)) if row.state == "complete" else None
            if v is not None and (cur is None or (v > cur if direction == "max" else v < cur)):
                cur = v
            best.append(cur)
        data.append({**line([row.number for row in rows], best, f"best so far ({direction})", color=PALETTE[2]),
                     "line": {"shape": "hv", "color": PALETTE[2], "width": 2}})
        missing = sum(1 for row in rows if not _num(row.metrics.get(name)))
        s.chart({"data": data, "layout": layout(f"{name} of every trial ({len(rows)})", x="trial", y=name)})
        if missing:
            s.para(f"{missing} trial(s) have no {name} (gated before training, pruned early or failed): "
                   "drawn as x at the bottom of the axis; hover for why.", cls="muted")


def _clip(text: Any, n: int) -> str:
    t = str(text)
    return t if len(t) <= n else t[: n - 1] + "…"


def _trial_table(page: Page, rows: Sequence[_TrialRow], obj: Sequence[tuple[str, str]],
                 constrained: Sequence[str] = ()) -> None:
    """One line per trial: params, the objectives and the constrained metrics, why it ended (cut
    to one line, whole on hover)."""
    s = page.section("Trials")
    pnames = list(dict.fromkeys(k for row in rows for k in row.params))
    fixed = {k for k in pnames if len({repr(row.params.get(k)) for row in rows}) == 1}
    shown = [p for p in pnames if p not in fixed]
    mnames = list(dict.fromkeys([*(n for n, _ in obj), *constrained]))
    if fixed:
        s.para("the same in every trial: " + ", ".join(f"{k} {fmt_number(rows[0].params.get(k), digits=3)}"
                                                       for k in sorted(fixed)), cls="muted")
    table_rows = []
    for row in rows:
        cons = row.constraints
        broken = [f"{k}: measured {fmt_number(c.value)}" for k, c in cons.items() if not c.ok]
        reason = row.reason or ""
        if broken and row.state == "infeasible" and not reason:
            reason = "; ".join(broken)
        table_rows.append([row.number, row.state,
                           *[Cell(fmt_number(row.params.get(p), digits=3), cls="nw") for p in shown],
                           *[(fmt_value(m, row.metrics.get(m)), finite(row.metrics.get(m)) or 0)
                             if _num(row.metrics.get(m)) else "-" for m in mnames],
                           clipped(reason, 40), (f"{row.duration_s:.1f}", row.duration_s)
                           if _num(row.duration_s) else "-", row.run_id])
    s.table(["#", "state", *shown, *mnames, "why it ended", "seconds", "run"], table_rows,
            row_classes=[row.state for row in rows])


def _parallel(page: Page, rows: Sequence[_TrialRow], obj: Sequence[tuple[str, str]]) -> None:
    done = [row for row in rows if row.state == "complete"]
    if len(done) < 2:
        return
    pnames = [k for k in dict.fromkeys(k for row in done for k in row.params)
              if len({repr(row.params.get(k)) for row in done}) > 1]  # a fixed param is no axis
    target = obj[0][0]
    flat = [{"#": row.number, **row.params, target: row.metrics.get(target)} for row in done]
    s = page.section("Parallel coordinates")
    s.chart(parallel(flat, [*pnames, target], target, title=f"completed trials, coloured by {target}"))


def _importance(page: Page, imp: Mapping[str, Any], *, complete: int = 0) -> None:
    s = page.section("Parameter importance")
    if any(isinstance(per, Mapping) for per in imp.values()):
        importance_charts(s, imp)
    else:
        s.para(f"no importance: fANOVA and PED-ANOVA need at least 2 completed trials ({complete} here)",
               cls="muted")


def importance_charts(s: Section, imp: Mapping[str, Any]) -> None:
    """fANOVA and PED-ANOVA importance per objective into ``s``; a method that gave nothing says why."""
    usable = {m: per for m, per in imp.items() if isinstance(per, Mapping)}
    for metric, per in usable.items():
        data, names = [], {}
        for i, (method, label) in enumerate((("fanova", "fANOVA"), ("ped_anova", "PED-ANOVA"))):
            vals = {k: v for k, v in (per.get(method) or {}).items() if _num(v)}
            if vals:
                data.append(bar(list(vals.values()), list(vals.keys()), label, orientation="h", color=PALETTE[i]))
                names.update(dict.fromkeys(vals))
        notes = []
        for m, label in (("fanova", "fANOVA"), ("ped_anova", "PED-ANOVA")):
            got = per.get(m)
            got_vals = [v for v in (got or {}).values() if _num(v)] if isinstance(got, Mapping) else []
            if isinstance(got, Mapping) and got.get("error"):
                notes.append(f"{label} gave nothing: {got.get('error')}")
            elif not got_vals:
                notes.append(f"{label} gave nothing: it was not computed for {metric}")
            elif not any(float(v) > 0 for v in got_vals):
                notes.append(f"{label} gives every param 0: the completed trials' {metric} does not vary "
                             "with any param as far as its trees can tell (too few or too similar trials)")
        if data:
            s.chart({"data": data, "layout": layout(f"importance for {metric}", x="importance", barmode="group",
                                                    height=max(240, 90 + 40 * len(names)))},
                    side=s.side(lambda t, per=per, names=names: t.table(
                        ["param", "fANOVA", "PED-ANOVA"],
                        [[n, *[_share_cell((per.get(m) or {}).get(n)) for m in ("fanova", "ped_anova")]]
                         for n in names], sortable=False)))
        if data:
            for m, label in (("fanova", "fANOVA"), ("ped_anova", "PED-ANOVA")):
                got = per.get(m) if isinstance(per.get(m), Mapping) else {}
                left = [n for n in names if got and not got.get("error") and not _num(got.get(n))]
                if left:
                    notes.append(f"{label} gives no value for {', '.join(left)}: a param not set in every "
                                 f"completed trial (a conditional one, `when:`) is outside {label}'s model")
        for e in notes:
            s.para(e, cls="muted")


def _share_cell(v: Any) -> Any:
    return (f"{float(v):.3f}", float(v)) if _num(v) else "-"


def _correlations(page: Page, corr: Mapping[str, Any]) -> None:
    params = [p for p, per in corr.items() if isinstance(per, Mapping)]
    targets = list(dict.fromkeys(t for p in params for t in corr[p]))
    if not params or not targets:
        return
    s = page.section("Correlations")
    s.para("How each param moves with the objective and each profile metric, over completed trials "
           "(Pearson: linear; Spearman: rank).", cls="muted")
    for method in ("pearson", "spearman"):
        z = [[(corr[p].get(t) or {}).get(method) for t in targets] for p in params]
        s.chart(heatmap(z, targets, params, title=f"{method.capitalize()} correlation: param × metric"))


def _pareto(page: Page, rows: Sequence[_TrialRow], obj: Sequence[tuple[str, str]],
            front: Sequence[TrialRecord]) -> None:
    (m1, d1), (m2, d2) = obj[0], obj[1]
    done = [row for row in rows if row.state in ("complete", "infeasible")
            and _num(row.metrics.get(m1)) and _num(row.metrics.get(m2))]
    if not done:
        return
    on_front = {f.number for f in front}
    s = page.section("Pareto front")
    data = []
    for name, pts, color, size in (
            ("infeasible", [r for r in done if r.state == "infeasible"], PALETTE[1], 8),
            ("dominated", [r for r in done if r.state == "complete" and r.number not in on_front], "#adb5bd", 9),
            ("Pareto front", sorted([r for r in done if r.number in on_front], key=lambda r: r.metrics[m1]),
             PALETTE[0], 12)):
        if pts:
            data.append({"type": "scatter", "mode": "lines+markers" if name == "Pareto front" else "markers",
                         "name": name, "x": [r.metrics[m1] for r in pts], "y": [r.metrics[m2] for r in pts],
                         "marker": {"size": size, "color": color}, "line": {"color": color, "shape": "hv"},
                         "hovertext": [plot_text(f"trial {r.number}: {short_value(r.params)}") for r in pts],
                         "hovertemplate": "%{hovertext}<br>%{x:.4g}, %{y:.4g}<extra></extra>"})
    s.chart({"data": data, "layout": layout(f"{m1} ({d1}) vs {m2} ({d2})", x=m1, y=m2)},
            side=s.side(lambda t: t.table(["trial", m1, m2], [[f.number, f.metrics.get(m1), f.metrics.get(m2)]
                                                              for f in front], sortable=False, title="front")))
    if len(obj) > 2:
        s.para("more than two objectives: the chart shows the first two; the table lists the whole front.",
               cls="muted")
