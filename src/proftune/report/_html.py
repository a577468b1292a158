"""One self-contained HTML page: escaped text, sortable tables, plotly charts inlined once.

Every string that reaches the page passes through :func:`esc` (HTML) or :func:`chart_json`
(JSON inside a ``<script>`` tag, with ``<``, ``>`` and ``&`` written as ``\\u003c`` ...), so a
task named ``<script>alert(1)</script>`` is shown as text, never run.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._jsonsafe import json_dumps
from .._optional import require
from .._units import format_bytes

__all__ = ["Cell", "Page", "Section", "chart_json", "clipped", "esc", "fmt_number", "fmt_value", "plot_text"]

_PLOTLY_JS: str | None = None


def esc(value: Any) -> str:
    """Text for an HTML text node or a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def plot_text(value: Any) -> str:
    """Text for a plotly label: plotly reads a few tags (``<b>``, ``<a href>``) in labels, so
    ``&``, ``<`` and ``>`` become the entities plotly turns back into characters."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


#: Keys of a plotly figure whose strings are written by this package (templates with ``%{}``
#: and ``<br>``; ``hovertext`` is built with :func:`plot_text` around each user string); every
#: other string in a figure is escaped with :func:`plot_text`.
_TRUSTED_KEYS = frozenset({"hovertemplate", "texttemplate", "hovertext", "type", "mode", "fill", "xref", "yref",
                           "xanchor", "yanchor", "hovermode", "barmode", "orientation", "textposition",
                           "shape", "dash", "symbol", "colorscale", "line_shape", "side", "tickformat"})


def _clean_figure(value: Any, key: str | None = None) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if key in _TRUSTED_KEYS else plot_text(value)
    if isinstance(value, Mapping):
        return {str(k): _clean_figure(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_figure(v, key) for v in value]
    return value


def chart_json(figure: Mapping[str, Any]) -> str:
    """A plotly figure as JSON safe inside ``<script type="application/json">``."""
    text = json_dumps(_clean_figure(figure), separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def fmt_number(v: Any, *, digits: int = 4) -> str:
    """Numbers for people: ints with separators, floats with ``digits`` significant digits."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:.{digits}g}"
    return str(v)


def fmt_value(name: str, v: Any) -> str:
    """A metric value in its unit (bytes, ms), asking the metric registry for the unit."""
    from ..metrics import METRICS

    if isinstance(v, (int, float)) and not isinstance(v, bool):
        metric = METRICS.get(name)
        unit = metric.unit if metric is not None else ""
        if unit == "bytes" or name.endswith("_bytes"):
            return f"{format_bytes(v)}"
        if unit == "ms" or name.endswith("_ms"):
            return f"{v:.4g} ms"
        if unit == "samples/s":
            return f"{v:,.0f} samples/s" if v >= 100 else f"{v:.3g} samples/s"
        return fmt_number(v)
    if isinstance(v, (dict, list)):
        return json_dumps(v)[:400]
    return fmt_number(v)


@dataclass(frozen=True)
class Cell:
    """A table cell with more than a value: the whole text on hover (``title``), a sort key,
    a CSS class (``trunc`` cuts a long text to one line)."""

    text: str
    title: str = ""
    sort: float | None = None
    cls: str = ""


def clipped(text: Any, limit: int = 60) -> Cell | str:
    """``text`` cut to ``limit`` characters on one line, the whole of it on hover."""
    full = "" if text is None else str(text)
    if len(full) <= limit:
        return full
    return Cell(full[:limit - 1].rstrip() + "…", title=full, cls="trunc")


