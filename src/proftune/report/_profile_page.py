"""The pages of a ``profile``, ``train`` and ``trial`` run: the profile's sections, the training
curves, how a trial ended."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._api import TrainResult
from .._jsonsafe import is_finite_number as _num
from .._units import format_bytes
from ..profile import CommProfile, LayerProfile, Profile, Structure
from ..search import TrialResult
from ..track import RunRecord
from ._common import Context, curves, fmt_pct, register_renderer
from ._figures import PALETTE, bar, finite, hline, layout, line
from ._html import Page, Section, esc


# -- profile -------------------------------------------------------------------------------------
def profile_sections(page: Page, p: Profile) -> None:
    """Per-layer table and shares, memory and step breakdowns, bottlenecks, statistics."""
    step, mem, grad = p.step, p.memory, p.grad
    s = page.section("Profile")
    s.para(f"{p.task or 'model'} · {p.mode} · batch {p.batch_size} · {p.device} · {p.steps} measured steps",
           cls="muted")
    s.html('<div class="grid">' + s.side(lambda t: t.kv([
        ("params (total)", p.params.total), ("params (trainable)", p.params.trainable),
        ("MACs (forward)", p.macs), ("FLOPs (forward)", p.flops), ("FLOPs (backward)", p.backward_flops),
        ("step_time_ms", step.time_ms), ("throughput", step.throughput), ("peak_memory_bytes", mem.peak_bytes),
        ("grad norm", grad.norm), ("grad variance", grad.var), ("update / weight ratio", grad.update_ratio),
    ], title="totals")) + s.side(lambda t: _comm_kv(t, p.comm)) + "</div>")

    # step breakdown
    phases = [(k, float(v)) for k, v in (("data", step.data_ms), ("forward", step.forward_ms),
                                         ("backward", step.backward_ms), ("optimizer", step.optimizer_ms),
                                         ("other", step.other_ms)) if _num(v)]
    if phases:
        st = page.section("Step breakdown")
        total = sum(v for _, v in phases) or 1.0
        data = [bar([v], ["step"], k, orientation="h", color=PALETTE[i], text=[f"{k} {v:.3g} ms"])
                for i, (k, v) in enumerate(phases)]
        fig = {"data": data, "layout": layout("where a step's time goes (ms)", x="ms", height=220,
                                              barmode="stack", yaxis={"showticklabels": False})}
        rows = [(k, f"{v:.4g} ms ({v / total:.0%})") for k, v in phases]
        if _num(step.outside_layers_ms) and step.outside_layers_ms:
            # measured on the layer-timed (hooked, slower) steps: their share, not ms of this step
            timed = float(step.outside_layers_ms) + sum(
                float(lay.forward_ms or 0.0) + float(lay.backward_ms or 0.0) for lay in p.layers)
            rows.append(("of fwd+bwd in no layer", f"{float(step.outside_layers_ms) / timed:.0%}"))
        st.chart(fig, side=st.side(lambda t: t.kv(rows, title="milliseconds per step")))

    # memory breakdown
    parts = [(k, v) for k, v in (("params", mem.params_bytes), ("grads", mem.grads_bytes),
                                 ("optimizer state", mem.optimizer_bytes), ("activations", mem.activations_bytes))
             if _num(v)]
    if parts:
        ms = page.section("Memory")
        data = [bar([k for k, _ in parts], [float(v) / 2**20 for _, v in parts], "bytes",
                    color=PALETTE[0], text=[format_bytes(v) for _, v in parts])]
        peak = mem.peak_bytes
        shapes, notes = [], []
        if _num(peak) and peak:
            shape, note = hline(float(peak) / 2**20, f"step peak {format_bytes(peak)}")
            shapes, notes = [shape], [note]
        fig = {"data": data, "layout": layout("memory of a training step (MiB)", y="MiB", shapes=shapes,
                                              annotations=notes, showlegend=False)}
        ms.chart(fig, side=ms.side(lambda t: t.kv([*[(k, format_bytes(v)) for k, v in parts],
                                                   ("peak of a step", format_bytes(peak))], title="bytes")))

    if p.layers:
        _layer_sections(page, p.layers)
    if p.structure:
        _structure_section(page, p.structure)
    # bottlenecks and by_type are the profile's free-form rows (dicts in the record)
    bottlenecks = [b for b in p.bottlenecks if isinstance(b, Mapping)]
    if bottlenecks:
        bs = page.section("Bottlenecks")
        bs.html("<ul>" + "".join(f"<li>{esc(b.get('finding', b))}</li>" for b in bottlenecks) + "</ul>")
        bs.table(["layer", "type", "time share", "params share", "MACs share", "excess"],
                 [[b.get("name"), b.get("type"), _share(b.get("time_share")), _share(b.get("params_share")),
                   _share(b.get("macs_share")), b.get("excess")] for b in bottlenecks])
    by_type = [t for t in p.by_type if isinstance(t, Mapping)]
    if by_type:
        ts = page.section("By layer type")
        cols = [c for c in ("type", "count", "params", "macs", "forward_ms", "backward_ms", "time_share",
                            "activation_bytes") if any(c in t for t in by_type)]
        ts.table(cols, [[_share(t.get(c)) if c == "time_share" else t.get(c) for c in cols] for t in by_type])


#: Depth of the module tree the structure table shows (the whole tree is in the JSON).
STRUCTURE_DEPTH = 3


def _structure_section(page: Page, structure: Mapping[str, Any]) -> None:
    """The module tree (``profile --structure``): each module's type, shapes, params and MACs."""
    rec = Structure.from_dict(dict(structure))
    rows = [r for r in rec.rows if r.depth <= STRUCTURE_DEPTH]
    ss = page.section("Structure")
    ss.para(f"the module tree for one batch of {rec.batch_size}, to depth {STRUCTURE_DEPTH} of "
            f"{max((r.depth for r in rec.rows), default=0)}: {rec.params_total:,} params, {rec.macs:,} MACs "
            "(forward multiply-accumulates of each subtree; params: the module's and those under it)",
            cls="muted")

    def shapes(v: Sequence[Any]) -> str:
        return ", ".join(str(list(x)) if isinstance(x, (list, tuple)) else str(x) for x in v) or "-"

    ss.table(["module", "type", "input", "output", "params", "MACs"],
             [["\u00a0\u00a0" * r.depth + (r.name or "(model)"), r.type, shapes(r.input_shapes),
               shapes(r.output_shapes), r.params, r.macs] for r in rows], sortable=False)


