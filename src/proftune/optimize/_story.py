"""The result told in sentences a newcomer reads: what changed, whether it helped beyond noise,
whether the compressed model is faster, how the time went and why the run stopped.

One home for these sentences: the terminal summary and the HTML report both print what
:func:`tell` put in the result (``story``), from the result's own numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._jsonsafe import finite_float as _f
from .._optimizers import DEFAULT_LR
from .._units import format_bytes, format_ms, format_seconds
from ._decide import ALPHA
from ._numbers import fmt, method_name, rounded
from ._records import (
    BaselineOutputs,
    CompressOutputs,
    ComputeOutputs,
    FinalOutputs,
    HealthOutputs,
    LayerValueOutputs,
    SearchStageOutputs,
)
from ._result_records import FinalSummary, OptimizeResult, StageRow, StageStory, Story, StoryLine, VsBaseline

if TYPE_CHECKING:
    from ._changes import ParamChange
    from ._decide import Comparison
    from ._final_records import SeedSummary

__all__ = ["StageStory", "Story", "StoryLine", "fmt", "method_name", "rounded", "tell"]


def _signed(v: Any, digits: int = 2) -> str:
    f = _f(v)
    return "-" if f is None else f"{f:+.{digits}g}"


def _pm(s: SeedSummary | None) -> str:
    """``0.887 ± 0.012`` of a summary (mean, std, n)."""
    if s is None or _f(s.mean) is None:
        return "-"
    std = _f(s.std)
    return f"{fmt(s.mean)} ± {fmt(std, 2)}" if std is not None else fmt(s.mean)


def _times(new: Any, old: Any) -> tuple[float | None, str]:
    """(old / new, "1.99x faster" / "1.05x slower") for two latencies."""
    a, b = _f(new), _f(old)
    if a is None or b is None or a <= 0:
        return None, ""
    r = b / a
    return r, (f"{r:.2f}x faster" if r >= 1 else f"{1 / r:.2f}x slower")


def bound_level(level: float) -> str:
    """The one stated confidence of a race's lower bound: 95% for the race, however many tests
    share its error (each bound is one-sided at ``level``, ``ALPHA`` split among the tests)."""
    tests = max(1, round(ALPHA / max(1.0 - level, 1e-12)))
    if tests == 1:
        return f"the {1 - ALPHA:.0%} lower bound"
    return f"the lower bound ({1 - ALPHA:.0%} for the race: {level:.1%} one-sided for each of its {tests} tests)"


def _noise(cmp: Comparison | None, metric: str) -> str:
    """A paired comparison in one sentence: the gain, its spread, the bound and what it means."""
    if cmp is None:
        return "no paired comparison (no searched configuration reached the final race)"
    # the decision names its bound at each test's own level; said once, at the race's
    reason = rounded(cmp.reason.replace(f"the {cmp.level:.0%} lower bound", bound_level(cmp.level)))
    for said in ("beyond noise: ", "within noise: "):  # the answer says it already
        reason = reason[len(said):] if reason.startswith(said) else reason
    if _f(cmp.gain) is None:
        return reason or "no comparison"
    std = f" ± {fmt(cmp.gain_std, 2)}" if _f(cmp.gain_std) is not None else ""
    return f"{metric} gain {_signed(cmp.gain)}{std} over {len(cmp.seeds)} paired seed(s); {reason}"


def _defaults_finding(w: Any, changes: Sequence[Any]) -> str:
    """A health finding of the defaults' training, labelled as theirs; where the adopted result
    changed the param it is about (``lr`` for ``lr_too_high``), the change, so that it is not read
    as a finding about the result."""
    text = f"warning about the defaults' training: {w.cause}: {w.summary} (fix: {w.fix})"
    about = [c for c in changes if c.changed and c.param in str(w.cause).split("_")]
    if about:
        text += ("; the result changed " + ", ".join(f"{c.param} {fmt(c.default)} -> {fmt(c.value)}" for c in about)
                 + ": the finding is the defaults', not the result's")
    return text


def _compression(final: FinalSummary, vs: VsBaseline, compress: CompressOutputs) -> str:
    """Is the compressed model faster, at batch 1 and at the task's batch, and what it costs."""
    c = final.compressed
    bs = final.batch_size
    if c is not None:
        r1, w1 = _times(c.latency_ms, final.latency_ms)
        rb, wb = _times(c.latency_batch_ms, final.latency_batch_ms)
        parts = [f"yes: {method_name(c)} runs {w1} at batch 1 ({format_ms(final.latency_ms)} -> "
                 f"{format_ms(c.latency_ms)})" if r1 else f"{method_name(c)}: no latency at batch 1"]
        if rb:
            parts.append(f"{wb} at batch {bs} ({format_ms(final.latency_batch_ms)} -> {format_ms(c.latency_batch_ms)})")
        sz_new = _f(c.size_bytes)
        sz_old = _f((compress.baseline.size_bytes if compress.baseline else None) or final.size_bytes)
        if sz_new and sz_old:
            ratio = sz_old / sz_new
            parts.append(f"size {format_bytes(sz_old)} -> {format_bytes(sz_new)} "
                         + (f"({ratio:.2f}x smaller)" if ratio >= 1 else f"({1 / ratio:.2f}x larger)"))
        drop = _f(c.metric_drop)
        parts.append(f"{vs.metric or 'metric'} {fmt(c.metric)} on validation"
                     + (f" ({fmt(drop, 2)} below the uncompressed model)" if drop and drop > 0 else
                        f" ({fmt(-drop, 2)} above the uncompressed model: its fine-tuning trained it further)"
                        if drop else " (no drop)")
                     + (f", {fmt(c.test_metric)} held out" if _f(c.test_metric) is not None else ""))
        return "; ".join(parts)
    if compress.skipped:
        return f"not tried: {rounded(compress.skipped)}"
    cands = [x for x in compress.candidates if x.within_budget]
    best = min(cands, key=lambda x: _f(x.latency_ms) or math.inf, default=None)
    verdict = rounded(vs.compression or "kept the uncompressed model")
    if best is None:
        return f"no: {verdict}"
    r1, w1 = _times(best.latency_ms, final.latency_ms)
    rb, wb = _times(best.latency_batch_ms, final.latency_batch_ms)
    return (f"no: kept the uncompressed model; the fastest candidate within the accuracy budget, "
            f"{method_name(best)}, runs {w1 or '-'} at batch 1 ({format_ms(final.latency_ms)} -> "
            f"{format_ms(best.latency_ms)})"
            + (f" and {wb} at batch {bs} ({format_ms(final.latency_batch_ms)} -> "
               f"{format_ms(best.latency_batch_ms)})" if rb else "")
            )


