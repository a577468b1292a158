"""The report of an ``optimize`` run: the story of the run, top to bottom.

The headline (defaults -> result with its noise, held out, speedup, size, the decision), what
changed and the measurements behind each value, the baseline, health, layer value, the search
(every trial, its arm), the final race (every seed, both splits), compression, and where the
budget went. Everything comes from the Store: the optimize Run (:class:`OptimizeResult`), the
Runs of its stages (``parent_id``: each stage's record) and the Runs those name (recommend,
diagnose, compress, the study's tune Run).

The page sits beside the other pages and registers as they do (``_build`` imports it); it reads
the loop's records through ``proftune.optimize``'s public names (the report is the layer above).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._jsonsafe import finite_float as _f
from .._units import format_bytes, format_ms, format_seconds
from ..exceptions import ConfigError
from ..optimize import (
    CompressOutputs,
    ComputeOutputs,
    OptimizeResult,
    ParamChange,
    StageRow,
    StageStory,
)
from ..recommend import BatchSizeEvidence, LRFindResult, NoiseScaleResult, Recommendation, Recommendations
from ..track import RunRecord
from ._common import Context, read_result, register_renderer
from ._figures import PALETTE, bar, layout, line
from ._html import Cell, Page, Section, clipped, esc
from ._optimize_run import OptimizeRun, fmt_num, fmt_param_value, fmt_pm
from ._optimize_stages import (
    baseline_section,
    compression_section,
    final_race_section,
    health_section,
    layer_value_section,
    search_section,
)
from ._recommend_page import lr_chart, memory_model_chart

__all__ = ["STAGE_TITLES", "optimize_sections"]

STAGE_TITLES = {"baseline": "Baseline", "health": "Health", "compute": "What changed", "layer_value": "Layer value",
                "search": "Search", "final": "Final race", "compress": "Compression"}


@register_renderer("optimize")
def optimize_sections(page: Page, r: RunRecord, ctx: Context) -> None:
    """Every section of an optimize run's report, in the order of its story."""
    if r.status != "finished":  # running, or failed before its result: the stages that ran
        run = OptimizeRun(r, ctx.store, None)
        s = page.section("Result")
        s.para("this run holds no result yet" + (f": {r.error}" if r.error else " (it is still running)"),
               cls="muted")
        _stage_chain(s, [StageRow(name=k, status=c.status, duration_s=c.duration_s) for k, c in run.children.items()],
                     [])
        return
    res = read_result(page, r, OptimizeResult.from_dict)
    if res is None:
        return
    run = OptimizeRun(r, ctx.store, res)
    _headline(page, run, res)
    _changes(page, run, res)
    baseline_section(page, run, res.vs_baseline)
    health_section(page, run)
    layer_value_section(page, run)
    search_section(page, run)
    final_race_section(page, run, res)
    compression_section(page, run, res)
    _budget(page, res)
    _files(page, run, res)


# -- the headline ---------------------------------------------------------------------------------
def _headline(page: Page, run: OptimizeRun, res: OptimizeResult) -> None:
    m, vs, final, story = run.metric, res.vs_baseline, res.final, res.story
    s = page.section("Result")
    adopted = vs.adopted
    s.html(f'<p class="verdict {"good" if adopted else "bad"}">{esc(story.decision or vs.summary)}</p>')
    dv, fv, cmp_val = vs.defaults, vs.final, vs.leader_vs_defaults.val
    beyond = bool(cmp_val is not None and cmp_val.beyond_noise)
    gain = _f(cmp_val.gain) if cmp_val is not None else None
    stats = [(f"{m}, validation: defaults → result",
              f"{fmt_pm(dv.val.mean, dv.val.std)} → {fmt_pm(fv.val.mean, fv.val.std)}",
              f"{len(final.seeds)} paired seed(s)", "good" if adopted else "bad"),
             (f"{m}, held out: defaults → result",
              f"{fmt_pm(dv.test.mean, dv.test.std)} → {fmt_pm(fv.test.mean, fv.test.std)}",
              vs.held_out_source, ""),
             ("beyond noise?", ("yes" if beyond else "no") + (f", gain {gain:+.2g}" if gain is not None else ""),
              story.answer("did it help") or (cmp_val.reason if cmp_val is not None else ""),
              "good" if beyond else "bad")]
    comp = final.compressed
    if comp is not None:
        r1, rb = _ratio(final.latency_ms, comp.latency_ms), _ratio(final.latency_batch_ms, comp.latency_batch_ms)
        stats.append(("compressed: speed-up at batch 1 / batch " + str(final.batch_size or "-"),
                      f"{_x(r1)} / {_x(rb)}", f"{comp.method}: {format_ms(comp.latency_ms)} vs "
                      f"{format_ms(final.latency_ms)} uncompressed"
                      + (f", on {final.latency_device}" if final.latency_device else ""),
                      "good" if (r1 or 0) > 1 else "bad"))
        base = run.stage(CompressOutputs).baseline
        saved = (base.size_bytes if base is not None else None) or final.size_bytes
        stats.append(("size as saved: uncompressed → compressed",
                      f"{format_bytes(saved)} → {format_bytes(comp.size_bytes)}", "", ""))
    else:
        stats.append(("compression", "kept the uncompressed model", str(vs.compression or ""), ""))
        stats.append(("model", f"{format_bytes(final.size_bytes)}, {format_ms(final.latency_ms)} at batch 1", "", ""))
    stats.append(("time used of the budget", f"{format_seconds(res.elapsed_s)} of {format_seconds(res.budget_s)}",
                  res.stop_reason, ""))
    s.html('<div class="headline">' + "".join(
        f'<div class="stat {cls}" title="{esc(hint)}"><div class="v">{esc(value)}</div>'
        f'<div class="l">{esc(label)}</div>'
        + (f'<div class="l">{esc(hint)}</div>' if hint else "") + "</div>"
        for label, value, hint, cls in stats) + "</div>")
    if story.lines:
        s.kv([(x.label, x.text) for x in story.lines], title="what a newcomer asks")
    _stage_chain(s, res.stages, story.stages)


