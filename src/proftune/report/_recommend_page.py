"""The pages of a ``recommend``, ``batch_size`` and ``lr_find`` run, with the memory-model and LR
range charts other pages share."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .._units import format_bytes
from ..recommend import BatchSizeEvidence, BatchSizeResult, LRFindResult, Recommendations
from ..track import RunRecord
from ._common import Context, flatten, fmt_pct, register_renderer, short_value
from ._figures import PALETTE, finite, hline, layout, line, vline
from ._html import Page, Section, esc, fmt_value


# -- recommend, batch size, lr find -----------------------------------------------------------------
@register_renderer("recommend")
def _recommend(page: Page, r: RunRecord, ctx: Context) -> None:
    recs = Recommendations.from_dict(dict(r.result or {}))
    s = page.section("Recommendations")
    if not recs:
        s.para("no recommendations were recorded", cls="muted")
        return
    cards = []
    for x in recs:
        shown: str = (fmt_value(x.name, x.value) if not isinstance(x.value, (list, dict)) else short_value(x.value))
        # the batch-size search's own record is drawn below, not listed; a record's version is no evidence
        evidence = {k: v for k, v in x.evidence.items() if k not in ("search", "schema_version")}
        ev = s.side(lambda t, evidence=evidence: t.kv(
            [(k, v if not isinstance(v, (dict, list)) else short_value(v)) for k, v in flatten(evidence)]))
        cards.append(f'<div class="card {esc(x.confidence)}"><div class="name">{esc(x.name)}</div>'
                     f'<div class="value">{esc(shown)}</div><div class="meta">confidence: {esc(x.confidence)}</div>'
                     f"<p>{esc(x.reason)}</p>"
                     + (f'<p class="muted">effect: {esc(x.effect)}</p>' if x.effect else "")
                     + _value_table(s, x.value)
                     + f"<details><summary>evidence</summary>{ev}</details></div>")
    s.html('<div class="cards">' + "".join(cards) + "</div>")
    batch = next((x for x in recs if x.name == "batch_size"), None)
    if batch is not None:
        measured = BatchSizeEvidence.of(batch)
        if measured.search is not None:
            _memory_model(page, measured.search)
        elif measured.memory_model:
            page.section("Memory model").para(
                "the batch-size search's probes are not in this run (recorded before they were kept): "
                "its fitted model is in the batch_size card's evidence", cls="muted")


def _value_table(s: Section, value: Any) -> str:
    if not (isinstance(value, list) and value and all(isinstance(i, Mapping) for i in value)):
        return ""
    cols = list(dict.fromkeys(k for i in value for k in i))
    return s.side(lambda t: t.table(cols, [[(fmt_pct(i.get(c)), finite(i.get(c)) or 0) if c.endswith("_share")
                                            else i.get(c) for c in cols] for i in value], sortable=False))


@register_renderer("batch_size")
def _batch_size(page: Page, r: RunRecord, ctx: Context) -> None:
    if r.result:
        _memory_model(page, BatchSizeResult.from_dict(dict(r.result)))


def _memory_model(page: Page, res: BatchSizeResult) -> None:
    """Probes, the fitted line peak(B) = a + b·B, the budget and the answer."""
    memory_model_chart(page.section("Memory model"), res)


def memory_model_chart(s: Section, res: BatchSizeResult) -> None:
    """A batch-size search's chart (probes, fitted line, budget, answer) and its numbers, into ``s``."""
    model, probes = res.model, res.probes
    a, b = finite(model.intercept_bytes), finite(model.per_sample_bytes)
    budget, answer = finite(res.memory_budget), finite(res.max_batch_size)
    data: list[dict[str, object]] = []
    mib = 2.0**20
    for status, color in (("fits", PALETTE[2]), ("oom", "#c92a2a"), ("over budget", PALETTE[1])):
        pts = [p for p in probes if p.status == status or (status == "over budget" and p.status not in ("fits", "oom"))]
        if pts:
            data.append({"type": "scatter", "mode": "markers", "name": f"probe: {status}",
                         "x": [p.batch_size for p in pts],
                         "y": [(finite(p.peak_bytes) or 0) / mib for p in pts],
                         "marker": {"size": 11, "color": color, "symbol": [
                             "diamond" if p.role == "verify" else "circle" for p in pts]},
                         "hovertemplate": "batch %{x}: %{y:.3f} MiB<extra></extra>"})
    xs = [float(p.batch_size) for p in probes] + ([answer] if answer else [])
    if a is not None and b is not None and xs:
        hi = max(xs) * 1.1
        data.append(line([0, hi], [a / mib, (a + b * hi) / mib], "fitted peak(B) = a + b·B", color=PALETTE[0],
                         dash="dash"))
    shapes, notes = [], []
    if budget:
        sh, no = hline(budget / mib, f"budget {format_bytes(budget)}")
        shapes.append(sh)
        notes.append(no)
    if answer:
        sh, no = vline(answer, f"answer: {int(answer)}", color=PALETTE[2], dash="solid")
        shapes.append(sh)
        notes.append(no)
    by_memory = finite(res.memory_max_batch_size)
    if by_memory and answer and by_memory != answer:
        sh, no = vline(by_memory, f"memory allows {int(by_memory)}", color=PALETTE[0], y=0.9)
        shapes.append(sh)
        notes.append(no)
    fig = {"data": data, "layout": layout("peak memory of a training step vs batch size", x="batch size",
                                          y="MiB", shapes=shapes, annotations=notes)}
    items = [("max_batch_size", res.max_batch_size), ("limited by", res.limited_by),
             ("memory budget", format_bytes(budget)),
             ("intercept a", format_bytes(a)), ("per sample b", format_bytes(b)),
             ("fit residual", format_bytes(finite(model.residual_bytes))),
             ("safety margin", format_bytes(finite(model.margin_bytes))),
             ("predicted peak", format_bytes(finite(res.predicted_peak_bytes))),
             ("measured peak", format_bytes(finite(res.measured_peak_bytes))),
             ("params+grads+optimizer", format_bytes(finite(res.static_bytes))),
             ("measured steps", res.runs)]
    s.chart(fig, side=s.side(lambda t: t.kv([(k, v) for k, v in items if v not in (None, "-")])))
    if probes:
        s.table(["batch size", "peak", "status", "role"],
                [[p.batch_size, (format_bytes(p.peak_bytes), finite(p.peak_bytes) or 0), p.status, p.role]
                 for p in probes], title="probes")


