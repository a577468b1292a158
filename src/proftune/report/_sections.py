"""What a report shows for each kind of run: one renderer per kind, reading only what the Run holds."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .._api import TrainResult
from .._jsonsafe import is_finite_number as _num
from .._units import format_bytes
from ..compress import Candidate, CompressResult
from ..diagnose import BanditResult, DiagnoseResult, Finding
from ..exceptions import ConfigError
from ..metrics import default_objective, split_objective
from ..profile import CommProfile, LayerProfile, Profile
from ..recommend import BatchSizeResult, LRFindResult, Recommendations
from ..search import TrialResult
from ..track import RunRecord, Store
from ._figures import PALETTE, bar, finite, heatmap, hline, layout, line, parallel, vline
from ._html import Cell, Page, Section, clipped, esc, fmt_number, fmt_value, plot_text

if TYPE_CHECKING:  # search needs the [search] extra: its records are read where a study is drawn
    from ..search import ScanResult, SearchResult, Statement, TrialRecord

Renderer = Callable[[Page, RunRecord, "Context"], None]

#: Renderers by run kind; :func:`register_renderer` adds one (``optimize`` adds its own).
RENDERERS: dict[str, Renderer] = {}


@dataclass
class Context:
    """What a renderer may read besides the run: the store (children, studies)."""

    store: Store | None = None


def register_renderer(kind: str) -> Callable[[Renderer], Renderer]:
    """Decorator: ``@register_renderer("optimize")`` renders runs of that kind after the overview."""

    def deco(fn: Renderer) -> Renderer:
        RENDERERS[kind] = fn
        return fn

    return deco


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def _stat(name: str, v: Any) -> str:
    """A headline number: counts shortened (39.4M), units from the metric registry."""
    text = fmt_value(name, v)
    f = float(v)
    if text.replace(",", "").lstrip("-").isdigit() and abs(f) >= 1e4:
        for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(f) >= div:
                return f"{f / div:.3g}{unit}"
    return text


def _pct(v: Any) -> str:
    return "-" if not _num(v) else f"{float(v):.1%}"


# -- every run -----------------------------------------------------------------------------------
def overview(page: Page, r: RunRecord, *, title: str = "Overview", config_title: str = "config",
             show_stats: bool = True) -> None:
    """Environment, data fingerprint, config, final metrics, artifacts, error."""
    s = page.section(title)
    stats = [(k, v) for k, v in r.metrics.items() if _num(v)][:10] if show_stats else []
    best = (r.result or {}).get("best") if r.kind == "tune" else None
    if stats and r.kind == "tune":  # a study's metrics are its best trial's
        s.html("<h3>" + esc(f"the best trial's metrics (trial #{best.get('number')})" if isinstance(best, Mapping)
                            else "the best trial's metrics") + "</h3>")
    if stats:
        s.html('<div class="stats">' + "".join(
            f'<div class="stat"><div class="v">{esc(_stat(k, v))}</div><div class="l">{esc(k)}</div></div>'
            for k, v in stats) + "</div>")
    if r.error:
        s.html(f'<h3>error</h3><pre class="error">{esc(r.error)}</pre>')
    run_items: list[tuple[str, Any]] = [
        ("run", r.id), ("kind", r.kind), ("task", r.task), ("status", r.status),
        ("started", r.started_at), ("ended", r.ended_at or "-"),
        ("duration", f"{r.duration_s:.1f} s" if r.duration_s is not None else "-"),
        ("data fingerprint", (r.data_fingerprint or "-")[:8]),
        ("data MD5", r.data_fingerprint or "-"),
    ]
    if r.study:
        run_items.append(("study", r.study))
    if r.parent_id is not None:
        run_items.append(("parent run", r.parent_id))
    if r.host:
        run_items.append(("host", r.host))
    env = r.env or {}
    env_items = [(k, env.get(k)) for k in ("device", "device_name", "python", "torch", "cuda", "cudnn",
                                           "cores", "torch_threads", "memory_bytes", "platform", "git_commit")
                 if k in env]
    env_items = [(k, format_bytes(v) if k == "memory_bytes" and _num(v) else ("-" if v is None else str(v)))
                 for k, v in env_items]
    packages = env.get("packages") or {}
    config = [(k, v if not isinstance(v, (list, dict)) else str(v)) for k, v in _flatten(r.config)]
    config_html = s.side(lambda t: t.kv(config[:14], title=config_title))
    if len(config) > 14:
        config_html += ("<details><summary>all config</summary>"
                        + s.side(lambda t: t.kv(config[14:])) + "</details>")
    env_html = s.side(lambda t: t.kv(env_items, title="environment"))
    if packages:
        env_html += ("<details><summary>packages</summary>"
                     + s.side(lambda t: t.kv([(k, str(v)) for k, v in packages.items()])) + "</details>")
    s.html('<div class="grid">' + s.side(lambda t: t.kv(run_items, title="run")) + f"<div>{env_html}</div>"
           + f"<div>{config_html}</div></div>")
    if len(r.metrics) > len(stats):
        s.kv(list(r.metrics.items()), title="final metrics")
    arts = {k: v for k, v in (r.artifacts or {}).items() if v not in (None, [], {}, "")}
    if arts:
        s.kv([(k, ", ".join(map(str, v)) if isinstance(v, list) else str(v)) for k, v in arts.items()],
             title="artifacts")


def curves(page: Page, r: RunRecord, *, findings: Sequence[Finding] = ()) -> None:
    """Per-step and per-epoch curves, anomalies (and diagnose findings) marked at their step."""
    step_rows = [p for p in (r.curves or {}).get("step") or [] if isinstance(p, Mapping)]
    epoch_rows = [p for p in (r.curves or {}).get("epoch") or [] if isinstance(p, Mapping)]
    anomalies = [a for a in (r.anomalies or []) if isinstance(a, Mapping)]
    if not step_rows and not epoch_rows:
        return
    s = page.section("Curves")
    if step_rows:
        xs = [p.get("step") for p in step_rows]
        keys = [k for k in ("loss", "grad_norm", "lr") if any(_num(p.get(k)) for p in step_rows)]
        if "lr" in keys and len({p.get("lr") for p in step_rows}) == 1:
            keys.remove("lr")  # a constant rate: the config says it
            s.para(f"learning rate constant at {fmt_number(step_rows[0].get('lr'))}", cls="muted")
        for key in keys:
            marks = [(a.get("step"), str(a.get("kind", "anomaly")), "#c92a2a") for a in anomalies
                     if _num(a.get("step"))]
            if key == "loss":
                marks += [(f.step, f.cause, _SEVERITY_COLOR.get(f.severity, "#1971c2")) for f in findings
                          if _num(f.step)]
            fig = _step_figure(xs, [p.get(key) for p in step_rows], key, marks,
                               log=key == "lr" and _spans_decades([p.get(key) for p in step_rows]))
            side = _curve_summary(key, [p.get(key) for p in step_rows])
            s.chart(fig, side=s.side(lambda t, side=side, key=key: t.kv(side, title=key)))
    if epoch_rows:
        _epoch_charts(s, epoch_rows)
    if anomalies:
        cols = ["kind", "step", "epoch", "detail"]
        s.table(cols, [[a.get("kind"), a.get("step"), a.get("epoch"),
                        ", ".join(f"{k}={v}" for k, v in a.items() if k not in ("kind", "step", "epoch"))]
                       for a in anomalies], title="anomalies")


def _epoch_charts(s: Section, rows: Sequence[Mapping[str, Any]]) -> None:
    """Losses on one chart, the task's metrics on another, the table of everything beside them."""
    from ..metrics import METRICS

    xs = [p.get("epoch") for p in rows]
    keys = [k for k in dict.fromkeys(k for p in rows for k in p) if k not in ("epoch", "epoch_s", "elapsed_s", "step")
            and any(_num(p.get(k)) for p in rows)]
    losses = [k for k in keys if "loss" in k]
    metrics = [k for k in keys if k not in losses and (k in METRICS and "evaluate" in METRICS[k].stages)]
    others = [k for k in keys if k not in losses and k not in metrics]
    if len(metrics) == 0 and others and len(others) <= 2:
        metrics, others = others, []
    xaxis = {"dtick": 1} if len(xs) <= 20 else {}
    table = s.side(lambda t: t.table(["epoch", *keys], [[p.get("epoch"), *[p.get(k) for k in keys]] for p in rows],
                                     sortable=False))
    for i, (group, title) in enumerate(((losses, "loss per epoch"), (metrics, "metrics per epoch"))):
        if not group:
            continue
        data = [line(xs, [p.get(k) for p in rows], k, color=PALETTE[(j + 2 * i) % len(PALETTE)], markers=True)
                for j, k in enumerate(group)]
        fig = {"data": data, "layout": layout(title, x="epoch", y="loss" if i == 0 else "", xaxis=xaxis)}
        s.chart(fig, side=table if (i == 0 or not losses) else None)


