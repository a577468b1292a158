"""What every page is drawn with: the renderer registry (:func:`register_renderer`), the
overview and curves every run shows, reading a Run's result as its record, the shared cells."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .._jsonsafe import finite_float
from .._jsonsafe import is_finite_number as _num
from .._registry import Registry
from .._units import format_bytes
from ..diagnose import Finding
from ..exceptions import ConfigError
from ..track import RunRecord, Store
from ._figures import PALETTE, finite, layout, line, vline
from ._html import Page, Section, esc, fmt_number, fmt_value

Renderer = Callable[[Page, RunRecord, "Context"], None]

#: Renderers by run kind; :func:`register_renderer` adds one (each page of this package does), and an
#: installed package's through the ``proftune.report_pages`` entry point group (its name: the kind).
RENDERERS: Registry[Renderer] = Registry("report page", entry_points="proftune.report_pages")


@dataclass
class Context:
    """What a renderer may read besides the run: the store (children, studies)."""

    store: Store | None = None


def register_renderer(kind: str, *, replace: bool = False) -> Callable[[Renderer], Renderer]:
    """Decorator: ``@register_renderer("optimize")`` renders runs of that kind after the overview;
    a kind that has a page already needs ``replace=True``."""

    def deco(fn: Renderer) -> Renderer:
        if not callable(fn):
            raise ConfigError(f"a report page must be a function (page, run, context), but got {fn!r}.")
        RENDERERS.add(fn, name=kind, replace=replace)
        return fn

    return deco


def _register_installed_page(fn: Renderer, kind: str) -> None:
    """An installed package's page (its entry point's name the run kind) replaces a built-in one:
    installing it is the choice."""
    register_renderer(kind, replace=True)(fn)


RENDERERS.loads_through(_register_installed_page, named=True)


def flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.extend(flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def headline_stat(name: str, v: Any) -> str:
    """A headline number: counts shortened (39.4M), units from the metric registry."""
    text = fmt_value(name, v)
    f = float(v)
    if text.replace(",", "").lstrip("-").isdigit() and abs(f) >= 1e4:
        for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(f) >= div:
                return f"{f / div:.3g}{unit}"
    return text


def fmt_pct(v: Any) -> str:
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
            f'<div class="stat"><div class="v">{esc(headline_stat(k, v))}</div><div class="l">{esc(k)}</div></div>'
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
    env_items = [(k, format_bytes(finite_float(v)) if k == "memory_bytes" and _num(v)
                  else ("-" if v is None else str(v))) for k, v in env_items]
    packages = p if isinstance(p := env.get("packages"), Mapping) else {}
    config = [(k, v if not isinstance(v, (list, dict)) else str(v)) for k, v in flatten(r.config)]
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
    step_rows, epoch_rows = r.curve("step"), r.curve("epoch")
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
            side = _curve_summary([p.get(key) for p in step_rows])
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
                 *, log: bool = False) -> dict[str, object]:
    data = [line(xs, ys, key, color=PALETTE[0], width=1.5)]
    smooth = _ema(ys)
    if key == "loss" and len(ys) > 10:
        data.append(line(xs, smooth, "smoothed (EMA 0.9)", color=PALETTE[1], width=2.5))
    shapes, notes = [], []
    for i, (x, text, color) in enumerate(marks[:30]):
        shape, note = vline(float(x), text, color=color, y=1.0 - 0.08 * (i % 4))
        shapes.append(shape)
        notes.append(note)
    return {"data": data, "layout": layout(f"{key} per step", x="step", y=key, shapes=shapes, annotations=notes,
                                           yaxis={"type": "log"} if log else {})}


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


def _curve_summary(ys: Sequence[Any]) -> list[tuple[str, Any]]:
    nums = [float(v) for v in ys if _num(v)]
    if not nums:
        return [("points", len(ys))]
    return [("points", len(ys)), ("first", nums[0]), ("last", nums[-1]), ("min", min(nums)), ("max", max(nums)),
            ("non-finite", len(ys) - len(nums))]



def short_value(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(str(i.get("layer", i.get("name", i))) if isinstance(i, Mapping) else str(i)
                         for i in v[:8]) or "none"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={fmt_number(x) if _num(x) else x}" for k, x in list(v.items())[:8])
    return str(v)


T = TypeVar("T")


def read_result(page: Page, r: RunRecord, reader: Callable[[dict[str, Any]], T]) -> T | None:
    """The Run's result read back as its record (``reader``: the record's ``from_dict``); None,
    with a section that says why and what the run holds, when there is none or it cannot be read
    (a run that failed before its result, one recorded by an older proftune in another form)."""
    if not r.result:
        page.section("Result").para(
            "this run holds no result"
            + (f": {r.error}" if r.error else " (it is still running, or it stopped before it had one)"),
            cls="muted")
        return None
    try:
        return reader(dict(r.result))
    except ConfigError as exc:
        s = page.section("Result")
        s.para(f"this run's result cannot be read as its record: {exc}", cls="error")
        s.json(r.result, title="everything the run holds")
        return None
