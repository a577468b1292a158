"""The result told in sentences a newcomer reads: what changed, whether it helped beyond noise,
whether the compressed model is faster, how the time went and why the run stopped.

One home for these sentences: the terminal summary and the HTML report both print what
:func:`tell` put in the result (``story``), from the result's own numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .._jsonsafe import finite_float as _f
from .._units import format_bytes

__all__ = ["fmt", "fmt_ms", "method_name", "rounded", "tell"]


def fmt(v: Any, digits: int = 3) -> str:
    """A number for people: three significant digits (``0.0679``, ``0.887``), ints as they are."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    f = _f(v)
    if f is None:
        return str(v)
    if f.is_integer() and abs(f) < 1e6:
        return str(int(f))
    return f"{f:.{digits}g}"


_DECIMAL = re.compile(r"(?<![\w.])([+-]?)(\d+\.\d+)(?![\w.])")


def rounded(text: Any) -> str:
    """``text`` with every decimal number in it cut to three significant digits (sentences from
    other parts: "the mean gain -0.002778 is not a gain" -> "-0.00278")."""
    def cut(m: re.Match[str]) -> str:
        digits = m.group(2).replace(".", "").lstrip("0")
        return m.group(0) if len(digits) <= 3 else f"{m.group(1)}{float(m.group(2)):.3g}"

    return _DECIMAL.sub(cut, str(text))


def _signed(v: Any, digits: int = 2) -> str:
    f = _f(v)
    return "-" if f is None else f"{f:+.{digits}g}"


def fmt_ms(v: Any) -> str:
    """Milliseconds: ``0.0164 ms``, ``1.12 ms``, ``240 ms``."""
    f = _f(v)
    return "-" if f is None else f"{f:.3g} ms"


def _secs(v: Any) -> str:
    f = _f(v)
    if f is None:
        return "-"
    return f"{f:.0f} s" if f >= 100 else f"{f:.1f} s"


def _pm(s: Mapping[str, Any] | None) -> str:
    """``0.887 ± 0.012`` of a summary (mean, std, n)."""
    if not s or _f(s.get("mean")) is None:
        return "-"
    std = _f(s.get("std"))
    return f"{fmt(s['mean'])} ± {fmt(std, 2)}" if std is not None else fmt(s["mean"])


def _times(new: Any, old: Any) -> tuple[float | None, str]:
    """(old / new, "1.99x faster" / "1.05x slower") for two latencies."""
    a, b = _f(new), _f(old)
    if a is None or b is None or a <= 0:
        return None, ""
    r = b / a
    return r, (f"{r:.2f}x faster" if r >= 1 else f"{1 / r:.2f}x slower")


def _noise(cmp: Mapping[str, Any] | None, metric: str) -> str:
    """A paired comparison in one sentence: the gain, its spread, the bound and what it means."""
    if not cmp:
        return "no paired comparison (no searched configuration reached the final race)"
    n = len(cmp.get("seeds") or [])
    reason = rounded(cmp.get("reason") or "")
    for said in ("beyond noise: ", "within noise: "):  # the answer says it already
        reason = reason[len(said):] if reason.startswith(said) else reason
    if _f(cmp.get("gain")) is None:
        return reason or "no comparison"
    std = f" ± {fmt(cmp.get('gain_std'), 2)}" if _f(cmp.get("gain_std")) is not None else ""
    return f"{metric} gain {_signed(cmp['gain'])}{std} over {n} paired seed(s); {reason}"


def method_name(c: Mapping[str, Any]) -> str:
    """A compression candidate as people name it: ``structured pruning 50% + dynamic INT8``."""
    words = {"dynamic": "dynamic INT8", "static": "static INT8", "qat": "INT8 (QAT)",
             "structured": "structured pruning", "unstructured": "unstructured pruning"}
    ratio = _f(c.get("ratio"))
    out = []
    for part in str(c.get("method") or "-").split("+"):
        name = words.get(part, part)
        if "pruning" in name and ratio:
            name += f" {ratio:.0%}"
        out.append(name)
    return " + ".join(out)