_SEVERITY_COLOR = {"error": "#c92a2a", "warning": "#e67700", "info": "#1971c2"}


def _spans_decades(values: Iterable[Any]) -> bool:
    nums = [float(v) for v in values if _num(v) and float(v) > 0]
    return bool(nums) and max(nums) / min(nums) > 50


def _step_figure(xs: Sequence[Any], ys: Sequence[Any], key: str, marks: Sequence[tuple[Any, str, str]],
                 *, log: bool = False) -> dict[str, Any]:
    data = [line(xs, ys, key, color=PALETTE[0], width=1.5)]
    smooth = _ema(ys)
    if key == "loss" and len(ys) > 10:
        data.append(line(xs, smooth, "smoothed (EMA 0.9)", color=PALETTE[1], width=2.5))
    shapes, notes = [], []
    for i, (x, text, color) in enumerate(marks[:30]):
        shape, note = vline(float(x), text, color=color, y=1.0 - 0.08 * (i % 4))
        shapes.append(shape)
        notes.append(note)
    lay = layout(f"{key} per step", x="step", y=key, shapes=shapes, annotations=notes)
    if log:
        lay["yaxis"]["type"] = "log"
    return {"data": data, "layout": lay}


def _ema(ys: Sequence[Any], beta: float = 0.9) -> list[float | None]:
    out: list[float | None] = []
    avg, n = 0.0, 0
    for v in ys:
        f = finite(v)
        if f is None:
            out.append(None)
            continue
        n += 1
        avg = beta * avg + (1 - beta) * f
        out.append(avg / (1 - beta ** n))
    return out


