"""The page of a ``compress`` run, with the candidate and sensitivity charts other pages share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._jsonsafe import is_finite_number as _num
from .._units import format_bytes
from ..compress import Candidate, CompressResult
from ..track import RunRecord
from ._common import Context, register_renderer
from ._figures import PALETTE, bar, finite, hline, layout
from ._html import Cell, Page, Section, esc, plot_text


# -- compress -----------------------------------------------------------------------------------------
@register_renderer("compress")
def _compress(page: Page, r: RunRecord, ctx: Context) -> None:
    rep = CompressResult.from_dict(dict(r.result or {}))
    candidate_charts(page.section("Candidates"), rep)
    if rep.sensitivity:
        sensitivity_chart(page.section("Per-layer sensitivity"), rep)
    texts = [*rep.plan, *rep.notes]
    if texts:
        ns = page.section("Plan and notes")
        ns.html("<ul>" + "".join(f"<li>{esc(t)}</li>" for t in texts) + "</ul>")
        if rep.load_line:
            ns.html(f"<h3>load the model</h3><pre>{esc(rep.load_line)}</pre>")


def candidate_charts(s: Section, rep: CompressResult) -> None:
    """A compression's candidates (metric vs latency and vs size, the Pareto front, the selected
    one, the accuracy budget) and their table, into ``s``."""
    base, sel, metric = rep.baseline, rep.selected, rep.metric
    everything = [base, *rep.candidates]
    s.para(f"{metric} within -{rep.max_accuracy_drop} of the baseline, goal {rep.goal}, "
           f"{rep.device} with {rep.threads} thread(s); selected: "
           + (f"{sel.method} ratio {sel.ratio}" if sel else "none"), cls="muted")

    def is_sel(c: Candidate) -> bool:
        return sel is not None and c.method == sel.method and c.ratio == sel.ratio

    for key, label, scale, unit in (("latency_ms", "latency at batch 1", 1.0, "ms"),
                                    ("size_bytes", "size as saved", 1 / 1024, "KiB")):
        data = []
        groups = (("candidate", [c for c in everything if not c.pareto and not is_sel(c)], "#adb5bd", 9),
                  ("Pareto front", sorted([c for c in everything if c.pareto],
                                          key=lambda c: finite(getattr(c, key)) or 0), PALETTE[0], 11),
                  ("selected", [c for c in everything if is_sel(c)], PALETTE[1], 18))
        for name, pts, color, size in groups:
            if not pts:
                continue
            trace = {"type": "scatter", "mode": "lines+markers" if name == "Pareto front" else "markers",
                     "name": name, "x": [(finite(getattr(c, key)) or 0) * scale for c in pts],
                     "y": [c.metric for c in pts],
                     "hovertext": [plot_text(f"{c.method} {c.ratio}") for c in pts],
                     "hovertemplate": "%{hovertext}<br>%{x:.4g} " + unit + ", " + "%{y:.4f}<extra></extra>",
                     "marker": {"size": size, "color": color,
                                "symbol": "star" if name == "selected" else "circle"},
                     "line": {"color": color, "dash": "dot"}}
            data.append(trace)
        shapes, notes = [], []
        if _num(base.metric) and _num(rep.max_accuracy_drop):
            floor = float(base.metric) - float(rep.max_accuracy_drop)
            sh, no = hline(floor, f"budget: {metric} ≥ {floor:.4g}", color="#c92a2a")
            shapes.append(sh)
            notes.append(no)
        s.chart({"data": data, "layout": layout(f"{metric} vs {label}", x=f"{label} ({unit})", y=metric,
                                                shapes=shapes, annotations=notes)})
    cols = ["candidate", metric, "drop", "params", "MACs", "size", "ms @1", "ms @batch", "Pareto", "within budget"]
    s.table(cols, [[Cell(_candidate(c), title=f"backend {c.quant_backend}" if c.quant_backend else "", cls="nw"),
                    c.metric, c.metric_drop, c.params, c.macs, (format_bytes(c.size_bytes), finite(c.size_bytes) or 0),
                    c.latency_ms, c.latency_batch_ms, "yes" if c.pareto else "", "yes" if c.within_budget else "no"]
                   for c in everything], row_classes=["best" if is_sel(c) else "" for c in everything])


def _candidate(c: Candidate) -> str:
    """``structured 50% + static``: the method with its pruning ratio."""
    ratio = finite(c.ratio)
    parts = str(c.method or "-").split("+")
    return " + ".join(f"{p} {ratio:.0%}" if ratio and "structured" in p else p for p in parts)


def sensitivity_chart(ss: Section, rep: CompressResult) -> None:
    """The metric drop when one layer alone is pruned, per layer, into ``ss``."""
    metric = rep.metric
    sens = [x for x in rep.sensitivity if isinstance(x, Mapping)]
    if sens:
        ordered = sorted(sens, key=lambda x: finite(x.get("drop")) or 0)
        ss.chart({"data": [bar([x.get("drop") for x in ordered], [_layer_name(x) for x in ordered],
                               f"{metric} drop", orientation="h", color=PALETTE[3])],
                  "layout": layout(f"{metric} drop when one layer alone is pruned", x=f"{metric} drop",
                                   height=max(260, 60 + 24 * len(ordered)), margin={"l": 200})},
                 side=ss.side(lambda t: t.table(["layer", "params", "ratio", "drop"],
                                                [[_layer_name(x), x.get("params"), x.get("ratio"), x.get("drop")]
                                                 for x in sens])))


def _layer_name(row: Mapping[str, Any]) -> str:
    """A sensitivity row's layer by its path and what it is (``5 · Conv2d 16→32 3x3``); a record
    from before the rows named their module shows the path alone."""
    module = row.get("module")
    return f"{row.get('layer')} · {module}" if module else str(row.get("layer"))