def _ratio(old: Any, new: Any) -> float | None:
    a, b = _f(old), _f(new)
    return a / b if a is not None and b else None


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _stage_chain(s: Section, rows: Sequence[StageRow], told: Sequence[StageStory]) -> None:
    """The stages as a row of boxes (one row, never a dangling arrow), each linking to its section."""
    if not rows:
        return
    story = {x.stage: x for x in told}
    boxes = []
    for st in rows:
        said = story.get(st.name)
        anchor = STAGE_TITLES.get(st.name, st.name).lower().replace(" ", "-")
        lines = [f'<div class="name">{esc(st.name)}</div>',
                 f'<div class="meta">{esc(st.status or "-")} · {esc(format_seconds(st.duration_s))}</div>']
        if said is not None and said.numbers:
            lines.append(f"<div>{esc(said.numbers)}</div>")
        boxes.append(f'<a class="stage {esc(st.status or "")}" href="#{esc(anchor)}" '
                     f'title="{esc(said.did if said is not None else "")}">{"".join(lines)}</a>')
    s.html(f'<h3>the stages</h3><div class="chain" style="grid-template-columns:repeat({len(boxes)},minmax(0,1fr))">'
           + "".join(boxes) + "</div>")


# -- what changed -------------------------------------------------------------------------------------
def _change_rows(rows: Sequence[ParamChange]) -> list[list[Any]]:
    return [[r.param, f"{fmt_num(r.default)} ({r.default_from})", Cell(fmt_num(r.value), cls="nw"), r.source, r.why]
            for r in rows if r.changed]


def _changes(page: Page, run: OptimizeRun, res: OptimizeResult) -> None:
    final, vs = res.final, res.vs_baseline
    s = page.section("What changed")
    rows = final.changes
    cols = ["param", "default (whose)", "result", "from", "why: the measurement or trial behind it"]
    if any(r.changed for r in rows):
        s.table(cols, _change_rows(rows), sortable=False, title="the result against the defaults")
    else:
        s.para("nothing: the result is the task's defaults" if rows else
               "this run's result does not list its changes (recorded before they were)", cls="muted")
    same = [f"{r.param} {fmt_num(r.value)}" for r in rows if not r.changed]
    if same:
        s.para("unchanged: " + ", ".join(same), cls="muted")
    if vs.leader_changes and not vs.adopted:
        s.table(cols, _change_rows(vs.leader_changes), sortable=False,
                title=f"what the search's best ({vs.leader}) would have changed: not adopted, "
                      "not better than the defaults beyond noise")
    _evidence(s, run, final.params)