def _compression(final: Mapping[str, Any], vs: Mapping[str, Any], compress: Mapping[str, Any]) -> str:
    """Is the compressed model faster, at batch 1 and at the task's batch, and what it costs."""
    c = final.get("compressed")
    bs = final.get("batch_size")
    if c:
        r1, w1 = _times(c.get("latency_ms"), final.get("latency_ms"))
        rb, wb = _times(c.get("latency_batch_ms"), final.get("latency_batch_ms"))
        parts = [f"yes: {method_name(c)} runs {w1} at batch 1 ({fmt_ms(final.get('latency_ms'))} -> "
                 f"{fmt_ms(c.get('latency_ms'))})" if r1 else f"{method_name(c)}: no latency at batch 1"]
        if rb:
            parts.append(f"{wb} at batch {bs} ({fmt_ms(final.get('latency_batch_ms'))} -> "
                         f"{fmt_ms(c.get('latency_batch_ms'))})")
        sz_new, sz_old = _f(c.get("size_bytes")), _f(compress.get("baseline", {}).get("size_bytes")
                                                     or final.get("size_bytes"))
        if sz_new and sz_old:
            ratio = sz_old / sz_new
            parts.append(f"size {format_bytes(sz_old)} -> {format_bytes(sz_new)} "
                         + (f"({ratio:.2f}x smaller)" if ratio >= 1 else f"({1 / ratio:.2f}x larger)"))
        drop = _f(c.get("metric_drop"))
        parts.append(f"{vs.get('metric', 'metric')} {fmt(c.get('metric'))} on validation"
                     + (f" ({fmt(drop, 2)} below the uncompressed model)" if drop and drop > 0 else
                        f" ({fmt(-drop, 2)} above the uncompressed model: its fine-tuning trained it further)"
                        if drop else " (no drop)")
                     + (f", {fmt(c.get('test_metric'))} held out" if _f(c.get("test_metric")) is not None else ""))
        return "; ".join(parts)
    if compress.get("skipped"):
        return f"not tried: {rounded(compress['skipped'])}"
    cands = [x for x in compress.get("candidates") or [] if isinstance(x, Mapping) and x.get("within_budget")]
    best = min(cands, key=lambda x: _f(x.get("latency_ms")) or math.inf, default=None)
    verdict = rounded(vs.get("compression") or "kept the uncompressed model")
    if best is None:
        return f"no: {verdict}"
    r1, w1 = _times(best.get("latency_ms"), final.get("latency_ms"))
    rb, wb = _times(best.get("latency_batch_ms"), final.get("latency_batch_ms"))
    return (f"no: kept the uncompressed model; the fastest candidate within the accuracy budget, "
            f"{method_name(best)}, runs {w1 or '-'} at batch 1 ({fmt_ms(final.get('latency_ms'))} -> "
            f"{fmt_ms(best.get('latency_ms'))})"
            + (f" and {wb} at batch {bs} ({fmt_ms(final.get('latency_batch_ms'))} -> "
               f"{fmt_ms(best.get('latency_batch_ms'))})" if rb else "")
            )


def _changed(rows: Sequence[Mapping[str, Any]]) -> str:
    moved = [r for r in rows if r.get("changed")]
    if not moved:
        return "nothing: the result is the task's defaults"
    return ", ".join(f"{r['param']} {fmt(r.get('default'))} -> {fmt(r.get('value'))} ({r.get('source')})"
                     for r in moved)


def _stage_row(s: Mapping[str, Any], d: Mapping[str, Any]) -> dict[str, Any]:
    """A stage: what its two numbers are, labelled, and what it did, in a few words."""
    name = str(s.get("name"))
    o: Mapping[str, Any] = s.get("outputs") or {}
    before, after = s.get("metric_before"), s.get("metric_after")
    numbers, did = "", ""
    if name == "baseline":
        numbers = f"no tricks {fmt(before)} -> defaults {fmt(after)}"
        dflt = o.get("defaults") or {}
        did = (f"trained the defaults ({dflt.get('epochs')} epoch(s), with the health checks) beside a no-tricks "
               f"run (AdamW lr 1e-3, no regularisation); spread {fmt(o.get('spread'), 2)}")
    elif name == "health":
        errors, warnings = len(o.get("errors") or []), len(o.get("warnings") or [])
        did = (f"{errors} error(s), {warnings} warning(s) in the baseline's training"
               + ("; ignored (--ignore-findings)" if o.get("ignored") else "")
               + f"; profiled the step: {fmt_ms(o.get('step_time_ms'))}, peak {format_bytes(o.get('peak_memory_bytes'))}, "
               f"{fmt(o.get('params'))} params")
    elif name == "compute":
        did = "computed " + (", ".join(f"{k} {fmt(v)}" for k, v in (o.get("computed") or {}).items()) or "nothing")
    elif name == "layer_value":
        n = len(o.get("findings") or [])
        did = (f"{n} layer(s) cost far more time than they are worth: "
               + ", ".join(str(f.get("layer")) for f in o.get("findings") or [])) if n else \
            "no layer costs far more time than it is worth"
    elif name == "search":
        arms = o.get("arms") or {}
        numbers = f"best {fmt(after)}" + (f" (defaults {fmt(before)})" if before is not None else "")
        did = (f"{o.get('trials', 0)} trial(s) of {o.get('epochs_per_trial')} epoch(s) ("
               + ", ".join(f"{k} {v}" for k, v in arms.items()) + f"); {rounded(o.get('stop_reason') or '')}")
    elif name == "final":
        seeds = len((d.get("final") or {}).get("seeds") or [])
        numbers = f"defaults {fmt(before)} -> result {fmt(after)}"
        did = f"raced the defaults and the search's best over {seeds} paired seed(s): " + (
            f"adopted {o.get('chosen')}" if o.get("decision") == "chosen" else "kept the defaults")
    elif name == "compress":
        if o.get("skipped"):
            did = f"skipped: {rounded(o['skipped'])}"
        else:
            numbers = (f"uncompressed {fmt(before)} -> compressed {fmt(after)}" if after is not None
                       else f"uncompressed {fmt(before)}, kept")
            did = rounded(o.get("verdict") or "")
    return {"stage": name, "status": s.get("status"), "time": _secs(s.get("duration_s")),
            "share": _secs(s.get("share_s")), "numbers": numbers, "did": did}