def _region(region: Mapping[str, Any]) -> str:
    """A paused region as people read it: ``lr 0.0869 to 1, optimizer in [sgd]``."""
    def bound(b: Any) -> str:
        if isinstance(b, Mapping) and "in" in b:
            return f"in {fmt(b['in'])}"
        if isinstance(b, Mapping) and {"low", "high"} <= set(b):
            return f"{fmt(b['low'])} to {fmt(b['high'])}"
        return fmt(b)

    return ", ".join(f"{name} {bound(b)}" for name, b in region.items()) or "the whole space"


def _changed(rows: Sequence[ParamChange]) -> str:
    moved = [r for r in rows if r.changed]
    if not moved:
        return "nothing: the result is the task's defaults"
    return ", ".join(f"{r.param} {fmt(r.default)} -> {fmt(r.value)} ({r.source})" for r in moved)


#: Where the result's lr came from, as people say it.
_LR_SOURCE = {"default": "the defaults' lr", "computed": "the computed lr", "searched": "found by the search",
              "fixed": "fixed"}


def _lr_line(result: OptimizeResult) -> str | None:
    """One line that says why the result's lr is or is not the range test's (what `lr-find` and
    `recommend` print): the test's rate, the short check's verdict, and where the result's came from."""
    row = result.stage("compute")
    change = next((c for c in result.final.changes if c.param == "lr"), None)
    if row is None and change is None:
        return None
    parts: list[str] = []
    if row is not None:
        comp = row.record(ComputeOutputs)
        rec = next((r for r in comp.recommendations if r.get("name") == "lr"), None)
        steps = comp.steps.get("lr_range_test")
        test = f"the range test of `lr-find` and `recommend` ({steps} steps here, 100 there)"
        if comp.not_measured is not None:
            parts.append(f"no range test ran: {comp.not_measured}")
        elif rec is not None and rec.get("value") is not None:
            parts.append(f"{test} computed {fmt(rec['value'])} at batch {comp.computed.batch_size or '-'}")
        elif rec is not None:
            parts.append(f"{test} computed none")
        check = comp.lr_check
        if check is not None and not check.used:
            parts.append(f"a {check.seconds:.0f} s check trained no better with it than with the defaults' "
                         f"{fmt(check.default_lr)}, so the search centred on the defaults'")
    if change is not None:
        parts.append(f"the result trains at {fmt(change.value)} ({_LR_SOURCE.get(change.source, change.source)}"
                     + (f": {change.why}" if change.source == "searched" and change.why else "") + ")")
    return "; ".join(parts)