@register_renderer("lr_find")
def _lr_find(page: Page, r: RunRecord, ctx: Context) -> None:
    pts = (r.curves or {}).get("lr_range") or []
    s = page.section("LR range test")
    if not pts or not r.result:
        s.para("the run holds no curve", cls="muted")
        return
    lr_chart(s, LRFindResult.from_dict({**r.result, "curve": pts}))  # the Run keeps the curve apart


def lr_chart(s: Section, res: LRFindResult, marks: Sequence[tuple[str, Any, str]] = ()) -> None:
    """The LR range curve (raw and smoothed loss vs lr, log x) with min, max and the suggestion,
    plus ``marks`` (label, lr, colour: e.g. the rate the run went on with), into ``s``."""
    xs = list(res.lrs)
    data = [line(xs, res.losses, "loss", color="#adb5bd", width=1),
            line(xs, res.smoothed, "smoothed loss", color=PALETTE[0], width=2.5)]
    shapes, notes = [], []
    for i, (value, label, color) in enumerate(((res.min_lr, "min_lr", PALETTE[2]), (res.max_lr, "max_lr", "#c92a2a"),
                                               (res.suggested_lr, "suggested", PALETTE[1]))):
        v = finite(value)
        if v:
            sh, no = vline(math.log10(v), f"{label} {v:.2g}", color=color, dash="solid" if label == "suggested"
                           else "dot", y=1.0 - 0.08 * i)
            sh["x0"] = sh["x1"] = v
            no["x"] = math.log10(v)
            shapes.append(sh)
            notes.append(no)
    for j, (label, lr, color) in enumerate(marks):
        if finite(lr):
            sh, no = vline(math.log10(float(lr)), f"{label} {float(lr):.2g}", color=color, dash="dash",
                           y=0.76 - 0.08 * j)
            sh["x0"] = sh["x1"] = float(lr)
            shapes.append(sh)
            notes.append(no)
    known = [v for v in map(finite, res.smoothed) if v is not None]
    yr = None
    if known:
        lo, start = min(known), known[0]
        yr = [lo - 0.1 * abs(start - lo + 1e-12), start + 0.6 * abs(start - lo + 1e-12) + 1e-9]
    lay = layout("loss vs learning rate", x="learning rate (log)", y="loss", shapes=shapes, annotations=notes,
                 xaxis={"type": "log"}, yaxis={"range": yr} if yr else {})
    items = [(k, v) for k, v in (("suggested_lr", res.suggested_lr), ("min_lr", res.min_lr), ("max_lr", res.max_lr),
                                 ("lr_at_min_loss", res.lr_at_min_loss), ("rule", res.rule),
                                 ("stop_reason", res.stop_reason), ("message", res.message),
                                 ("optimizer", res.optimizer), ("batch_size", res.batch_size), ("steps", res.steps),
                                 ("steps_planned", res.steps_planned)) if v is not None]
    if res.suggested_lr is None:
        items.insert(0, ("suggestion", "none: " + str(res.message or "the loss did not fall")))
    s.chart({"data": data, "layout": lay}, side=s.side(lambda t: t.kv(items)))
