"""The report of an ``optimize`` run: the story of the run, top to bottom.

The headline (defaults -> result with its noise, held out, speedup, size, the decision), what
changed and the measurements behind each value, the baseline, health, layer value, the search
(every trial, its arm), the final race (every seed, both splits), compression, and where the
budget went. Everything comes from the Store: the optimize Run, the Runs of its stages
(``parent_id``) and the Runs those name (recommend, diagnose, compress, the study's trials).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._jsonsafe import finite_float as _f
from .._units import format_bytes
from ..compress import CompressResult
from ..recommend import BatchSizeResult, LRFindResult
from ..track import RunRecord, Store
from ._figures import PALETTE, bar, hline, layout, line, vline
from ._html import Cell, Page, Section, clipped, esc, fmt_number, plot_text
from ._sections import (
    Context,
    candidate_charts,
    importance_charts,
    lr_chart,
    memory_model_chart,
    register_renderer,
    sensitivity_chart,
)

#: The arms of the search (where each trial's params came from) and how they are drawn.
ARM_STYLE = {"centre": (PALETTE[2], "diamond", "computed centre"), "defaults": ("#495057", "square", "task defaults"),
             "local": (PALETTE[1], "triangle-up", "local design"), "tpe": (PALETTE[0], "circle", "TPE")}
STAGE_TITLES = {"baseline": "Baseline", "health": "Health", "compute": "What changed", "layer_value": "Layer value",
                "search": "Search", "final": "Final race", "compress": "Compression"}


def _n(v: Any, digits: int = 3) -> str:
    """Three significant digits for people (``0.0679``), whole numbers as they are."""
    f = _f(v)
    if f is None:
        return "-" if v is None else str(v)
    if f.is_integer() and abs(f) < 1e6:
        return f"{int(f):,}" if abs(f) >= 10_000 else str(int(f))
    return f"{f:.{digits}g}"


def _ms(v: Any) -> str:
    f = _f(v)
    return "-" if f is None else f"{f:.3g} ms"


def _secs(v: Any) -> str:
    f = _f(v)
    return "-" if f is None else (f"{f:.0f} s" if f >= 100 else f"{f:.1f} s")


def _pm(s: Mapping[str, Any] | None) -> str:
    if not s or _f(s.get("mean")) is None:
        return "-"
    return _n(s["mean"]) + (f" ± {_n(s['std'], 2)}" if _f(s.get("std")) is not None else "")


class _Run:
    """The optimize Run and the Runs it names, read once from the Store."""

    def __init__(self, r: RunRecord, store: Store | None) -> None:
        self.r, self.store = r, store
        self.res: Mapping[str, Any] = r.result or {}
        self.metric = str(self.res.get("objective") or (r.config or {}).get("objective") or "metric").split(":")[0]
        self.children: dict[str, RunRecord] = {}
        if store is not None:
            for c in reversed(store.list_runs(parent_id=r.id)):  # oldest first: a resumed stage's last run wins
                name = (c.config or {}).get("stage")
                if name and (c.status == "finished" or name not in self.children):
                    self.children[str(name)] = c
        self.compact = {str(s.get("name")): s for s in self.res.get("stages") or [] if isinstance(s, Mapping)}

    def stage(self, name: str) -> Mapping[str, Any]:
        """The stage's whole outputs (its Run), else what the optimize result kept of them."""
        child = self.children.get(name)
        if child is not None and isinstance(child.result, Mapping) and child.result:
            return child.result
        return (self.compact.get(name) or {}).get("outputs") or {}

    def run(self, run_id: Any) -> RunRecord | None:
        if self.store is None or not isinstance(run_id, int):
            return None
        try:
            return self.store.get_run(run_id)
        except Exception:  # noqa: BLE001 - a run deleted from the store: its section says so
            return None


@register_renderer("optimize")
def optimize_sections(page: Page, r: RunRecord, ctx: Context) -> None:
    """Every section of an optimize run's report, in the order of its story."""
    run = _Run(r, ctx.store)
    if not run.res.get("stages"):
        s = page.section("Result")
        s.para("this run holds no result yet" + (f": {r.error}" if r.error else " (it is still running)"),
               cls="muted")
        _stage_chain(s, run)
        return
    _headline(page, run)
    _changes(page, run)
    _baseline(page, run)
    _health(page, run)
    _layer_value(page, run)
    _search(page, run)
    _final_race(page, run)
    _compression(page, run)
    _budget(page, run)
    _files(page, run)