def _stage_row(s: StageRow, final: FinalSummary) -> StageStory:
    """A stage: what its two numbers are, labelled, and what it did, in a few words."""
    before, after = s.metric_before, s.metric_after
    numbers, did = "", ""
    if s.name == "baseline":
        b = s.record(BaselineOutputs)
        numbers = (f"no tricks {fmt(before)} -> defaults {fmt(after)}" if before is not None
                   else f"defaults {fmt(after)}")
        did = (f"trained the defaults ({b.defaults.epochs} epoch(s), with the health checks) beside a no-tricks "
               f"run (AdamW lr {fmt(DEFAULT_LR)}, no regularisation); spread {fmt(b.spread, 2)}"
               if before is not None else
               f"trained the defaults ({b.defaults.epochs} epoch(s), with the health checks); the no-tricks run "
               f"(AdamW lr {fmt(DEFAULT_LR)}) was {b.no_tricks.stop_reason or 'not compared'}")
    elif s.name == "health":
        h = s.record(HealthOutputs)
        did = (f"{len(h.errors)} error(s), {len(h.warnings)} warning(s) in the baseline's training"
               + ("; ignored (--ignore-findings)" if h.ignored else "")
               + (f"; went on: the search tunes what {', '.join(h.searched)} is about" if h.searched else "")
               + f"; profiled the step: {format_ms(h.step_time_ms)}, peak {format_bytes(h.peak_memory_bytes)}, "
               f"{fmt(h.params)} params")
    elif s.name == "compute":
        computed = s.record(ComputeOutputs)
        did = ("computed " + (fmt(computed.computed.to_dict()) or "nothing") if computed.not_measured is None
               else f"measured nothing: {computed.not_measured}")
        did += f"; lr check: {rounded(computed.lr_check.describe())}" if computed.lr_check is not None else ""
    elif s.name == "layer_value":
        lv = s.record(LayerValueOutputs)
        found = lv.findings
        did = (f"{len(found)} layer(s) cost far more time than they are worth: "
               + ", ".join(f.layer for f in found)) if found else "no layer costs far more time than it is worth"
        unmeasured = [x.name for x in lv.layers if not x.measured]
        did += f"; not measured (their outputs could not be replaced): {', '.join(unmeasured)}" if unmeasured else ""
        essential = [x.name for x in lv.layers if x.essential]
        did += f"; the model cannot work without {', '.join(essential)}: kept whole" if essential else ""
    elif s.name == "search":
        srch = s.record(SearchStageOutputs)
        numbers = f"best {fmt(after)}" + (f" (defaults {fmt(before)})" if before is not None else "")
        did = (f"{srch.trials} trial(s) of {srch.epochs_per_trial} epoch(s) ("
               + ", ".join(f"{k} {v}" for k, v in srch.arms.items()) + f"); {rounded(srch.stop_reason)}")
    elif s.name == "final":
        fin = s.record(FinalOutputs)
        numbers = f"defaults {fmt(before)} -> result {fmt(after)}"
        did = f"raced the defaults and the search's best over {len(final.seeds)} paired seed(s): " + (
            f"adopted {fin.chosen}" if fin.decision == "chosen" else "kept the defaults")
    elif s.name == "compress":
        comp = s.record(CompressOutputs)
        if comp.skipped:
            did = f"skipped: {rounded(comp.skipped)}"
        else:
            numbers = (f"uncompressed {fmt(before)} -> compressed {fmt(after)}" if after is not None
                       else f"uncompressed {fmt(before)}, kept")
            did = rounded(comp.verdict or "")
    return StageStory(stage=s.name, status=s.status, time=format_seconds(s.duration_s), share=format_seconds(s.share_s),
                      numbers=numbers, did=did)