def tell(d: Mapping[str, Any]) -> dict[str, Any]:
    """The story of an optimize result (``OptimizeResult.to_dict()``), as plain sentences."""
    metric = str(d.get("objective", "metric")).split(":")[0]
    vs: Mapping[str, Any] = d.get("vs_baseline") or {}
    final: Mapping[str, Any] = d.get("final") or {}
    stages = {str(s.get("name")): s for s in d.get("stages") or []}
    compress: Mapping[str, Any] = (stages.get("compress") or {}).get("outputs") or {}
    cmp = vs.get("leader_vs_defaults") or {}
    val, test = cmp.get("val") or {}, cmp.get("test") or {}
    adopted = vs.get("decision") == "chosen"
    dv, fv = vs.get("defaults") or {}, vs.get("final") or {}
    seeds = len(final.get("seeds") or [])
    if adopted:
        decision = f"adopted {vs.get('leader')}: better than the task's defaults beyond noise"
    elif vs.get("leader"):
        decision = f"kept the task's defaults: the search's best ({vs.get('leader')}) is not better beyond noise"
    else:
        decision = "kept the task's defaults: no searched configuration reached the final race"
    held = vs.get("held_out") or {}
    lines: list[tuple[str, str]] = [  # (the question a newcomer asks, the answer)
        ("did it help", ("yes, beyond noise: " if adopted else "no, not beyond noise: ") + _noise(val, metric)),
        (f"{metric}, validation", f"defaults {_pm(dv.get('val'))} -> result {_pm(fv.get('val'))} "
                                  f"({seeds} paired seed(s); selection on {held.get('val_samples') or '-'} samples)"),
        (f"{metric}, held out", f"defaults {_pm(dv.get('test'))} -> result {_pm(fv.get('test'))}"
                                + (f": gain {_signed(test.get('gain'))}, "
                                   + ("beyond noise there too" if test.get("beyond_noise") else "within noise there")
                                   if adopted and _f(test.get("gain")) is not None else "")
                                + f" ({vs.get('held_out_source') or '-'})"),
        ("what changed", _changed(final.get("changes") or [])),
    ]
    if not adopted and vs.get("leader_changes"):
        lines.append(("proposed, not adopted", _changed(vs["leader_changes"])))
    gap = vs.get("search_gap") or {}
    if _f(gap.get("gap")) is not None:
        lines.append(("search -> final", f"the search measured {gap.get('arm')} at {fmt(gap.get('search_mean'))} "
                                         f"({gap.get('search_n')} trial(s)); the final seeds {fmt(gap.get('final_mean'))} "
                                         f"({_signed(gap.get('gap'))})"))
    lines.append(("compressed model faster", _compression(final, vs, compress)))
    budget, used = _f(d.get("budget_s")), _f(d.get("elapsed_s"))
    lines.append(("time", f"{_secs(used)} of the {_secs(budget)} budget"
                          + (f" ({used / budget:.0%})" if used is not None and budget else "")))
    lines.append(("stopped", rounded(d.get("stop_reason") or "-")))
    headline = (f"{metric} {fmt(dv.get('val', {}).get('mean'))} (defaults) -> {_pm(fv.get('val'))} "
                f"(result, {seeds} seed(s)); {decision}")
    notes = [f"final race: {vs['race_note']}"] if vs.get("race_note") else []
    notes += [f"yellow flag: {f.get('cause')} in {f.get('region')}: {f.get('action')}" for f in d.get("flags") or []]
    notes += [f"warning {w.get('cause')}: {w.get('summary')} (fix: {w.get('fix')})" for w in d.get("warnings") or []]
    notes += [f"layer {f.get('layer')}: {f.get('finding')}; {f.get('action')}" for f in d.get("layer_findings") or []]
    return {"headline": headline, "decision": decision, "adopted": adopted, "notes": [rounded(n) for n in notes],
            "lines": [{"label": q, "text": a} for q, a in lines],
            "stages": [_stage_row(s, d) for s in d.get("stages") or []]}