def _share(v: Any) -> tuple[str, float]:
    """A share as a sortable cell: ``12.5%`` shown, the fraction sorted by (0 when unknown)."""
    return fmt_pct(v), finite(v) or 0


def _comm_kv(t: Section, comm: CommProfile | None) -> None:
    if comm is not None:
        t.kv([("backend", comm.backend), ("world size", comm.world_size),
              ("all-reduce per step", format_bytes(comm.allreduce_bytes)),
              ("all-reduce time", f"{float(comm.allreduce_ms or 0):.3g} ms"),
              ("share of the step", fmt_pct(comm.share))], title="distributed")


def _layer_sections(page: Page, layers: Sequence[LayerProfile]) -> None:
    s = page.section("Layers")
    top = sorted(layers, key=lambda lay: (finite(lay.time_share) or 0.0, lay.macs or 0), reverse=True)[:25][::-1]
    names = [f"{lay.name or '(model)'} · {lay.type}" for lay in top]
    data = [bar([100 * (finite(getattr(lay, k)) or 0) for lay in top], names, label, orientation="h",
                color=PALETTE[i]) for i, (k, label) in enumerate(
        (("time_share", "time"), ("params_share", "params"), ("macs_share", "MACs")))]
    s.chart({"data": data, "layout": layout("share of time vs params vs MACs (%), layers by time", x="%",
                                            height=max(300, 80 + 42 * len(top)), barmode="group",
                                            margin={"l": 140})})
    cols = ["layer", "type", "params", "MACs", "fwd ms", "bwd ms", "activations", "GFLOP/s", "time",
            "params share", "MACs share"]
    rows = [[lay.name or "(model)", lay.type, lay.params, lay.macs, lay.forward_ms, lay.backward_ms,
             (format_bytes(lay.activation_bytes), lay.activation_bytes) if _num(lay.activation_bytes) else None,
             lay.gflops_per_s, _share(lay.time_share), _share(lay.params_share), _share(lay.macs_share)]
            for lay in layers]
    s.table(cols, rows, title="per layer (click a column to sort)")
    _stats_section(page, layers)