@dataclass
class Section:
    """One part of the page: a heading and HTML blocks, each already escaped."""

    title: str
    anchor: str
    blocks: list[str] = field(default_factory=list)

    # -- blocks ----------------------------------------------------------------------------
    def html(self, text: str) -> None:
        """Raw, trusted HTML built by this package."""
        self.blocks.append(text)

    def para(self, text: str, *, cls: str = "") -> None:
        self.blocks.append(f'<p class="{esc(cls)}">{esc(text)}</p>')

    def kv(self, items: Iterable[tuple[str, Any]], *, title: str | None = None) -> None:
        """A two-column table of (label, value) pairs; values formatted by :func:`fmt_value`."""
        rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v if isinstance(v, str) else fmt_value(k, v))}</td></tr>"
                       for k, v in items)
        head = f"<h3>{esc(title)}</h3>" if title else ""
        self.blocks.append(f'<div class="kv">{head}<table>{rows}</table></div>')

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, sortable: bool = True,
              title: str | None = None, row_classes: Sequence[str] | None = None) -> None:
        """A table; numbers sort as numbers (``data-v``), every cell is escaped."""
        head = "".join(f"<th>{esc(c)}</th>" for c in columns)
        body = []
        for i, row in enumerate(rows):
            cells = []
            for v in row:
                if isinstance(v, Cell):
                    attrs = f' title="{esc(v.title)}"' if v.title else ""
                    if v.sort is not None:
                        attrs += f' data-v="{v.sort!r}"'
                    cls = " ".join(c for c in (v.cls, "num" if v.sort is not None else "") if c)
                    cells.append(f'<td class="{esc(cls)}"{attrs}>{esc(v.text)}</td>')
                elif isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], (int, float)):
                    text, key = v  # (shown text, sort key)
                    cells.append(f'<td class="num" data-v="{key!r}">{esc(text)}</td>')
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    key = v if math.isfinite(float(v)) else 0
                    cells.append(f'<td class="num" data-v="{key!r}">{esc(fmt_number(v))}</td>')
                else:
                    text = "-" if v is None else str(v)
                    wrap = ' class="nw"' if len(text) <= 16 else ""
                    cells.append(f"<td{wrap}>{esc(text)}</td>")
            cls = f' class="{esc(row_classes[i])}"' if row_classes and i < len(row_classes) else ""
            body.append(f"<tr{cls}>{''.join(cells)}</tr>")
        sort = " sortable" if sortable else ""
        cap = f"<h3>{esc(title)}</h3>" if title else ""
        self.blocks.append(f'<div class="tablewrap">{cap}<table class="data{sort}"><thead><tr>{head}</tr>'
                           f"</thead><tbody>{''.join(body)}</tbody></table></div>")

    def chart(self, figure: Mapping[str, Any], *, side: str | None = None) -> None:
        """A plotly chart; ``side`` (HTML from another block method) goes beside it."""
        self.blocks.append(_ChartBlock(figure, side))  # type: ignore[arg-type]

    def side(self, build: Any) -> str:
        """Render blocks added by ``build(section)`` into a string (for :meth:`chart`'s side)."""
        tmp = Section("", "")
        build(tmp)
        return "".join(b for b in tmp.blocks if isinstance(b, str))

    def json(self, value: Any, *, title: str) -> None:
        """A collapsed, escaped JSON view of a value."""
        text = json_dumps(value, indent=2)
        self.blocks.append(f"<details><summary>{esc(title)}</summary><pre>{esc(text)}</pre></details>")


@dataclass
class _ChartBlock:
    figure: Mapping[str, Any]
    side: str | None


class Page:
    """A report page: a title, a subtitle line, badges and sections, written as one HTML file."""

    def __init__(self, title: str, *, subtitle: str = "", badges: Sequence[tuple[str, str]] = ()) -> None:
        self.title = title
        self.subtitle = subtitle
        self.badges = list(badges)
        self.sections: list[Section] = []
        self._ids: set[str] = set()

    def section(self, title: str) -> Section:
        base = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-") or "section"
        anchor, n = base, 2
        while anchor in self._ids:
            anchor, n = f"{base}-{n}", n + 1
        self._ids.add(anchor)
        s = Section(title, anchor)
        self.sections.append(s)
        return s

    def render(self) -> str:
        """The whole document, plotly.js included once when any section has a chart."""
        charts = 0
        parts = []
        for s in self.sections:
            blocks = []
            for b in s.blocks:
                if isinstance(b, _ChartBlock):
                    cid = f"chart-{charts}"
                    charts += 1
                    chart = (f'<div class="chart" id="{cid}"></div><script type="application/json" '
                             f'data-chart="{cid}">{chart_json(b.figure)}</script>')
                    if b.side:
                        blocks.append(f'<div class="row"><div class="main">{chart}</div>'
                                      f'<div class="aside">{b.side}</div></div>')
                    else:
                        blocks.append(chart)
                else:
                    blocks.append(b)
            parts.append(f'<section id="{esc(s.anchor)}"><h2>{esc(s.title)}</h2>{"".join(blocks)}</section>')
        nav = "".join(f'<a href="#{esc(s.anchor)}">{esc(s.title)}</a>' for s in self.sections)
        badges = "".join(f'<span class="badge {esc(cls)}">{esc(text)}</span>' for text, cls in self.badges)
        plotly = f"<script>{_plotly_js()}</script>" if charts else ""
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:; "
            "font-src data:\">"
            f"<title>{esc(self.title)}</title><style>{_CSS}</style>{plotly}</head><body>"
            f"<header><div class=\"brand\">proftune</div><h1>{esc(self.title)}</h1>"
            f"<div class=\"sub\">{badges}<span>{esc(self.subtitle)}</span></div>"
            f"<nav>{nav}</nav></header><main>{''.join(parts)}</main>"
            "<footer>Written by proftune. Self-contained: opens offline, nothing is fetched.</footer>"
            f"<script>{_JS}</script></body></html>\n"
        )