def _evidence(s: Section, run: OptimizeRun, params: Mapping[str, Any]) -> None:
    """The measurements behind the computed values: the LR range curve, the memory model, the
    noise scale, and every other recommendation with its reason (the recommend Run's own
    recommendations, which hold their evidence; else the compute stage's)."""
    comp = run.stage(ComputeOutputs)
    rec_run = run.run(comp.run_id)
    recs = {r.name: r for r in _recommendations(rec_run, comp)}
    if not recs:
        s.para("no recommendations recorded for this run", cls="muted")
        return
    lr = recs.get("lr")
    pts = rec_run.curve("lr_range") if rec_run else []
    s.html("<h3>evidence: learning rate</h3>")
    s.para(lr.reason if lr is not None else "")
    if pts and lr is not None:
        marks = [("computed", lr.value, PALETTE[4])]
        if _f(params.get("lr")) is not None and params.get("lr") != lr.value:
            marks.append(("result", params.get("lr"), PALETTE[3]))
        lr_chart(s, LRFindResult.from_dict({**lr.evidence, "curve": pts}), marks)
    else:
        s.para("the LR range curve is not in this store (recorded before the curve was kept)", cls="muted")
    bs = recs.get("batch_size")
    ev = BatchSizeEvidence.of(bs)
    s.html("<h3>evidence: batch size</h3>")
    s.para(bs.reason if bs is not None else "")
    if ev.search is not None:
        memory_model_chart(s, ev.search)
    elif ev.memory_model:
        s.para("the batch-size search's probes are not in this store (recorded before they were kept)", cls="muted")
    crit = recs.get("critical_batch_size")
    cev = NoiseScaleResult.of(crit)
    noise = rec_run.curve("noise_scale") if rec_run else []
    if crit is not None and cev is None:  # not measured: the reason alone, no table of dashes
        s.para("gradient noise scale: " + (crit.reason or "not measured"), cls="muted")
    elif crit is not None and cev is not None:
        items = [("critical batch", crit.value), ("B_simple = tr(Σ)/|G|²", fmt_num(cev.b_simple)),
                 ("tr(Σ)", fmt_num(cev.trace_sigma)), ("|G|²", fmt_num(cev.grad_sq_norm)),
                 ("steps (used / clipped)", f"{cev.used_steps} / {cev.clipped_steps}"),
                 ("micro-batches", f"{cev.small_batch} samples, {cev.big_batch} per step")]
        key = next((k for k in ("b_simple", "b_simple_ema", "ema")
                    if any(_f(p.get(k)) is not None for p in noise)), None)
        side = s.side(lambda t: t.kv(items, title="gradient noise scale"))
        if noise and key:
            s.chart({"data": [line(list(range(1, len(noise) + 1)), [p.get(key) for p in noise], "B_simple",
                                   color=PALETTE[0], markers=True)],
                     "layout": layout("gradient noise scale per measured step (the critical batch)", x="step",
                                      y="B_simple", showlegend=False, height=300, xaxis={"dtick": 1})}, side=side)
        else:
            s.html(side)
        s.para(crit.reason, cls="muted")
    others = [x for k, x in recs.items() if k not in ("lr", "batch_size", "critical_batch_size")]
    if others:
        s.table(["recommendation", "value", "confidence", "why", "effect"],
                [[x.name, _value_cell(x.value), x.confidence, clipped(x.reason, 150),
                  clipped(x.effect, 80)] for x in others],
                sortable=False, title="the other computed values")


def _recommendations(rec_run: RunRecord | None, comp: ComputeOutputs) -> list[Recommendation]:
    """The recommend Run's recommendations (their evidence with them), else the compute stage's."""
    if rec_run is not None and rec_run.result:
        try:
            return list(Recommendations.from_dict(dict(rec_run.result)))
        except ConfigError:  # a recommend Run of an older proftune: the stage's own list
            pass
    return [Recommendation.from_dict(x) for x in comp.recommendations]


#: The longest value kept on one line in a table; a longer one (a DataLoader's settings) wraps, or
#: it would squeeze the "why" beside it into a column a word wide.
NOWRAP_CHARS = 24


def _value_cell(v: Any) -> Cell | str:
    text = fmt_param_value(v)
    return Cell(text, cls="nw") if len(text) <= NOWRAP_CHARS else text


# -- budget and files ---------------------------------------------------------------------------------
def _budget(page: Page, res: OptimizeResult) -> None:
    stages = res.stages
    story = {x.stage: x for x in res.story.stages}
    s = page.section("Budget")
    budget = _f(res.budget_s)
    s.para(f"{format_seconds(res.elapsed_s)} of the {format_seconds(budget)} budget; each stage has a share, "
           f"and what one leaves goes to the next. Stopped: {res.stop_reason or '-'}", cls="muted")
    names = [st.name for st in stages]
    s.chart({"data": [bar([_f(st.share_s) for st in stages], names, "share", orientation="h", color="#ced4da"),
                      bar([_f(st.duration_s) for st in stages], names, "spent", orientation="h", color=PALETTE[0])],
             "layout": layout("seconds per stage: its share and what it spent", x="seconds", barmode="group",
                              height=max(260, 70 + 34 * len(stages)), yaxis={"autorange": "reversed"})})
    cols = ["stage", "status", "spent", "share", "of the budget", f"{res.metric}: the two numbers", "what it did",
            "run"]
    rows = []
    for st in stages:
        said = story.get(st.name)
        spent = _f(st.duration_s) or 0
        rows.append([st.name, st.status, Cell(format_seconds(st.duration_s), sort=spent),
                     Cell(format_seconds(st.share_s), sort=_f(st.share_s) or 0),
                     Cell(f"{spent / budget:.0%}" if budget else "-", sort=spent),
                     said.numbers if said is not None else "",
                     clipped(said.did if said is not None else "", 110), st.run_id])
    s.table(cols, rows, sortable=False)


def _files(page: Page, run: OptimizeRun, res: OptimizeResult) -> None:
    files = {k: v for k, v in (run.r.artifacts or {}).items() if isinstance(v, str) and v}
    final = res.final
    s = page.section("Files")
    others = [(k, v) for k, v in files.items() if not v.endswith(".png")]
    if others:
        s.kv(others, title="what the run wrote")
    if final.load:
        s.html(f"<h3>load the model</h3><pre>{esc(final.load)}</pre>")
    if final.compressed is not None and final.compressed.load:
        s.html(f"<h3>load the compressed model</h3><pre>{esc(final.compressed.load)}</pre>")
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