# -- the headline ---------------------------------------------------------------------------------
def _headline(page: Page, run: _Run) -> None:
    res, m = run.res, run.metric
    vs: Mapping[str, Any] = res.get("vs_baseline") or {}
    final: Mapping[str, Any] = res.get("final") or {}
    story: Mapping[str, Any] = res.get("story") or {}
    s = page.section("Result")
    adopted = vs.get("decision") == "chosen"
    s.html(f'<p class="verdict {"good" if adopted else "bad"}">'
           f'{esc(story.get("decision") or vs.get("summary") or "")}</p>')
    dv, fv = vs.get("defaults") or {}, vs.get("final") or {}
    cmp_val = (vs.get("leader_vs_defaults") or {}).get("val") or {}
    seeds = len(final.get("seeds") or [])
    answers = {str(x.get("label")): str(x.get("text")) for x in story.get("lines") or [] if isinstance(x, Mapping)}
    stats = [(f"{m}, validation: defaults → result", f"{_pm(dv.get('val'))} → {_pm(fv.get('val'))}",
              f"{seeds} paired seed(s)", "good" if adopted else "bad"),
             (f"{m}, held out: defaults → result", f"{_pm(dv.get('test'))} → {_pm(fv.get('test'))}",
              str(vs.get("held_out_source") or ""), ""),
             ("beyond noise?", ("yes" if cmp_val.get("beyond_noise") else "no")
              + (f", gain {float(cmp_val['gain']):+.2g}" if _f(cmp_val.get("gain")) is not None else ""),
              answers.get("did it help") or str(cmp_val.get("reason") or ""),
              "good" if cmp_val.get("beyond_noise") else "bad")]
    comp = final.get("compressed")
    if comp:
        r1 = _ratio(final.get("latency_ms"), comp.get("latency_ms"))
        rb = _ratio(final.get("latency_batch_ms"), comp.get("latency_batch_ms"))
        stats.append(("compressed: speed-up at batch 1 / batch " + str(final.get("batch_size") or "-"),
                      f"{_x(r1)} / {_x(rb)}", f"{comp.get('method')}: {_ms(comp.get('latency_ms'))} vs "
                      f"{_ms(final.get('latency_ms'))} uncompressed", "good" if (r1 or 0) > 1 else "bad"))
        saved = (run.stage("compress").get("baseline") or {}).get("size_bytes") or final.get("size_bytes")
        stats.append(("size as saved: uncompressed → compressed",
                      f"{format_bytes(saved)} → {format_bytes(comp.get('size_bytes'))}", "", ""))
    else:
        stats.append(("compression", "kept the uncompressed model", str(vs.get("compression") or ""), ""))
        stats.append(("model", f"{format_bytes(final.get('size_bytes'))}, {_ms(final.get('latency_ms'))} at batch 1",
                      "", ""))
    stats.append(("time used of the budget", f"{_secs(res.get('elapsed_s'))} of {_secs(res.get('budget_s'))}",
                  str(res.get("stop_reason") or ""), ""))
    s.html('<div class="headline">' + "".join(
        f'<div class="stat {cls}" title="{esc(hint)}"><div class="v">{esc(value)}</div><div class="l">{esc(label)}</div>'
        + (f'<div class="l">{esc(_short(hint, 110))}</div>' if hint else "") + "</div>"
        for label, value, hint, cls in stats) + "</div>")
    lines = [(str(x.get("label")), str(x.get("text"))) for x in story.get("lines") or [] if isinstance(x, Mapping)]
    if lines:
        s.kv(lines, title="what a newcomer asks")
    _stage_chain(s, run)


def _ratio(old: Any, new: Any) -> float | None:
    a, b = _f(old), _f(new)
    return a / b if a is not None and b else None


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _stage_chain(s: Section, run: _Run) -> None:
    """The stages as a row of boxes (one row, never a dangling arrow), each linking to its section."""
    rows = [st for st in run.res.get("stages") or [] if isinstance(st, Mapping)]
    if not rows:
        rows = [{"name": k, "status": c.status, "duration_s": c.duration_s} for k, c in run.children.items()]
    if not rows:
        return
    story = {str(x.get("stage")): x for x in (run.res.get("story") or {}).get("stages") or []
             if isinstance(x, Mapping)}
    boxes = []
    for st in rows:
        name = str(st.get("name"))
        told = story.get(name) or {}
        anchor = STAGE_TITLES.get(name, name).lower().replace(" ", "-")
        lines = [f'<div class="name">{esc(name)}</div>',
                 f'<div class="meta">{esc(st.get("status") or "-")} · {esc(_secs(st.get("duration_s")))}</div>']
        if told.get("numbers"):
            lines.append(f"<div>{esc(told['numbers'])}</div>")
        boxes.append(f'<a class="stage {esc(st.get("status") or "")}" href="#{esc(anchor)}" '
                     f'title="{esc(told.get("did") or "")}">{"".join(lines)}</a>')
    s.html(f'<h3>the stages</h3><div class="chain" style="grid-template-columns:repeat({len(boxes)},minmax(0,1fr))">'
           + "".join(boxes) + "</div>")