def _plotly_js() -> str:
    global _PLOTLY_JS
    if _PLOTLY_JS is None:
        js = require("plotly.offline", feature="the HTML report").get_plotlyjs()
        # never possible in plotly's bundle today; guard the page against a future one
        _PLOTLY_JS = js.replace("</script", "<\\/script")
    return _PLOTLY_JS


_CSS = """
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--bg:#f6f7f9;--card:#fff;--accent:#3b5bdb;
--ok:#2b8a3e;--warn:#e67700;--bad:#c92a2a;--info:#1971c2}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--fg);background:var(--bg)}
header{background:linear-gradient(120deg,#1f2a44,#3b5bdb);color:#fff;padding:22px 32px 0}
header .brand{font-size:12px;letter-spacing:.18em;text-transform:uppercase;opacity:.7}
header h1{margin:4px 0 6px;font-size:24px;font-weight:600;word-break:break-word}
header .sub{display:flex;gap:8px;align-items:center;flex-wrap:wrap;opacity:.95;font-size:13px}
nav{display:flex;gap:4px;flex-wrap:wrap;margin-top:16px}
nav a{color:#dbe4ff;text-decoration:none;padding:8px 12px;border-radius:6px 6px 0 0;font-size:13px}
nav a:hover{background:rgba(255,255,255,.12);color:#fff}
main{max-width:1280px;margin:0 auto;padding:20px 24px 40px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:18px 22px;
margin:0 0 18px;box-shadow:0 1px 2px rgba(16,24,40,.04)}
h2{font-size:17px;margin:0 0 12px;font-weight:600}
h3{font-size:13px;margin:10px 0 6px;color:var(--muted);font-weight:600;text-transform:uppercase;
letter-spacing:.04em}
.badge{display:inline-block;padding:2px 9px;border-radius:999px;font-size:12px;font-weight:600;
background:rgba(255,255,255,.18);color:#fff}
.badge.finished,.badge.complete{background:#d3f9d8;color:#1b5e20}
.badge.failed,.badge.error{background:#ffe3e3;color:#a51111}.badge.interrupted{background:#fff3bf;color:#8a5a00}
.badge.running,.badge.warning{background:#fff3bf;color:#7a4b00}
.badge.info{background:#d0ebff;color:#1864ab}
.row{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}
.row .main{flex:3 1 520px;min-width:0}.row .aside{flex:1 1 260px;min-width:0}
.chart{width:100%;min-height:200px}
.kv table,table.data{border-collapse:collapse;width:100%;font-size:13px}
.kv th{text-align:left;font-weight:500;color:var(--muted);padding:4px 10px 4px 0;white-space:nowrap;
vertical-align:top;width:1%}
.kv td{padding:4px 0;word-break:break-word;font-variant-numeric:tabular-nums}
.kv{margin-bottom:8px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(280px,1fr));gap:16px}
.tablewrap{overflow-x:auto;margin:6px 0 10px}
table.data th{position:sticky;top:0;background:#f2f4f7;text-align:left;padding:6px 10px;
border-bottom:1px solid var(--line);font-weight:600;vertical-align:bottom}
table.data td{padding:5px 10px;border-bottom:1px solid #f0f1f3;vertical-align:top;word-break:break-word}
table.data td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.data tbody tr:hover{background:#f8f9fc}
table.data td.nw{white-space:nowrap}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th:after{content:" \\2195";color:#b0b7c3;font-size:11px}
table.sortable th.asc:after{content:" \\2191";color:var(--accent)}
table.sortable th.desc:after{content:" \\2193";color:var(--accent)}
tr.infeasible td{color:#8a5a00}tr.failed td{color:var(--bad)}tr.pruned td{color:var(--muted)}
tr.best td{background:#edf2ff;font-weight:600}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:14px}
.card{border:1px solid var(--line);border-left:4px solid var(--accent);border-radius:8px;padding:12px 14px;
background:#fcfcfd}
.card.error{border-left-color:var(--bad)}.card.warning{border-left-color:var(--warn)}
.card.info{border-left-color:var(--info)}.card.high{border-left-color:var(--ok)}
.card.medium{border-left-color:var(--warn)}.card.low{border-left-color:#adb5bd}
.card .name{font-weight:600;font-size:15px}.card .value{font-size:20px;font-weight:600;margin:4px 0;
word-break:break-word}.card .meta{color:var(--muted);font-size:12px}
.card p{margin:6px 0}
.chain{display:grid;gap:22px;align-items:stretch;margin:4px 0 12px}
.chain .stage{position:relative;border:1px solid var(--line);border-radius:8px;padding:8px 10px;
background:#fcfcfd;min-width:0;font-size:13px;overflow-wrap:anywhere}
.chain .stage:not(:last-child)::after{content:"\\2192";position:absolute;right:-18px;top:40%;
color:var(--muted);font-size:16px}
.chain .stage .name{font-weight:600}.chain .stage .meta{color:var(--muted);font-size:12px}
.chain .stage.failed{border-color:var(--bad)}.chain .stage.skipped{opacity:.7}
.chain a{color:inherit;text-decoration:none}
table.data td.trunc{max-width:22em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;cursor:help}
.headline{display:flex;flex-wrap:wrap;gap:12px;margin:0 0 12px}
.headline .stat{margin:0;border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:180px;
background:#fcfcfd;flex:1 1 180px}
.headline .stat .v{font-size:20px}.headline .stat.good{border-left:4px solid var(--ok)}
.headline .stat.bad{border-left:4px solid var(--warn)}
.verdict{font-size:15px;font-weight:600;margin:0 0 10px}
.verdict.good{color:var(--ok)}.verdict.bad{color:#a05a00}
.pngs{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:14px}
figure.png{margin:8px 0;max-width:100%}figure.png img{max-width:100%;
border:1px solid var(--line);border-radius:6px}figure.png figcaption{color:var(--muted);font-size:12px}
.stat{display:inline-block;margin:0 22px 10px 0}.stat .v{font-size:22px;font-weight:600}
.stat .l{color:var(--muted);font-size:12px}
.muted{color:var(--muted)}.error{color:var(--bad)}
pre{background:#f6f8fa;border:1px solid var(--line);border-radius:6px;padding:10px;overflow:auto;
font-size:12px;max-height:420px;white-space:pre-wrap;word-break:break-word}
details summary{cursor:pointer;color:var(--accent);margin:6px 0}
footer{text-align:center;color:var(--muted);font-size:12px;padding:0 0 30px}
"""

_JS = """
(function(){
  var cfg={displaylogo:false,responsive:true,modeBarButtonsToRemove:['sendDataToCloud']};
  document.querySelectorAll('script[data-chart]').forEach(function(s){
    var div=document.getElementById(s.getAttribute('data-chart'));
    try{var f=JSON.parse(s.textContent);Plotly.newPlot(div,f.data,f.layout||{},cfg);}
    catch(e){div.textContent='chart could not be drawn: '+e;}
  });
  document.querySelectorAll('table.sortable').forEach(function(t){
    var ths=t.tHead.rows[0].cells;
    Array.prototype.forEach.call(ths,function(th,i){
      th.addEventListener('click',function(){
        var asc=!th.classList.contains('asc');
        Array.prototype.forEach.call(ths,function(h){h.classList.remove('asc','desc');});
        th.classList.add(asc?'asc':'desc');
        var body=t.tBodies[0],rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){
          var x=a.cells[i],y=b.cells[i];if(!x||!y)return 0;
          var xv=x.getAttribute('data-v'),yv=y.getAttribute('data-v');
          var r=(xv!==null&&yv!==null)?(parseFloat(xv)-parseFloat(yv)):x.textContent.localeCompare(y.textContent);
          return asc?r:-r;});
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
})();
"""
