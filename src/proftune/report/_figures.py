"""Plotly figures as plain dicts (no plotly import: only its JavaScript goes into the page)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._jsonsafe import finite_float as finite
from ._html import plot_text

PALETTE = ("#3b5bdb", "#f08c00", "#2b8a3e", "#c2255c", "#7048e8", "#1098ad", "#e8590c", "#5c940d",
           "#862e9c", "#364fc7")


def layout(title: str = "", *, x: str = "", y: str = "", height: int = 360, **extra: Any) -> dict[str, object]:
    """The house layout: white paper, light grid, legend on top."""
    base: dict[str, object] = {
        # the title in the top-left corner, the legend under it on the left: plotly's toolbar
        # takes the top-right corner and would cover a legend there
        "title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left", "yref": "container",
                  "y": 1, "yanchor": "top", "pad": {"t": 10}},
        "height": height,
        "margin": {"l": 64, "r": 24, "t": 72 if title else 36, "b": 52},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#fbfcfe",
        "font": {"family": "-apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif", "size": 12,
                 "color": "#1d2330"},
        "xaxis": {"title": {"text": x}, "gridcolor": "#e9ecef", "zeroline": False, "automargin": True},
        "yaxis": {"title": {"text": y}, "gridcolor": "#e9ecef", "zeroline": False, "automargin": True},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.01, "xanchor": "left", "x": 0},
        "hovermode": "closest",
        "showlegend": True,
    }
    for key, value in extra.items():
        old = base.get(key)
        base[key] = {**old, **value} if isinstance(value, dict) and isinstance(old, dict) else value
    return base


def line(x: Sequence[Any], y: Sequence[Any], name: str, *, color: str | None = None, yaxis: str | None = None,
         dash: str | None = None, width: float = 2, markers: bool = False) -> dict[str, object]:
    style: dict[str, object] = {"width": width, **({"color": color} if color else {}),
                                **({"dash": dash} if dash else {})}
    trace: dict[str, object] = {"type": "scatter", "mode": "lines+markers" if markers else "lines",
                                "x": list(x), "y": [finite(v) for v in y], "name": name, "line": style}
    if color:
        trace["marker"] = {"color": color, "size": 6}
    if yaxis:
        trace["yaxis"] = yaxis
    return trace


def vline(x: float, text: str, *, color: str = "#868e96", dash: str = "dot",
          y: float = 1.0) -> tuple[dict[str, object], dict[str, object]]:
    """A vertical marker line and its label (a shape and an annotation)."""
    shape = {"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "xref": "x", "yref": "paper",
             "line": {"color": color, "width": 1.5, "dash": dash}}
    note = {"x": x, "y": y, "xref": "x", "yref": "paper", "text": text, "showarrow": False,
            "font": {"size": 11, "color": color}, "yanchor": "bottom", "textangle": 0,
            "bgcolor": "rgba(255,255,255,0.85)"}
    return shape, note


def hline(y: float, text: str, *, color: str = "#c92a2a",
          dash: str = "dash") -> tuple[dict[str, object], dict[str, object]]:
    shape = {"type": "line", "x0": 0, "x1": 1, "y0": y, "y1": y, "xref": "paper", "yref": "y",
             "line": {"color": color, "width": 1.5, "dash": dash}}
    note = {"x": 1, "y": y, "xref": "paper", "yref": "y", "text": text, "showarrow": False,
            "xanchor": "right", "yanchor": "bottom", "font": {"size": 11, "color": color}}
    return shape, note


def bar(x: Sequence[Any], y: Sequence[Any], name: str, *, color: str | None = None,
        orientation: str = "v", text: Sequence[str] | None = None) -> dict[str, object]:
    trace: dict[str, object] = {"type": "bar", "x": list(x), "y": list(y), "name": name, "orientation": orientation}
    if orientation == "h":
        trace["x"] = [finite(v) for v in x]
    else:
        trace["y"] = [finite(v) for v in y]
    if color:
        trace["marker"] = {"color": color}
    if text is not None:
        trace["text"] = list(text)
        trace["textposition"] = "auto"
    return trace


def heatmap(z: Sequence[Sequence[Any]], x: Sequence[str], y: Sequence[str], *, title: str) -> dict[str, object]:
    """Correlations as a red-blue grid from -1 to 1, each cell labelled with its value."""
    text = [["" if finite(v) is None else f"{float(v):+.2f}" for v in row] for row in z]
    return {
        "data": [{"type": "heatmap", "z": [[finite(v) for v in row] for row in z], "x": list(x), "y": list(y),
                  "zmin": -1, "zmax": 1, "colorscale": "RdBu", "reversescale": True,
                  "text": text, "texttemplate": "%{text}", "hovertemplate": "%{y} × %{x}: %{z:.3f}<extra></extra>",
                  "colorbar": {"thickness": 12}}],
        "layout": layout(title, height=max(260, 70 + 46 * len(y)), xaxis={"side": "bottom"},
                         yaxis={"autorange": "reversed"}),
    }


def parallel(rows: Sequence[Mapping[str, Any]], axes: Sequence[str], color_by: str, *, title: str,
             labels: Sequence[str] | None = None) -> dict[str, object]:
    """Parallel coordinates drawn as SVG lines on normalised axes (no WebGL needed).

    Each row is one line; numeric axes are scaled to [0, 1] between their min and max,
    categorical axes spread their values evenly. The line colour follows ``color_by``.
    """
    scales: list[tuple[Any, ...]] = []
    for a in axes:
        values = [r.get(a) for r in rows]
        nums = [f for f in (finite(v) for v in values if not isinstance(v, str)) if f is not None]
        if nums and len(nums) == sum(v is not None for v in values):
            lo, hi = min(nums), max(nums)
            scales.append(("num", lo, hi))
        else:
            cats = sorted({str(v) for v in values if v is not None})
            scales.append(("cat", cats))

    def pos(i: int, v: Any) -> float | None:
        s = scales[i]
        if v is None:
            return None
        if s[0] == "num":
            f = finite(v)
            if f is None:
                return None
            return 0.5 if s[2] == s[1] else (f - s[1]) / (s[2] - s[1])
        cats = s[1]
        return 0.5 if len(cats) == 1 else cats.index(str(v)) / (len(cats) - 1)

    cvals = [finite(r.get(color_by)) for r in rows]
    known = [c for c in cvals if c is not None]
    lo, hi = (min(known), max(known)) if known else (0.0, 1.0)
    traces = []
    for r, c in zip(rows, cvals, strict=False):
        t = 0.5 if c is None or hi == lo else (c - lo) / (hi - lo)
        color = _ramp(t) if c is not None else "#ced4da"
        ys = [pos(i, r.get(a)) for i, a in enumerate(axes)]
        hover = "<br>".join(plot_text(f"{a}: {r.get(a)}") for a in axes)
        traces.append({"type": "scatter", "mode": "lines+markers", "x": list(range(len(axes))), "y": ys,
                       "line": {"color": color, "width": 2}, "marker": {"size": 5, "color": color},
                       "opacity": 0.75, "showlegend": False, "name": str(r.get("#", "")),
                       "hovertext": [hover] * len(axes),
                       "hovertemplate": "%{hovertext}<extra>trial %{fullData.name}</extra>"})
    notes = []
    for i, s in enumerate(scales):
        if s[0] == "num":
            lo_t, hi_t = _short(s[1]), _short(s[2])
        else:
            lo_t, hi_t = (s[1][0], s[1][-1]) if s[1] else ("", "")
        notes.append({"x": i, "y": 1.04, "xref": "x", "yref": "y", "text": hi_t, "showarrow": False,
                      "font": {"size": 10, "color": "#667085"}, "yanchor": "bottom"})
        notes.append({"x": i, "y": -0.04, "xref": "x", "yref": "y", "text": lo_t, "showarrow": False,
                      "font": {"size": 10, "color": "#667085"}, "yanchor": "top"})
    shapes = [{"type": "line", "x0": i, "x1": i, "y0": 0, "y1": 1, "xref": "x", "yref": "y",
               "line": {"color": "#adb5bd", "width": 1}} for i in range(len(axes))]
    # a colour bar: an invisible marker trace carrying the scale
    traces.append({"type": "scatter", "mode": "markers", "x": [None], "y": [None], "showlegend": False,
                   "hoverinfo": "skip",
                   "marker": {"color": [lo, hi], "cmin": lo, "cmax": hi, "showscale": True,
                              "colorscale": [[0, _ramp(0)], [0.5, _ramp(0.5)], [1, _ramp(1)]],
                              "colorbar": {"title": {"text": color_by}, "thickness": 12}}})
    return {"data": traces, "layout": layout(
        title, height=420, shapes=shapes, annotations=notes,
        xaxis={"tickmode": "array", "tickvals": list(range(len(axes))), "ticktext": list(labels or axes),
               "range": [-0.3, len(axes) - 0.7], "showgrid": False},
        yaxis={"visible": False, "range": [-0.12, 1.12]}, margin={"b": 70})}


def _short(v: float) -> str:
    return f"{v:.3g}"


def _ramp(t: float) -> str:
    """Blue (low) to orange (high), through grey-violet."""
    t = min(1.0, max(0.0, t))
    a, b = (59, 91, 219), (240, 140, 0)
    rgb = tuple(round(a[i] + (b[i] - a[i]) * t) for i in range(3))
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"