# -- what changed -------------------------------------------------------------------------------------
def _change_rows(rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    return [[r.get("param"), f"{_n(r.get('default'))} ({r.get('default_from')})", Cell(_n(r.get("value")), cls="nw"),
             r.get("source"), r.get("why") or ""] for r in rows if r.get("changed")]


def _changes(page: Page, run: _Run) -> None:
    final: Mapping[str, Any] = run.res.get("final") or {}
    vs: Mapping[str, Any] = run.res.get("vs_baseline") or {}
    s = page.section("What changed")
    rows = [r for r in final.get("changes") or [] if isinstance(r, Mapping)]
    cols = ["param", "default (whose)", "result", "from", "why: the measurement or trial behind it"]
    if any(r.get("changed") for r in rows):
        s.table(cols, _change_rows(rows), sortable=False, title="the result against the defaults")
    else:
        s.para("nothing: the result is the task's defaults" if rows else
               "this run's result does not list its changes (recorded before they were)", cls="muted")
    same = [f"{r.get('param')} {_n(r.get('value'))}" for r in rows if not r.get("changed")]
    if same:
        s.para("unchanged: " + ", ".join(same), cls="muted")
    proposed = [r for r in vs.get("leader_changes") or [] if isinstance(r, Mapping)]
    if proposed and vs.get("decision") != "chosen":
        s.table(cols, _change_rows(proposed), sortable=False,
                title=f"what the search's best ({vs.get('leader')}) would have changed: not adopted, "
                      "not better than the defaults beyond noise")
    _evidence(s, run, final)


def _evidence(s: Section, run: _Run, final: Mapping[str, Any]) -> None:
    """The measurements behind the computed values: the LR range curve, the memory model, the
    noise scale, and every other recommendation with its reason."""
    comp = run.stage("compute")
    rec_run = run.run(comp.get("run_id"))
    recs = {str(x.get("name")): x for x in ((rec_run.result or {}) if rec_run else comp).get("recommendations") or []
            if isinstance(x, Mapping)}
    if not recs:
        s.para("no recommendations recorded for this run", cls="muted")
        return
    params = final.get("params") or {}
    lr = recs.get("lr") or {}
    pts = [p for p in ((rec_run.curves or {}).get("lr_range") if rec_run else None) or [] if isinstance(p, Mapping)]
    s.html("<h3>evidence: learning rate</h3>")
    s.para(str(lr.get("reason") or ""))
    if pts:
        marks = [("computed", lr.get("value"), PALETTE[4])]
        if _f(params.get("lr")) is not None and params.get("lr") != lr.get("value"):
            marks.append(("result", params.get("lr"), PALETTE[3]))
        lr_chart(s, LRFindResult.from_dict({**(lr.get("evidence") or {}), "curve": pts}), marks)
    else:
        s.para("the LR range curve is not in this store (recorded before the curve was kept)", cls="muted")
    bs = recs.get("batch_size") or {}
    ev = bs.get("evidence") or {}
    s.html("<h3>evidence: batch size</h3>")
    s.para(str(bs.get("reason") or ""))
    if isinstance(ev, Mapping) and isinstance(ev.get("search"), Mapping):
        memory_model_chart(s, BatchSizeResult.from_dict(dict(ev["search"])))
    elif isinstance(ev, Mapping) and ev.get("memory_model"):
        s.para("the batch-size search's probes are not in this store (recorded before they were kept)", cls="muted")
    crit = recs.get("critical_batch_size") or {}
    cev = crit.get("evidence") or {}
    noise = [p for p in ((rec_run.curves or {}).get("noise_scale") if rec_run else None) or [] if isinstance(p, Mapping)]
    if crit and cev.get("used_steps") is None:  # not measured: the reason alone, no table of dashes
        s.para("gradient noise scale: " + str(crit.get("reason") or "not measured"), cls="muted")
    elif crit:
        items = [("critical batch", crit.get("value")), ("B_simple = tr(Σ)/|G|²", _n(cev.get("b_simple"))),
                 ("tr(Σ)", _n(cev.get("trace_sigma"))), ("|G|²", _n(cev.get("grad_sq_norm"))),
                 ("steps (used / clipped)", f"{cev.get('used_steps')} / {cev.get('clipped_steps')}"),
                 ("micro-batches", f"{cev.get('small_batch')} samples, {cev.get('big_batch')} per step")]
        key = next((k for k in ("b_simple", "b_simple_ema", "ema") if any(_f(p.get(k)) is not None for p in noise)), None)
        side = s.side(lambda t: t.kv(items, title="gradient noise scale"))
        if noise and key:
            s.chart({"data": [line(list(range(1, len(noise) + 1)), [p.get(key) for p in noise], "B_simple",
                                   color=PALETTE[0], markers=True)],
                     "layout": layout("gradient noise scale per measured step (the critical batch)", x="step",
                                      y="B_simple", showlegend=False, height=300, xaxis={"dtick": 1})}, side=side)
        else:
            s.html(side)
        s.para(str(crit.get("reason") or ""), cls="muted")
    others = [x for k, x in recs.items() if k not in ("lr", "batch_size", "critical_batch_size")]
    if others:
        s.table(["recommendation", "value", "confidence", "why", "effect"],
                [[x.get("name"), Cell(_short_value(x.get("value")), cls="nw"), x.get("confidence"),
                  clipped(x.get("reason"), 150), clipped(x.get("effect"), 80)] for x in others],
                sortable=False, title="the other computed values")


def _short_value(v: Any) -> str:
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {_n(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(str(i.get("layer", i.get("name", i))) if isinstance(i, Mapping) else str(i) for i in v) or "none"
    return _n(v) if isinstance(v, (int, float)) else str(v)


# -- baseline and health -----------------------------------------------------------------------------
def _baseline(page: Page, run: _Run) -> None:
    b = run.stage("baseline")
    vs: Mapping[str, Any] = run.res.get("vs_baseline") or {}
    m = run.metric
    s = page.section("Baseline")
    nt, dflt = b.get("no_tricks") or {}, b.get("defaults") or {}
    vals = [("no tricks (1 seed)", (nt.get("metrics") or {}).get(m)),
            ("task defaults (1 seed, health checks)", (dflt.get("metrics") or {}).get(m)),
            ("task defaults (final race, mean)", ((vs.get("defaults") or {}).get("val") or {}).get("mean")),
            ("result (final race, mean)", ((vs.get("final") or {}).get("val") or {}).get("mean"))]
    vals = [(k, v) for k, v in vals if _f(v) is not None]
    s.para("Triangulation: the task's defaults beside a run with no tricks (AdamW at lr 1e-3, no weight decay, "
           "no dropout), trained as many epochs; their spread says how much tuning can matter here.", cls="muted")
    side = s.side(lambda t: t.kv([("no tricks", _short_value(nt.get("params") or {})),
                                  ("defaults", _short_value(dflt.get("params") or {})),
                                  ("epochs", dflt.get("epochs")), ("spread", _n(b.get("spread"))),
                                  ("defaults' training", _secs(dflt.get("duration_s")))], title="baseline"))
    if vals:
        s.chart({"data": [bar([k for k, _ in vals], [v for _, v in vals], m, color=PALETTE[0],
                              text=[_n(v) for _, v in vals])],
                 "layout": layout(f"{m}: no tricks, the defaults and the result", y=m, showlegend=False, height=320)},
                side=side)
    else:
        s.html(side)
    diag = run.run(dflt.get("run_id"))
    steps = [p for p in ((diag.curves or {}).get("step") if diag else None) or [] if isinstance(p, Mapping)]
    if steps and any(_f(p.get("loss")) is not None for p in steps):
        s.chart({"data": [line([p.get("step") for p in steps], [p.get("loss") for p in steps], "loss",
                               color=PALETTE[0], width=1.5)],
                 "layout": layout("the defaults' training loss per step (the health checks watched it)", x="step",
                                  y="loss", showlegend=False, height=280)})


def _health(page: Page, run: _Run) -> None:
    h = run.stage("health")
    b = run.stage("baseline")
    s = page.section("Health")
    findings = [f for f in b.get("findings") or [] if isinstance(f, Mapping)]
    if findings:
        s.table(["severity", "cause", "what was seen", "fix"],
                [[f.get("severity"), f.get("cause"), clipped(f.get("summary"), 140), clipped(f.get("fix"), 100)]
                 for f in findings], sortable=False, row_classes=[str(f.get("severity")) for f in findings],
                title="findings of the health checks on the defaults' training")
        if h.get("ignored"):
            s.para("error findings were ignored (--ignore-findings)", cls="error")
    else:
        s.para("no findings: the defaults' training looked healthy to every check (NaN/Inf, exploding or "
               "vanishing gradients, dead units, unshuffled data, lr too high or low, overfitting)", cls="muted")
    s.kv([("step time", _ms(h.get("step_time_ms"))), ("peak memory of a step", format_bytes(h.get("peak_memory_bytes"))),
          ("params", fmt_number(h.get("params"))), ("MACs (forward)", fmt_number(h.get("macs"))),
          ("throughput", f"{_n(h.get('throughput'))} samples/s")], title="the defaults' training step, profiled")


# -- layer value -------------------------------------------------------------------------------------
def _layer_value(page: Page, run: _Run) -> None:
    lv = run.stage("layer_value")
    s = page.section("Layer value")
    layers = [x for x in lv.get("layers") or [] if isinstance(x, Mapping)]
    if not layers:
        s.para("no layers measured" + (f": {'; '.join(map(str, lv.get('notes') or []))}" if lv.get("notes") else ""),
               cls="muted")
        return
    s.para(f"Each layer's share of the step time beside its share of the measured contribution: the "
           f"{run.metric} lost when its output is replaced by its batch mean.", cls="muted")
    names = [f"{x.get('name')} · {x.get('type')}" for x in layers]
    data = [bar(names, [100 * (_f(x.get(k)) or 0) for x in layers], label, color=PALETTE[i])
            for i, (k, label) in enumerate((("time_share", "time share"), ("value_share", "value share"),
                                            ("params_share", "params share")))]
    s.chart({"data": data, "layout": layout("share of step time vs share of value per layer (%)", y="%",
                                            barmode="group", height=340)})
    s.table(["layer", "type", "params", "time", "value", f"{run.metric} drop", "finding"],
            [[x.get("name"), x.get("type"), x.get("params"), Cell(f"{100 * (_f(x.get('time_share')) or 0):.1f}%",
                                                                 sort=_f(x.get("time_share")) or 0),
              Cell(f"{100 * (_f(x.get('value_share')) or 0):.1f}%", sort=_f(x.get("value_share")) or 0),
              Cell(_n(x.get("drop")), sort=_f(x.get("drop")) or 0), clipped(x.get("finding") or "", 120)]
             for x in layers])
    for f in lv.get("findings") or []:
        if isinstance(f, Mapping):
            s.para(f"layer {f.get('layer')}: {f.get('finding')}; {f.get('action')}")
    if lv.get("keep"):
        s.para("spared by compression (worth more than they cost): " + ", ".join(map(str, lv["keep"])), cls="muted")


# -- search ---------------------------------------------------------------------------------------
def _search(page: Page, run: _Run) -> None:
    srch = run.stage("search")
    s = page.section("Search")
    trials = [t for t in srch.get("trials_log") or [] if isinstance(t, Mapping)]
    counts = srch.get("counts") or {}
    arms = srch.get("arms") or {}
    s.kv([("study", srch.get("study")), ("trials", srch.get("trials")),
          ("states", ", ".join(f"{k} {v}" for k, v in counts.items())),
          ("arms", ", ".join(f"{ARM_STYLE.get(k, ('', '', k))[2]} {v}" for k, v in arms.items())),
          ("epochs per trial", srch.get("epochs_per_trial")), ("pruner", srch.get("pruner")),
          ("time", _secs(srch.get("duration_s"))), ("why it stopped", srch.get("stop_reason"))], title="the search")
    s.para("Where each trial's params came from (its arm): the first trials are the computed centre, the "
           "task's defaults and a local design around the centre (lr x3 and /3, half the batch); then TPE "
           "proposes the rest from every finished trial, away from paused regions.", cls="muted")
    if trials:
        _search_history(s, run, trials, srch)
    else:
        s.para("the per-trial log is not in this run's record (recorded before it was); the best so far:", cls="muted")
        hist = [h for h in srch.get("history") or [] if isinstance(h, Sequence)]
        if hist:
            s.chart({"data": [{**line([h[0] for h in hist], [h[1] for h in hist], "best so far", color=PALETTE[2]),
                               "line": {"shape": "hv", "color": PALETTE[2], "width": 2}}],
                     "layout": layout(f"{run.metric}: best so far per trial", x="trial", y=run.metric)})
    flags = [f for f in srch.get("flags") or [] if isinstance(f, Mapping)]
    if flags:
        s.table(["cause", "region", "trials", "action"],
                [[f.get("cause"), f.get("region"), ", ".join(map(str, f.get("trials") or [])), f.get("action")]
                 for f in flags], sortable=False, title="yellow flags: regions paused")
    else:
        s.para("no yellow flags: no region had several trials fail for one cause", cls="muted")
    _space_table(s, srch.get("plan") or {})
    top = [g for g in srch.get("top") or [] if isinstance(g, Mapping)]
    if top:
        s.table(["rank", f"{run.metric} mean ± std", "n", "trials", "arms", "params"],
                [[i + 1, _pm(g), g.get("n"), ", ".join(map(str, g.get("trials") or [])),
                  ", ".join(sorted(set(map(str, g.get("arms") or [])))), clipped(_short_value(g.get("params") or {}), 110)]
                 for i, g in enumerate(top)],
                sortable=False, title="the best configurations (the final race takes the first ones)")
    tune = _latest_tune(run, str(srch.get("study") or run.r.study or ""))
    imp = (tune.result or {}).get("importance") if tune else None
    if isinstance(imp, Mapping) and imp:
        s.html("<h3>parameter importance</h3>")
        importance_charts(s, imp)
    else:
        s.para("no parameter importance: it needs at least 2 completed trials of the study", cls="muted")


def _latest_tune(run: _Run, study: str) -> RunRecord | None:
    if run.store is None or not study:
        return None
    tunes = run.store.list_runs(kind="tune", study=study, limit=1)
    return tunes[0] if tunes else None


def _search_history(s: Section, run: _Run, trials: Sequence[Mapping[str, Any]], srch: Mapping[str, Any]) -> None:
    """Every trial at its number: its value (or, without one, at the axis floor with why), by arm."""
    maximize = _maximize(run)
    values = [v for v in (_f(t.get("value")) for t in trials) if v is not None]
    floor = (min(values) if maximize else max(values)) if values else 0.0
    data: list[dict[str, Any]] = []
    for arm, (color, symbol, label) in ARM_STYLE.items():
        pts = [t for t in trials if str(t.get("arm") or "tpe") == arm and _f(t.get("value")) is not None]
        if pts:
            data.append({"type": "scatter", "mode": "markers", "name": label, "x": [t.get("number") for t in pts],
                         "y": [t.get("value") for t in pts], "marker": {"size": 10, "color": color, "symbol": symbol},
                         "hovertext": [plot_text(f"trial {t.get('number')} ({arm}): {t.get('state')}, "
                                                 f"{_secs(t.get('duration_s'))}") for t in pts],
                         "hovertemplate": "%{hovertext}<br>" + run.metric + " %{y:.4g}<extra></extra>"})
    no_value = [t for t in trials if _f(t.get("value")) is None]
    if no_value:
        data.append({"type": "scatter", "mode": "markers", "name": "no value (pruned, infeasible, failed)",
                     "x": [t.get("number") for t in no_value], "y": [floor] * len(no_value),
                     "marker": {"size": 10, "color": "#c92a2a", "symbol": "x"},
                     "hovertext": [plot_text(f"trial {t.get('number')} ({t.get('arm')}): {t.get('state')}: "
                                             f"{_short(str(t.get('reason') or 'no reason recorded'), 160)}")
                                   for t in no_value],
                     "hovertemplate": "%{hovertext}<extra></extra>"})
    best, cur = [], None
    ordered = sorted(trials, key=lambda t: int(t.get("number") or 0))
    for t in ordered:
        v = _f(t.get("value"))
        if v is not None and (cur is None or (v > cur if maximize else v < cur)):
            cur = v
        best.append(cur)
    data.append({**line([t.get("number") for t in ordered], best, "best so far", color=PALETTE[3]),
                 "line": {"shape": "hv", "color": PALETTE[3], "width": 2}})
    shapes, notes = [], []
    dflt = next((t for t in trials if t.get("arm") == "defaults" and _f(t.get("value")) is not None), None)
    if dflt is not None:
        sh, no = hline(float(dflt["value"]), f"the defaults: {_n(dflt['value'])}", color="#495057", dash="dot")
        shapes.append(sh)
        notes.append(no)
    if ordered:
        last = ordered[-1].get("number")
        sh, no = vline(float(last or 0), "stopped: " + _short(str(srch.get("stop_reason") or ""), 60),
                       color="#c92a2a", y=1.0)
        no["xanchor"] = "right"
        shapes.append(sh)
        notes.append(no)
    for f in srch.get("flags") or []:
        ts = [int(x) for x in (f.get("trials") or []) if isinstance(x, int)] if isinstance(f, Mapping) else []
        if ts:
            shapes.append({"type": "rect", "x0": min(ts) - 0.5, "x1": max(ts) + 0.5, "y0": 0, "y1": 1, "xref": "x",
                           "yref": "paper", "fillcolor": "rgba(250,176,5,0.15)", "line": {"width": 0}})
            notes.append({"x": (min(ts) + max(ts)) / 2, "y": 0.02, "xref": "x", "yref": "paper",
                          "text": f"yellow flag: {f.get('cause')}", "showarrow": False,
                          "font": {"size": 11, "color": "#a05a00"}})
    s.chart({"data": data, "layout": layout(f"{run.metric} of every trial, by arm", x="trial", y=run.metric,
                                            shapes=shapes, annotations=notes, height=400)})


def _maximize(run: _Run) -> bool:
    obj = str(run.res.get("objective") or "")
    if ":" in obj:
        return obj.split(":", 1)[1].startswith("max")
    return True


def _space_table(s: Section, plan: Mapping[str, Any]) -> None:
    space = (plan.get("space") or {}).get("params") or {}
    if not space:
        return
    centre, why = plan.get("centre") or {}, plan.get("evidence") or {}
    rows = []
    for name, p in space.items():
        if not isinstance(p, Mapping):
            continue
        wide = (", ".join(_n(c) for c in p.get("choices") or []) if p.get("choices")
                else f"{_n(p.get('low'))} … {_n(p.get('high'))}" + (" (log)" if p.get("log") else ""))
        rows.append([name, wide, _n(centre.get(name)), clipped(why.get(name, ""), 100)])
    s.table(["param", "range searched", "computed centre (the first trial)", "centre from"], rows,
            sortable=False, title="the space searched")
    fixed = (plan.get("space") or {}).get("fixed") or {}
    if fixed:
        s.para("fixed in every trial: " + ", ".join(f"{k} {_n(v)}" for k, v in fixed.items()), cls="muted")


# -- the final race ---------------------------------------------------------------------------------
def _final_race(page: Page, run: _Run) -> None:
    fin = run.stage("final")
    race = fin.get("race") or {}
    vs: Mapping[str, Any] = run.res.get("vs_baseline") or {}
    s = page.section("Final race")
    arms = [a for a in race.get("arms") or [] if isinstance(a, Mapping)]
    plan = race.get("plan") or {}
    d_epochs = next((a.get("epochs") for a in race.get("arms") or [] if isinstance(a, Mapping)
                     and a.get("name") == "defaults"), None) or plan.get("epochs")
    own = (f"; the defaults at their own {d_epochs} epoch(s), as the user runs them"
           if d_epochs != plan.get("epochs") else "")
    s.para(f"The defaults and the search's best trained with the same seeds ({', '.join(map(str, race.get('seeds') or []))})"
           f": each configuration as the search measured it ({plan.get('protocol') or '-'}, {plan.get('epochs')} "
           f"epoch(s)){own}; judged on validation, reported on held-out data ({vs.get('held_out_source') or '-'}).",
           cls="muted")
    if race.get("note"):
        s.para(f"final race: {race['note']}", cls="muted")
    if not arms:
        s.para("the race's runs are not in this store", cls="muted")
        return
    data = []
    for j, (split, label, symbol) in enumerate((("val", "validation", "circle"), ("test", "held out", "diamond"))):
        xs, ys, hover = [], [], []
        for a in arms:
            for r in a.get("runs") or []:
                v = _f(r.get(split))
                if v is not None:
                    xs.append(str(a.get("name")))
                    ys.append(v)
                    hover.append(plot_text(f"{a.get('name')}, seed {r.get('seed')}: {label} {_n(v, 4)}"
                                           + (" (cut by the time limit)" if r.get("cut") else "")))
        data.append({"type": "box", "name": label, "x": xs, "y": ys, "boxpoints": "all", "jitter": 0.4,
                     "pointpos": 0, "marker": {"color": PALETTE[j], "symbol": symbol, "size": 8},
                     "line": {"color": PALETTE[j]}, "fillcolor": "rgba(0,0,0,0)", "hovertext": hover,
                     "hoverinfo": "text"})
    s.chart({"data": data, "layout": layout(f"{run.metric} of every seed, per configuration", y=run.metric,
                                            boxmode="group", height=360)},
            side=s.side(lambda t: t.kv(_comparison_items(vs, run.res.get("story") or {}), title="the decision")))
    cols = ["configuration", "seed", f"{run.metric}, validation", f"{run.metric}, held out", "epochs", "time", "run"]
    rows, classes = [], []
    for a in arms:
        for r in a.get("runs") or []:
            rows.append([a.get("name"), r.get("seed"), Cell(_n(r.get("val"), 4), sort=_f(r.get("val")) or 0),
                         Cell(_n(r.get("test"), 4), sort=_f(r.get("test")) or 0), r.get("epochs"),
                         _secs(r.get("duration_s")) + (" (cut)" if r.get("cut") else ""), r.get("run_id")])
            classes.append("best" if a.get("name") == race.get("chosen") else "")
    s.table(cols, rows, row_classes=classes, title="every run of the race")
    s.table(["configuration", "where it came from", "search mean ± std (n)", "params"],
            [[a.get("name"), clipped(a.get("source"), 60),
              f"{_pm({'mean': a.get('search_mean'), 'std': a.get('search_std')})} ({a.get('search_n')})",
              clipped(_short_value(a.get("params") or {}), 110)] for a in arms],
            sortable=False, title="the configurations")


def _comparison_items(vs: Mapping[str, Any], story: Mapping[str, Any]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = [("decision", "adopted " + str(vs.get("leader")) if vs.get("decision") == "chosen"
                                     else "kept the defaults")]
    for split, label in (("val", "validation"), ("test", "held out")):
        c = (vs.get("leader_vs_defaults") or {}).get(split) or {}
        if not c:
            continue
        gain = _f(c.get("gain"))
        items.append((f"gain, {label}", "-" if gain is None else
                      f"{gain:+.3g}" + (f" ± {_n(c.get('gain_std'), 2)}" if _f(c.get("gain_std")) is not None else "")
                      + f" over {len(c.get('seeds') or [])} seed(s)"))
        if _f(c.get("lower")) is not None:
            items.append((f"{float(c.get('level') or 0.95):.1%} lower bound, {label}", f"{float(c['lower']):+.3g}"))
        items.append((f"beyond noise, {label}", "yes" if c.get("beyond_noise") else "no"))
    told = next((str(x.get("text")) for x in story.get("lines") or []
                 if isinstance(x, Mapping) and x.get("label") == "did it help"), "")
    cv = (vs.get("leader_vs_defaults") or {}).get("val") or {}
    if told or cv.get("reason"):
        items.append(("why", told or str(cv["reason"])))
    return items


# -- compression ------------------------------------------------------------------------------------
def _compression(page: Page, run: _Run) -> None:
    comp = run.stage("compress")
    final: Mapping[str, Any] = run.res.get("final") or {}
    s = page.section("Compression")
    if comp.get("skipped"):
        s.para(f"not tried: {comp['skipped']}", cls="muted")
        return
    sel = comp.get("selected")
    verdict = str((run.res.get("vs_baseline") or {}).get("compression") or comp.get("verdict") or "")
    s.html(f'<p class="verdict {"good" if sel else "bad"}">{esc(verdict)}</p>')
    for t in comp.get("plan") or []:
        s.para(str(t), cls="muted")
    crun = run.run(comp.get("run_id"))
    res = (crun.result or {}) if crun else {}
    if res.get("candidates"):
        rep = CompressResult.from_dict(dict(res))  # the compress Run's record
        candidate_charts(s, rep)
        if rep.sensitivity:
            sensitivity_chart(s, rep)
    elif comp.get("candidates"):
        cands = [c for c in comp["candidates"] if isinstance(c, Mapping)]
        s.table(["method", f"{run.metric}", "drop", "ms @1", "ms @batch", "size", "within budget"],
                [[c.get("method"), _n(c.get("metric"), 4), _n(c.get("metric_drop"), 2), _ms(c.get("latency_ms")),
                  _ms(c.get("latency_batch_ms")), format_bytes(c.get("size_bytes")),
                  "yes" if c.get("within_budget") else "no"] for c in cands], title="candidates")
    if sel:
        s.kv([("chosen", sel.get("method")), (f"{run.metric} (validation / held out)",
                                              f"{_n(sel.get('metric'), 4)} / {_n(sel.get('test_metric'), 4)}"),
              ("latency at batch 1", f"{_ms(sel.get('latency_ms'))} (uncompressed {_ms(final.get('latency_ms'))})"),
              (f"latency at batch {final.get('batch_size') or '-'}",
               f"{_ms(sel.get('latency_batch_ms'))} (uncompressed {_ms(final.get('latency_batch_ms'))})"),
              ("size", f"{format_bytes(sel.get('size_bytes'))} (uncompressed "
                       f"{format_bytes((comp.get('baseline') or {}).get('size_bytes'))})"),
              ("load it", str(comp.get("load") or "-"))], title="the compressed model")


# -- budget and files ---------------------------------------------------------------------------------
def _budget(page: Page, run: _Run) -> None:
    stages = [st for st in run.res.get("stages") or [] if isinstance(st, Mapping)]
    story = {str(x.get("stage")): x for x in (run.res.get("story") or {}).get("stages") or [] if isinstance(x, Mapping)}
    s = page.section("Budget")
    budget = _f(run.res.get("budget_s"))
    s.para(f"{_secs(run.res.get('elapsed_s'))} of the {_secs(budget)} budget; each stage has a share, and what one "
           f"leaves goes to the next. Stopped: {run.res.get('stop_reason') or '-'}", cls="muted")
    names = [str(st.get("name")) for st in stages]
    s.chart({"data": [bar([_f(st.get("share_s")) for st in stages], names, "share", orientation="h", color="#ced4da"),
                      bar([_f(st.get("duration_s")) for st in stages], names, "spent", orientation="h",
                          color=PALETTE[0])],
             "layout": layout("seconds per stage: its share and what it spent", x="seconds", barmode="group",
                              height=max(260, 70 + 34 * len(stages)), yaxis={"autorange": "reversed"})})
    cols = ["stage", "status", "spent", "share", "of the budget", f"{run.metric}: the two numbers", "what it did", "run"]
    s.table(cols, [[st.get("name"), st.get("status"), Cell(_secs(st.get("duration_s")), sort=_f(st.get("duration_s")) or 0),
                    Cell(_secs(st.get("share_s")), sort=_f(st.get("share_s")) or 0),
                    Cell(f"{(_f(st.get('duration_s')) or 0) / budget:.0%}" if budget else "-",
                         sort=_f(st.get("duration_s")) or 0),
                    (story.get(str(st.get("name"))) or {}).get("numbers") or "",
                    clipped((story.get(str(st.get("name"))) or {}).get("did") or "", 110), st.get("run_id")]
                   for st in stages], sortable=False)


def _files(page: Page, run: _Run) -> None:
    files = {k: v for k, v in (run.r.artifacts or {}).items() if isinstance(v, str) and v}
    final: Mapping[str, Any] = run.res.get("final") or {}
    s = page.section("Files")
    others = [(k, v) for k, v in files.items() if not v.endswith(".png")]
    if others:
        s.kv(others, title="what the run wrote")
    if final.get("load"):
        s.html(f"<h3>load the model</h3><pre>{esc(final.get('load'))}</pre>")
    comp = final.get("compressed") or {}
    if comp.get("load"):
        s.html(f"<h3>load the compressed model</h3><pre>{esc(comp.get('load'))}</pre>")
    pngs = [v for v in files.values() if v.endswith(".png")]
    if pngs:
        s.html("<h3>the PNG plots the run wrote</h3>")
    figures = []
    for path in pngs:
        p = Path(path)
        if p.is_file() and p.stat().st_size < 2_000_000:
            data = base64.b64encode(p.read_bytes()).decode("ascii")
            figures.append(f'<figure class="png"><img alt="{esc(p.name)}" src="data:image/png;base64,{data}">'
                           f"<figcaption>{esc(path)}</figcaption></figure>")
        else:
            s.para(f"{path}: not found (moved or deleted since the run)", cls="muted")
    if figures:
        s.html('<div class="pngs">' + "".join(figures) + "</div>")