def _curve_summary(key: str, ys: Sequence[Any]) -> list[tuple[str, Any]]:
    nums = [float(v) for v in ys if _num(v)]
    if not nums:
        return [("points", len(ys))]
    return [("points", len(ys)), ("first", nums[0]), ("last", nums[-1]), ("min", min(nums)), ("max", max(nums)),
            ("non-finite", len(ys) - len(nums))]


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
            rows.append(("of fwd+bwd in no layer", f"{float(step.outside_layers_ms):.4g} ms"))
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


def _share(v: Any) -> tuple[str, float]:
    """A share as a sortable cell: ``12.5%`` shown, the fraction sorted by (0 when unknown)."""
    return _pct(v), finite(v) or 0


def _comm_kv(t: Section, comm: CommProfile | None) -> None:
    if comm is not None:
        t.kv([("backend", comm.backend), ("world size", comm.world_size),
              ("all-reduce per step", format_bytes(comm.allreduce_bytes)),
              ("all-reduce time", f"{float(comm.allreduce_ms or 0):.3g} ms"),
              ("share of the step", _pct(comm.share))], title="distributed")


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
        """One statistic (``stats`` is the layer's free-form ``{kind: {name: value}}``)."""
        return (lay.stats.get(kind) or {}).get(key)

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
        shown: str = (fmt_value(x.name, x.value) if not isinstance(x.value, (list, dict)) else _short_value(x.value))
        # the batch-size search's own record is drawn below, not listed; a record's version is no evidence
        evidence = {k: v for k, v in x.evidence.items() if k not in ("search", "schema_version")}
        ev = s.side(lambda t, evidence=evidence: t.kv(
            [(k, v if not isinstance(v, (dict, list)) else _short_value(v)) for k, v in _flatten(evidence)]))
        cards.append(f'<div class="card {esc(x.confidence)}"><div class="name">{esc(x.name)}</div>'
                     f'<div class="value">{esc(shown)}</div><div class="meta">confidence: {esc(x.confidence)}</div>'
                     f"<p>{esc(x.reason)}</p>"
                     + (f'<p class="muted">effect: {esc(x.effect)}</p>' if x.effect else "")
                     + _value_table(s, x.value)
                     + f"<details><summary>evidence</summary>{ev}</details></div>")
    s.html('<div class="cards">' + "".join(cards) + "</div>")
    batch = next((x for x in recs if x.name == "batch_size"), None)
    if batch is not None:
        search = batch.evidence.get("search")
        if isinstance(search, Mapping):
            _memory_model(page, BatchSizeResult.from_dict(dict(search)))
        elif batch.evidence.get("memory_model"):
            page.section("Memory model").para(
                "the batch-size search's probes are not in this run (recorded before they were kept): "
                "its fitted model is in the batch_size card's evidence", cls="muted")