def _stats_section(page: Page, layers: Sequence[LayerProfile]) -> None:
    with_stats = [lay for lay in layers if isinstance(lay.stats, Mapping) and lay.stats]
    if not with_stats:
        return
    s = page.section("Statistics per layer")
    names = [f"{lay.name} · {lay.type}" for lay in with_stats]

    def get(lay: LayerProfile, kind: str, key: str) -> Any:
        """One statistic (``stats`` is the layer's ``{kind: {name: value}}``, a LayerStatistics)."""
        stats: Mapping[str, Any] = lay.stats
        return (stats.get(kind) or {}).get(key)

    acts = [(n, lay) for n, lay in zip(names, with_stats, strict=False) if get(lay, "activation", "p50") is not None]
    if acts:
        data = []
        for i, (key, label) in enumerate((("p1", "p1"), ("p50", "median"), ("p99", "p99"))):
            data.append(line([n for n, _ in acts], [get(lay, "activation", key) for _, lay in acts], label,
                             color=PALETTE[i], markers=True))
        data.append(bar([n for n, _ in acts], [get(lay, "activation", "zero_frac") for _, lay in acts],
                        "zero fraction", color="#ced4da"))
        data[-1]["yaxis"] = "y2"
        data[-1]["opacity"] = 0.6
        s.chart({"data": data, "layout": layout("activations: percentiles and share of zeros", y="value",
                                                yaxis2={"title": {"text": "zero fraction"}, "overlaying": "y",
                                                        "side": "right", "range": [0, 1], "showgrid": False})})
    grads = [(n, lay) for n, lay in zip(names, with_stats, strict=False) if get(lay, "grad", "norm") is not None]
    if grads:
        data = [bar([n for n, _ in grads], [get(lay, "grad", "norm") for _, lay in grads], "grad norm",
                    color=PALETTE[0]),
                line([n for n, _ in grads], [get(lay, "grad", "update_ratio") for _, lay in grads],
                     "update / weight", color=PALETTE[1], yaxis="y2", markers=True)]
        s.chart({"data": data, "layout": layout("gradients per layer", y="grad norm",
                                                yaxis2={"title": {"text": "update / weight"}, "overlaying": "y",
                                                        "side": "right", "type": "log", "showgrid": False})})
    cols = ["layer", "weight std", "weight p1", "weight p99", "act mean", "act std", "act zero", "dead units",
            "grad norm", "update ratio", "non-finite"]
    rows = []
    for n, lay in zip(names, with_stats, strict=False):
        nonfinite = sum(int(get(lay, k, "nonfinite") or 0) for k in ("weight", "activation", "grad"))
        rows.append([n, get(lay, "weight", "std"), get(lay, "weight", "p1"), get(lay, "weight", "p99"),
                     get(lay, "activation", "mean"), get(lay, "activation", "std"),
                     get(lay, "activation", "zero_frac"), get(lay, "activation", "dead_frac"),
                     get(lay, "grad", "norm"), get(lay, "grad", "update_ratio"), nonfinite])
    s.table(cols, rows)


@register_renderer("profile")
def _profile(page: Page, r: RunRecord, ctx: Context) -> None:
    if r.result:
        profile_sections(page, Profile.from_dict(dict(r.result)))


# -- train, trial ----------------------------------------------------------------------------------
@register_renderer("train")
def _train(page: Page, r: RunRecord, ctx: Context) -> None:
    if r.result:  # a bandit's pull records its curves, not a result
        rec = TrainResult.from_dict(dict(r.result))
        s = page.section("Training")
        s.kv([(k, v) for k, v in (("epochs", rec.epochs), ("steps", rec.steps), ("samples", rec.samples),
                                  ("throughput", rec.throughput), ("stop_reason", rec.stop_reason)) if v is not None])
    curves(page, r)


@register_renderer("trial")
def _trial(page: Page, r: RunRecord, ctx: Context) -> None:
    s = page.section("Trial")
    if not r.result:  # still running, or killed before it ended
        s.para("the trial has not recorded how it ended", cls="muted")
        curves(page, r)
        return
    res = TrialResult.from_dict(dict(r.result))
    s.kv([("trial", res.trial), ("state", res.state), ("reason", res.reason or "-"), ("steps", res.steps),
          ("train_s", res.train_s), ("gate_s", res.gate_s)]
         + ([("Ray retries", res.ray_retries)] if res.ray_retries is not None else []))
    if res.constraints:
        s.table(["constraint", "metric", "measured", "limit", "ok"],
                [[k, c.metric, c.value, c.limit, "yes" if c.ok else "NO"] for k, c in res.constraints.items()],
                title="constraints")
    curves(page, r)