def tell(result: OptimizeResult) -> Story:
    """The story of an optimize result, as plain sentences (its own ``story`` is not read)."""
    metric = result.metric
    vs, final = result.vs_baseline, result.final
    row = result.stage("compress")
    compress = row.record(CompressOutputs) if row is not None else CompressOutputs()
    val, test = vs.leader_vs_defaults.val, vs.leader_vs_defaults.test
    adopted = vs.adopted
    dv, fv = vs.defaults, vs.final
    seeds = len(final.seeds)
    if vs.decision == "shorter":
        decision = (f"adopted {vs.leader}: the task's defaults' {metric} (within one validation sample) "
                    f"in {final.epochs} of their {final.default_epochs} epochs, a time gain")
    elif adopted and val is not None and not val.beyond_noise:
        decision = (f"adopted {vs.leader}: ahead of the task's defaults, and not behind them beyond one "
                    "validation figure's noise")
    elif adopted:
        decision = f"adopted {vs.leader}: better than the task's defaults beyond noise"
    elif vs.leader:
        decision = f"kept the task's defaults: the search's best ({vs.leader}) is not better beyond noise"
    else:
        decision = "kept the task's defaults: no searched configuration reached the final race"
    held = vs.held_out
    lines: list[tuple[str, str]] = [  # (the question a newcomer asks, the answer)
        ("did it help", ("the same result in less training time: " if vs.decision == "shorter" else
                         "yes, beyond noise: " if adopted and (val is None or val.beyond_noise) else
                         "ahead, within noise (a loss beyond one validation figure's noise ruled out): " if adopted
                         else "no, not beyond noise: ") + _noise(val, metric)),
        (f"{metric}, validation", f"defaults {_pm(dv.val)} -> result {_pm(fv.val)} "
                                  f"({seeds} paired seed(s); selection on {(held.val_samples if held else None) or '-'}"
                                  " samples)"),
        (f"{metric}, held out", f"defaults {_pm(dv.test)} -> result {_pm(fv.test)}"
                                + (f": gain {_signed(test.gain)}, "
                                   + ("beyond noise there too" if test.beyond_noise else "within noise there")
                                   if adopted and test is not None and _f(test.gain) is not None else "")
                                + f" ({rounded(vs.held_out_source or '-')})"),
        ("what changed", _changed(final.changes)),
    ]
    if not adopted and vs.leader_changes:
        lines.append(("proposed, not adopted", _changed(vs.leader_changes)))
    lr = _lr_line(result)
    if lr:
        lines.append(("lr", rounded(lr)))
    gap = vs.search_gap
    if gap is not None and _f(gap.gap) is not None:
        lines.append(("search -> final", f"the search measured {gap.arm} at {fmt(gap.search_mean)} "
                                         f"({gap.search_n} trial(s)); the final seeds {fmt(gap.final_mean)} "
                                         f"({_signed(gap.gap)})"))
    lines.append(("compressed model faster", _compression(final, vs, compress)))
    budget, used = _f(result.budget_s), _f(result.elapsed_s)
    lines.append(("time", f"{format_seconds(used)} of the {format_seconds(budget)} budget"
                          + (f" ({used / budget:.0%})" if used is not None and budget else "")))
    lines.append(("stopped", rounded(result.stop_reason or "-")))
    headline = (f"{metric} {fmt(dv.val.mean)} (defaults) -> {_pm(fv.val)} "
                f"(result, {seeds} seed(s)); {decision}")
    # the health checks ran on the defaults' training: said as theirs, before what the result did
    notes = [_defaults_finding(w, final.changes if adopted else []) for w in result.warnings]
    notes += [f"final race: {vs.race_note}"] if vs.race_note else []
    notes += [f"yellow flag: {f.cause} in {_region(f.region)}: {f.action}" for f in result.flags]
    notes += [f"layer {f.layer}: {f.finding}; {f.action}" for f in result.layer_findings]
    return Story(headline=headline, decision=decision, adopted=adopted, notes=[rounded(n) for n in notes],
                 lines=[StoryLine(label=q, text=a) for q, a in lines],
                 stages=[_stage_row(s, final) for s in result.stages])