def _value_table(s: Section, value: Any) -> str:
    if not (isinstance(value, list) and value and all(isinstance(i, Mapping) for i in value)):
        return ""
    cols = list(dict.fromkeys(k for i in value for k in i))
    return s.side(lambda t: t.table(cols, [[(_pct(i.get(c)), finite(i.get(c)) or 0) if c.endswith("_share")
                                            else i.get(c) for c in cols] for i in value], sortable=False))


def _short_value(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(str(i.get("layer", i.get("name", i))) if isinstance(i, Mapping) else str(i)
                         for i in v[:8]) or "none"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={fmt_number(x) if _num(x) else x}" for k, x in list(v.items())[:8])
    return str(v)


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
    data: list[dict[str, Any]] = []
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
    lay = layout("loss vs learning rate", x="learning rate (log)", y="loss", shapes=shapes, annotations=notes)
    lay["xaxis"]["type"] = "log"
    if yr:
        lay["yaxis"]["range"] = yr
    items = [(k, v) for k, v in (("suggested_lr", res.suggested_lr), ("min_lr", res.min_lr), ("max_lr", res.max_lr),
                                 ("lr_at_min_loss", res.lr_at_min_loss), ("rule", res.rule),
                                 ("stop_reason", res.stop_reason), ("message", res.message),
                                 ("optimizer", res.optimizer), ("batch_size", res.batch_size), ("steps", res.steps),
                                 ("steps_planned", res.steps_planned)) if v is not None]
    if res.suggested_lr is None:
        items.insert(0, ("suggestion", "none: " + str(res.message or "the loss did not fall")))
    s.chart({"data": data, "layout": lay}, side=s.side(lambda t: t.kv(items)))


# -- diagnose ----------------------------------------------------------------------------------------
T = TypeVar("T")


def read_result(page: Page, r: RunRecord, reader: Callable[[dict[str, Any]], T]) -> T | None:
    """The Run's result read back as its record (``reader``: the record's ``from_dict``); None,
    with a section that says why and what the run holds, when there is none or it cannot be read
    (a run that failed before its result, one recorded by an older proftune in another form)."""
    if not r.result:
        page.section("Result").para("this run holds no result" + (f": {r.error}" if r.error else
                                                                   " (it is still running, or it stopped before it had one)"),
                                    cls="muted")
        return None
    try:
        return reader(dict(r.result))
    except ConfigError as exc:
        s = page.section("Result")
        s.para(f"this run's result cannot be read as its record: {exc}", cls="error")
        s.json(r.result, title="everything the run holds")
        return None


@register_renderer("diagnose")
def _diagnose(page: Page, r: RunRecord, ctx: Context) -> None:
    res = read_result(page, r, DiagnoseResult.from_dict)
    if res is None:
        curves(page, r)
        return
    s = page.section("Findings")
    if not res.findings:
        s.para("no findings: training looks healthy", cls="muted")
    cards = []
    # the ranking's order (root causes first, by causality then severity), each root's consequences after it
    numbered: list[tuple[str, Finding]] = []
    for n, root in enumerate(res.findings, start=1):
        numbered.append((str(n), root))
        numbered.extend((f"{n}.{j}", c) for j, c in enumerate(root.consequences, start=1))
    for i, f in numbered:
        ev = {**f.evidence, "step": f.step, "layer": f.layer}
        evhtml = s.side(lambda t, ev=ev: t.kv([(k, v if not isinstance(v, (dict, list)) else _short_value(v))
                                               for k, v in _flatten(ev)]))
        where = ([f"step {f.step}"] if f.step is not None else []) + ([f"layer {f.layer}"] if f.layer else [])
        cards.append(
            f'<div class="card {esc(f.severity)}"><div class="name">{i}. {esc(f.cause)}</div>'
            f'<div class="meta"><span class="badge {esc(f.severity)}">{esc(f.severity)}</span> confidence '
            f'{esc(fmt_number(round(f.confidence, 3)))} {esc(" · ".join(where))}'
            + (f" · explained by {esc(f.explained_by)}" if f.explained_by else "")
            + (f'</div><div class="meta">{esc(f.why)}' if f.why else "")
            + f'</div><p>{esc(f.summary)}</p><p><b>fix:</b> {esc(f.fix)}</p>'
            f"<details><summary>evidence</summary>{evhtml}</details></div>")
    if cards:
        s.html('<div class="cards">' + "".join(cards) + "</div>")
    if res.lr_test is not None:
        s.kv(list(_flatten(res.lr_test.summary())), title="LR range test")
    curves(page, r, findings=res.findings)


# -- bandit --------------------------------------------------------------------------------------------
@register_renderer("bandit")
def _bandit(page: Page, r: RunRecord, ctx: Context) -> None:
    res = read_result(page, r, BanditResult.from_dict)
    if res is None:
        return
    s = page.section("Allocation")
    s.para(f"bandit {res.name} · policy {res.policy} · reward {res.metric} ({res.mode}) · best: {res.best}",
           cls="muted")
    if res.arms:
        names = [a.arm for a in res.arms]
        data = [bar(names, [a.pulls for a in res.arms], "pulls", color=PALETTE[0]),
                line(names, [a.mean for a in res.arms], f"mean {res.metric}", color=PALETTE[1],
                     yaxis="y2", markers=True)]
        data[-1]["mode"] = "markers"
        data[-1]["marker"] = {"size": 12, "color": PALETTE[1]}
        fig = {"data": data, "layout": layout("pulls and mean reward per configuration", y="pulls",
                                              yaxis2={"title": {"text": res.metric}, "overlaying": "y",
                                                      "side": "right", "showgrid": False})}
        s.chart(fig, side=s.side(lambda t: t.table(
            ["config", "pulls", "mean", "std", "params"],
            [[a.arm, a.pulls, a.mean, a.std, _short_value(a.params)] for a in res.arms],
            row_classes=["best" if a.arm == res.best else "" for a in res.arms])))
    if res.regret:
        rs = page.section("Regret")
        xs = list(range(1, len(res.regret) + 1))
        rs.chart({"data": [line(xs, res.regret, res.policy, color=PALETTE[0], markers=True),
                           line(xs, res.uniform_regret, "uniform allocation", color="#868e96", dash="dash")],
                  "layout": layout("cumulative regret vs the best estimated mean", x="pull", y="regret")})
    if res.pulls:
        s.table(["round", "config", res.metric, "run"], [[p.round, p.arm, p.value, p.run_id] for p in res.pulls],
                title="pulls in this call")


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
        objectives = [str(o) for o in cfg.get("objectives") or []]
        obj = [o for o in map(_objective, objectives) if o is not None]
        constraints = [str(c) for c in cfg.get("constraints") or []]
    reported = {k for t in trials for k in (t.metrics or {})} or None
    obj = obj or [split_objective(default_objective(reported))]
    rows: list[dict[str, Any]] = []
    unread: list[str] = []
    for t in trials:
        try:  # a trial Run's record (none while it runs, or when it failed before it ended)
            tr = TrialResult.from_dict(dict(t.result)) if t.result else None
        except ConfigError as exc:
            tr = None
            unread.append(f"run {t.id}: {exc}")
        rows.append({"#": tr.trial if tr is not None and tr.trial is not None else t.id,
                     "state": tr.state if tr is not None else ("running" if t.status == "running" else t.status),
                     "reason": tr.reason if tr is not None else None, "params": (t.config or {}).get("params") or {},
                     "metrics": t.metrics or {}, "constraints": tr.constraints if tr is not None else {},
                     "duration": t.duration_s, "run": t.id, "curve": (t.curves or {}).get("epoch") or []})
    rows.sort(key=lambda row: (row["#"], row["run"]))
    s = page.section("Study")
    if unread:
        s.para(f"{len(unread)} trial run(s) cannot be read as their record: {unread[0]}", cls="error")
    _best_trial(s, res, obj)
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["state"])] = counts.get(str(row["state"]), 0) + 1
    s.html('<div class="stats">' + "".join(
        f'<div class="stat"><div class="v">{n}</div><div class="l">{esc(k)}</div></div>'
        for k, n in sorted(counts.items())) + "</div>")
    s.kv([("study", latest.study if latest else "-"), ("objectives", ", ".join(objectives) or "-"),
          ("constraints", ", ".join(constraints) or "-"),
          ("sampler", res.sampler if res else cfg.get("sampler")), ("pruner", res.pruner if res else cfg.get("pruner")),
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
    s.para("its params: " + _short_value(best.params), cls="muted")
    stats = [(k, v) for k, v in best.metrics.items() if _num(v)][:10]
    if stats:
        s.html('<div class="stats">' + "".join(
            f'<div class="stat"><div class="v">{esc(_stat(k, v))}</div><div class="l">{esc(k)} (best trial)</div></div>'
            for k, v in stats) + "</div>")


def _scan_section(page: Page, scan: ScanResult | None) -> None:
    """The feasibility scan: what it profiled, the bounds it fitted, its notes."""
    if scan is None:
        return
    s = page.section("Feasibility scan")
    s.para(f"{scan.profiles} configurations profiled, not trained, in {scan.duration_s:.1f} s"
           f" against {', '.join(scan.constraints)}; {_pct(scan.feasible_share)} of them feasible"
           + ("; stopped once the bounds were stable" if scan.stopped_early else ""), cls="muted")
    if scan.bounds:
        s.table(["param", "bound", "scanned profiles that agree", "keeps"],
                [[b.param, f"{b.op} {_short_value(list(b.value) if b.op == 'in' else b.value)}",
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


def _history(page: Page, rows: Sequence[Mapping[str, Any]], obj: Sequence[tuple[str, str]]) -> None:
    """Every trial at its number: a value where it has one, else at the axis floor with why it has
    none (infeasible, pruned, failed) on hover."""
    s = page.section("Optimisation history")
    colors = {"complete": PALETTE[0], "infeasible": PALETTE[1], "pruned": "#868e96", "failed": "#c92a2a",
              "running": "#adb5bd"}
    for name, direction in obj:
        vals = [float(row["metrics"][name]) for row in rows if _num(row["metrics"].get(name))]
        floor = (min(vals) if direction == "max" else max(vals)) if vals else 0.0
        data = []
        for state, color in colors.items():
            pts = [row for row in rows if row["state"] == state]
            with_v = [row for row in pts if _num(row["metrics"].get(name))]
            without = [row for row in pts if not _num(row["metrics"].get(name))]
            for group, label, symbol in ((with_v, state, "circle"), (without, f"{state}: no {name}", "x")):
                if not group:
                    continue
                data.append({"type": "scatter", "mode": "markers", "name": label,
                             "x": [row["#"] for row in group],
                             "y": [row["metrics"][name] if symbol == "circle" else floor for row in group],
                             "marker": {"size": 9, "color": color, "symbol": symbol},
                             "hovertext": [plot_text(f"trial {row['#']} ({row['state']})"
                                                     + (f": {_clip(row['reason'], 160)}" if row["reason"] else "")
                                                     + f"<br>{_short_value(row['params'])}") for row in group],
                             "hovertemplate": "%{hovertext}<extra></extra>" if symbol == "x"
                             else "%{hovertext}<br>" + name + " %{y:.4g}<extra></extra>"})
        best: list[float | None] = []
        cur: float | None = None
        for row in rows:
            v = finite(row["metrics"].get(name)) if row["state"] == "complete" else None
            if v is not None and (cur is None or (v > cur if direction == "max" else v < cur)):
                cur = v
            best.append(cur)
        data.append({**line([row["#"] for row in rows], best, f"best so far ({direction})", color=PALETTE[2]),
                     "line": {"shape": "hv", "color": PALETTE[2], "width": 2}})
        missing = sum(1 for row in rows if not _num(row["metrics"].get(name)))
        s.chart({"data": data, "layout": layout(f"{name} of every trial ({len(rows)})", x="trial", y=name)})
        if missing:
            s.para(f"{missing} trial(s) have no {name} (gated before training, pruned early or failed): "
                   "drawn as x at the bottom of the axis; hover for why.", cls="muted")


def _clip(text: Any, n: int) -> str:
    t = str(text)
    return t if len(t) <= n else t[: n - 1] + "…"


def _trial_table(page: Page, rows: Sequence[Mapping[str, Any]], obj: Sequence[tuple[str, str]],
                 constrained: Sequence[str] = ()) -> None:
    """One line per trial: params, the objectives and the constrained metrics, why it ended (cut
    to one line, whole on hover)."""
    s = page.section("Trials")
    pnames = list(dict.fromkeys(k for row in rows for k in row["params"]))
    fixed = {k for k in pnames if len({repr(row["params"].get(k)) for row in rows}) == 1}
    shown = [p for p in pnames if p not in fixed]
    mnames = list(dict.fromkeys([*(n for n, _ in obj), *constrained]))
    if fixed:
        s.para("the same in every trial: " + ", ".join(f"{k} {fmt_number(rows[0]['params'].get(k), digits=3)}"
                                                       for k in sorted(fixed)), cls="muted")
    table_rows = []
    for row in rows:
        cons = row["constraints"]
        broken = [f"{k}: measured {fmt_number(c.value)}" for k, c in cons.items() if not c.ok]
        reason = row["reason"] or ""
        if broken and row["state"] == "infeasible" and not reason:
            reason = "; ".join(broken)
        table_rows.append([row["#"], row["state"],
                           *[Cell(fmt_number(row["params"].get(p), digits=3), cls="nw") for p in shown],
                           *[(fmt_value(m, row["metrics"].get(m)), finite(row["metrics"].get(m)) or 0)
                             if _num(row["metrics"].get(m)) else "-" for m in mnames],
                           clipped(reason, 40), (f"{row['duration']:.1f}", row["duration"])
                           if _num(row["duration"]) else "-", row["run"]])
    s.table(["#", "state", *shown, *mnames, "why it ended", "seconds", "run"], table_rows,
            row_classes=[str(row["state"]) for row in rows])


def _parallel(page: Page, rows: Sequence[Mapping[str, Any]], obj: Sequence[tuple[str, str]]) -> None:
    done = [row for row in rows if row["state"] == "complete"]
    if len(done) < 2:
        return
    pnames = [k for k in dict.fromkeys(k for row in done for k in row["params"])
              if len({repr(row["params"].get(k)) for row in done}) > 1]  # a fixed param is no axis
    target = obj[0][0]
    flat = [{"#": row["#"], **row["params"], target: row["metrics"].get(target)} for row in done]
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
        data = []
        for i, (method, label) in enumerate((("fanova", "fANOVA"), ("ped_anova", "PED-ANOVA"))):
            vals = {k: v for k, v in (per.get(method) or {}).items() if _num(v)}
            if vals:
                data.append(bar(list(vals.values()), list(vals.keys()), label, orientation="h", color=PALETTE[i]))
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
            names = list(dict.fromkeys(k for d in data for k in d["y"]))
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


def _pareto(page: Page, rows: Sequence[Mapping[str, Any]], obj: Sequence[tuple[str, str]],
            front: Sequence[TrialRecord]) -> None:
    (m1, d1), (m2, d2) = obj[0], obj[1]
    done = [row for row in rows if row["state"] in ("complete", "infeasible")
            and _num(row["metrics"].get(m1)) and _num(row["metrics"].get(m2))]
    if not done:
        return
    on_front = {f.number for f in front}
    s = page.section("Pareto front")
    data = []
    for name, pts, color, size in (
            ("infeasible", [r for r in done if r["state"] == "infeasible"], PALETTE[1], 8),
            ("dominated", [r for r in done if r["state"] == "complete" and r["#"] not in on_front], "#adb5bd", 9),
            ("Pareto front", sorted([r for r in done if r["#"] in on_front], key=lambda r: r["metrics"][m1]),
             PALETTE[0], 12)):
        if pts:
            data.append({"type": "scatter", "mode": "lines+markers" if name == "Pareto front" else "markers",
                         "name": name, "x": [r["metrics"][m1] for r in pts], "y": [r["metrics"][m2] for r in pts],
                         "marker": {"size": size, "color": color}, "line": {"color": color, "shape": "hv"},
                         "hovertext": [plot_text(f"trial {r['#']}: {_short_value(r['params'])}") for r in pts],
                         "hovertemplate": "%{hovertext}<br>%{x:.4g}, %{y:.4g}<extra></extra>"})
    s.chart({"data": data, "layout": layout(f"{m1} ({d1}) vs {m2} ({d2})", x=m1, y=m2)},
            side=s.side(lambda t: t.table(["trial", m1, m2], [[f.number, f.metrics.get(m1), f.metrics.get(m2)]
                                                              for f in front], sortable=False, title="front")))
    if len(obj) > 2:
        s.para("more than two objectives: the chart shows the first two; the table lists the whole front.",
               cls="muted")
