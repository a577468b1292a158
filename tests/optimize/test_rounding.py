"""Every figure ``proftune optimize`` prints is rounded, on every path the loop can take (issue 48).

A quiet machine takes one path; a loaded one another stop reason, another note. Each path here
is built by the code that builds it in a run, with the timings and measurements injected (a fake
clock, fake trainings, long floats such as ``0.0868511373751352``): no sleeps, no real training.
The result is told (:func:`tell`) and printed as the CLI prints it piped, and read with the
regex of ``tests/cli/test_optimize_cli.py::test_piped_it_is_plain_whole_and_rounded``.
"""

from __future__ import annotations

import dataclasses
import io
import re
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from proftune.cli import _optimize as cli
from proftune.compress import Candidate
from proftune.compress._pipeline import choose
from proftune.diagnose import Finding
from proftune.optimize import (
    CompressedModel,
    CompressOutputs,
    ComputeOutputs,
    FinalOutputs,
    FinalSummary,
    LayerFinding,
    ModelFigures,
    OptimizeResult,
    SearchStageOutputs,
    SplitComparisons,
    SplitSummaries,
    StageRow,
    VsBaseline,
    YellowFlag,
    _final,
    _search,
    build_plan,
    find_flags,
)
from proftune.optimize._api import _Loop
from proftune.optimize._budget_plan import BudgetPlan
from proftune.optimize._computed import ComputedValues, OptimizerChoice
from proftune.optimize._decide import Comparison, compare_paired
from proftune.optimize._final import Arm, ArmRun, FinalOutcome, FinalPlan, run_final
from proftune.optimize._search import StageSettings, run_search_stage
from proftune.optimize._search_records import enqueued
from proftune.optimize._story import rounded, tell
from proftune.search import TrialRecord, load_space

from .tasks import StepClock, TinyTask

#: A float as ``str()`` writes it: what the issue found in the piped output.
LONG = 0.0868511373751352
#: The CLI test's reading of "rounded": no decimal with more than three significant digits.
_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+")


def _unrounded(text: str) -> list[str]:
    return [x for x in _DECIMAL.findall(text) if len(x.replace(".", "").lstrip("0")) > 3]


def _printed(result: OptimizeResult, monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``proftune optimize`` prints of ``result`` when piped: its story, rendered by the CLI."""
    told = dataclasses.replace(result, story=tell(result))
    console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    monkeypatch.setattr(cli, "out_console", console)
    cli._render(told.to_dict())
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


FINAL = FinalSummary(seeds=[100, 101], latency_ms=LONG, latency_batch_ms=1.0868511373751352, batch_size=32,
                     model_val=0.9868511373751352, model_test=0.8968511373751352)


def _result(*, stages: tuple[StageRow, ...] = (), stop_reason: str = "the budget is spent",
            final: FinalSummary = FINAL, **kw: Any) -> OptimizeResult:
    return OptimizeResult(task="t", study="s", run_id=1, out="o", objective="accuracy:max", budget_s=60.0,
                          elapsed_s=59.0868511373751352, stop_reason=stop_reason, stages=list(stages), final=final,
                          **kw)


def _row(name: str, record: Any) -> StageRow:
    return StageRow(name=name, status="finished", duration_s=12.0868511373751352, share_s=13.0868511373751352,
                    metric_before=0.8868511373751352, metric_after=0.9068511373751352, outputs=record.to_dict())


# -- the search stage: each way it stops, from run_search_stage with a fake clock and fake trials
def _plan() -> Any:
    space = load_space({"params": {"lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
                                   "hidden": {"type": "int", "low": 4, "high": 32}}})
    return build_plan(TinyTask(), {"lr": 0.01}, user_space=space.to_dict(), max_batch=None, samples=None)


def _trial(n: int, params: dict[str, Any], value: float | None, state: str = "complete",
           reason: str | None = None) -> TrialRecord:
    return TrialRecord(number=n, state=state, params=dict(params), values=[value] if value is not None else None,
                       metrics={"accuracy": value} if value is not None else {}, constraints={}, reason=reason,
                       duration_s=LONG, steps=10, tags={"arm": "tpe"})


def _search_stop(monkeypatch: pytest.MonkeyPatch, *, step: float, max_trials: int = 500,
                 stall: bool = False, exhausted: bool = False) -> tuple[str, bool]:
    """The search stage's stop reason and whether it ended early, with every trial faked."""
    rows: list[TrialRecord] = []

    def fake_call(task: Any, plan: Any, settings: Any, *, store: Any, trials: int, timeout: float | None,
                  items: Any) -> Any:
        for item in items:  # a plateau, each trial 1.23e-5 better: below min_delta
            rows.append(_trial(len(rows), item.params, 0.9012345678901 + 1.2345678901e-5 * len(rows)))
        return SimpleNamespace(trials=list(rows))

    clock = StepClock(step)
    monkeypatch.setattr(_search, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(_search, "_call", fake_call)
    monkeypatch.setattr(_search, "study_trials", lambda study, *, store: [])
    monkeypatch.setattr(_search, "cancel_waiting", lambda study, *, store, reason: [])
    monkeypatch.setattr(_search, "STALL_AFTER", 0.0 if stall else 2.0)
    if exhausted:
        monkeypatch.setattr(_search, "propose", lambda *a, **k: [])
    else:  # fresh configurations without Optuna: the clock, not the sampler, is under test
        monkeypatch.setattr(_search, "propose", lambda rows_, plan, settings, flags, n: [
            enqueued("tpe", {"lr": 0.001 * (1 + len(rows_) + i) * 1.0868511373751352, "hidden": 8}) for i in range(n)])
    settings = StageSettings(objective="accuracy:max", metric="accuracy", maximize=True, patience=3,
                             min_delta=0.0012345678901, max_trials=max_trials, defaults={"lr": 0.01},
                             trial_s_estimate=LONG)
    out = run_search_stage(TinyTask(), _plan(), settings, store=None, seconds=30.0868511373751352)  # type: ignore[arg-type]
    return out.stop_reason, out.early


SEARCH_STOPS: dict[str, dict[str, Any]] = {
    "auto-stop": {"step": 0.01, "stall": True},
    "max_trials": {"step": 0.01, "max_trials": 4},
    "every configuration left is in a paused region": {"step": 0.01, "exhausted": True},
    "the search stage's share of the budget is spent": {"step": 7.0868511373751352},
}


def _loop_stop(srch: SearchStageOutputs, *, elapsed_s: float, budget_s: float) -> str:
    """The run's stop reason as the loop says it (``_Loop._stop_reason``), the race faked."""
    plan = FinalPlan(metric="accuracy", maximize=True, epochs=10, seeds=3, seed=0, device="cpu", val_samples=200)
    race = FinalOutcome(plan=plan, arms=[], seeds=[100, 101], decision="defaults", chosen="defaults",
                        leader=None, comparison=None, comparison_test=None, model_seed=None, note="")
    records = {SearchStageOutputs: srch, FinalOutputs: FinalOutputs(race=race)}
    loop = SimpleNamespace(state=SimpleNamespace(record=records.__getitem__),
                           budget=SimpleNamespace(elapsed_s=elapsed_s), v=SimpleNamespace(budget_s=budget_s))
    return _Loop._stop_reason(loop)  # type: ignore[arg-type]


@pytest.mark.parametrize("elapsed_s", [20.0868511373751352, 59.0868511373751352], ids=["finished", "spent"])
@pytest.mark.parametrize("stop", list(SEARCH_STOPS))
def test_each_search_stop_reason_is_printed_rounded(monkeypatch: pytest.MonkeyPatch, stop: str,
                                                    elapsed_s: float) -> None:
    reason, early = _search_stop(monkeypatch, **SEARCH_STOPS[stop])
    assert reason.startswith(stop)
    srch = SearchStageOutputs(stop_reason=reason, early=early, trials=4, epochs_per_trial=1, arms={"tpe": 4})
    said = _loop_stop(srch, elapsed_s=elapsed_s, budget_s=60.0868511373751352)
    text = _printed(_result(stages=(_row("search", srch),), stop_reason=said), monkeypatch)
    assert stop in text  # the path under test reached the output, in the stage's row and the stop line
    assert not _unrounded(text), _unrounded(text)


# -- the final race: each note it writes, from run_final with fake trainings -------------------
def _race(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, values: Callable[[str, int], float], *,
          end: float, hard_end: float | None = None, cap_end: float | None = None, challengers: int = 1,
          shorter: bool = False, cut: Callable[[int], bool] = lambda seed: False) -> FinalOutcome:
    def fake_train(task: Any, arm: Arm, *, plan: FinalPlan, seed: int, limit_s: float, store: Any,
                   folder: Path) -> ArmRun:
        (folder / f"{_final._slug(arm.name)}-{seed}.pt").write_bytes(b"weights")
        v = values(arm.name, seed)
        return ArmRun(seed=seed, run_id=None, val=v, test=v - LONG / 10, epochs=int(arm.epochs or plan.epochs),
                      duration_s=LONG, cut=cut(seed))

    monkeypatch.setattr(_final, "_train", fake_train)
    defaults = Arm(name="defaults", params={"lr": 1e-3}, source="defaults", epoch_s=LONG, epochs=10)
    others = [Arm(name=f"search #{i + 1}", params={"lr": 3e-3 * (i + 1)}, source="search", epoch_s=LONG, epochs=10)
              for i in range(challengers)]
    short = Arm(name="search #1 at 2 epochs", params={"lr": 3e-3}, source="search", epoch_s=LONG, epochs=2)
    plan = FinalPlan(metric="accuracy", maximize=True, epochs=10, seeds=3, seed=0, device="cpu", val_samples=200,
                     prior_std=0.0123456789)
    return run_final(None, defaults, others, plan, store=None, end=end, hard_end=hard_end,  # type: ignore[arg-type]
                     cap_end=cap_end, folder=tmp_path, shorter=short if shorter else None)


def _noisy(name: str, seed: int) -> float:
    """A validation metric per arm and seed: long floats, the challengers a little ahead."""
    bump = 0.0 if name == "defaults" else 0.0034567891234 * (1 + len(name) % 3)
    return 0.8868511373751352 + bump + 0.0012345678901 * (seed % 3)


def _same(name: str, seed: int) -> float:
    return 0.9012345678901 + 0.0001234567891 * (seed % 2)


RACES: dict[str, tuple[str, Callable[[float], dict[str, Any]]]] = {
    # the machine is slower than planned: challengers leave, the rounds stop, the reference runs over
    "left the race": ("left the race after 0 seed(s)", lambda now: {
        "values": _noisy, "end": now - 1.0868511373751352, "hard_end": now - 1.0868511373751352,
        "cap_end": now - 12.0868511373751352, "challengers": 3}),
    "stopped after": ("stopped after 1 seed(s) of 3", lambda now: {
        "values": _noisy, "end": now - 1.0868511373751352, "hard_end": now - 1.0868511373751352, "challengers": 3}),
    "ran past the budget": ("s past the budget's end", lambda now: {
        "values": _noisy, "end": now - 1.0868511373751352, "hard_end": now - 1.0868511373751352,
        "cap_end": now - 12.0868511373751352}),
    # time left over: an extra round, cut by the clock, is dropped
    "extra round dropped": ("was dropped: a run of it was cut", lambda now: {
        "values": _noisy, "end": now + 3600.0868511373751352, "cut": lambda seed: seed >= 103}),
    "shorter adopted": ("reached the defaults' accuracy", lambda now: {
        "values": _same, "end": now + 3600.0, "shorter": True, "cut": lambda seed: False}),
    "shorter not adopted": ("did not reach the defaults' accuracy", lambda now: {
        "values": lambda name, seed: _same(name, seed) - (0.0234567891234 if "at 2" in name else 0.0),
        "end": now + 3600.0, "shorter": True}),
}


@pytest.mark.parametrize("race", list(RACES))
def test_each_note_of_the_final_race_is_printed_rounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       race: str) -> None:
    marker, kw = RACES[race]
    out = _race(monkeypatch, tmp_path, **kw(time.monotonic()))
    assert marker in out.note, out.note
    d_val, leader = out.arm("defaults").summary("val"), out.arm(out.chosen).summary("val")
    vs = VsBaseline(metric="accuracy", decision=out.decision, leader=out.leader, race_note=out.note,
                    defaults=SplitSummaries(val=d_val, test=out.arm("defaults").summary("test")),
                    final=SplitSummaries(val=leader, test=out.arm(out.chosen).summary("test")),
                    leader_vs_defaults=SplitComparisons(val=out.comparison, test=out.comparison_test))
    text = _printed(_result(vs_baseline=vs), monkeypatch)
    assert marker in text
    assert not _unrounded(text), _unrounded(text)


# -- the paired comparison: each of its verdicts ------------------------------------------------
COMPARISONS: dict[str, dict[str, Any]] = {
    "not a gain": {"chosen": [0.8812345678901, 0.8798765432101], "defaults": [0.8868511373751352] * 2},
    "below the metric's resolution": {"chosen": [0.8868611373751352, 0.8868711373751352],
                                      "defaults": [0.8868511373751352] * 2, "resolution": 0.0051234567891},
    "one seed cannot separate": {"chosen": [0.9123456789012], "defaults": [0.8868511373751352]},
    "against the seeds' noise": {"chosen": [0.9123456789012, 0.9134567890123], "defaults": [0.8868511373751352] * 2,
                                 "prior_std": 0.0123456789012},
    "beyond noise": {"chosen": [0.9123456789012, 0.9134567890123, 0.9145678901234],
                     "defaults": [0.8868511373751352, 0.8879622484862, 0.8890733595973]},
    "within noise": {"chosen": [0.9123456789012, 0.8734567890123, 0.9045678901234],
                     "defaults": [0.8868511373751352, 0.8879622484862, 0.8890733595973]},
}


@pytest.mark.parametrize("verdict", list(COMPARISONS))
def test_each_verdict_of_the_paired_comparison_is_printed_rounded(monkeypatch: pytest.MonkeyPatch,
                                                                 verdict: str) -> None:
    kw = COMPARISONS[verdict]
    cmp: Comparison = compare_paired(kw["chosen"], kw["defaults"], seeds=list(range(len(kw["chosen"]))),
                                     metric="accuracy", maximize=True, resolution=kw.get("resolution", 0.0),
                                     prior_std=kw.get("prior_std"))
    assert verdict in cmp.describe()
    vs = VsBaseline(metric="accuracy", decision="chosen" if cmp.beyond_noise else "defaults", leader="search #1",
                    leader_vs_defaults=SplitComparisons(val=cmp, test=cmp), summary=cmp.describe(),
                    race_note=f"search #2 did not reach the defaults' accuracy ({cmp.describe()}): not adopted")
    text = _printed(_result(vs_baseline=vs), monkeypatch)
    assert verdict in text
    assert not _unrounded(text), _unrounded(text)


# -- compression: each verdict and note ---------------------------------------------------------
def _candidate(method: str, metric: float, latency_ms: float) -> Candidate:
    return Candidate(method=method, ratio=0.5 if "structured" in method else 0.0, metric=metric, metric_drop=0.0,
                     params=1000, macs=2000, size_bytes=12345, latency_ms=latency_ms,
                     latency_batch_ms=latency_ms * 7.0868511373751352, batch_size=32)


def _kept(notes: list[str]) -> CompressOutputs:
    """The compress stage's record where no candidate is kept: its verdict as the stage writes it."""
    kept = "kept the uncompressed model: "
    verdict = kept + "; ".join(n[len(kept):] if n.startswith(kept) else n for n in notes)
    return CompressOutputs(notes=notes, verdict=verdict)


def _compress(path: str) -> CompressOutputs:
    base = _candidate("baseline", 0.9068511373751352, LONG)
    if path == "no candidate within the drop":
        _, notes = choose([base, _candidate("structured", 0.7068511373751352, LONG / 2)], goal="latency",
                          metric="accuracy", max_drop=0.0123456789012, metric_up=True, goal_up=False)
        return _kept(notes)
    if path == "not better on the goal":
        _, notes = choose([base, _candidate("dynamic", 0.9068511373751352, LONG * 1.0123456789)], goal="latency",
                          metric="accuracy", max_drop=0.0123456789012, metric_up=True, goal_up=False)
        return _kept(notes)
    if path == "compression failed":
        why = f"RuntimeError: the deadline passed {LONG}s into the sweep (at {LONG * 100}.)"
        return CompressOutputs(skipped=f"compression failed ({why})",
                               verdict=f"kept the uncompressed model: compression failed ({why})")
    if path == "skipped for time":
        return CompressOutputs(skipped=f"{LONG:.1f} s left for compression, below the 20 s one pruning + INT8 "
                                       "sweep needs here; give a larger --budget")
    assert path == "compressed"
    sel = ModelFigures(method="structured+dynamic", ratio=0.5, metric=0.8968511373751352, metric_drop=LONG / 10,
                       latency_ms=LONG / 3, latency_batch_ms=0.5868511373751352, size_bytes=4321,
                       test_metric=0.8868511373751352)
    return CompressOutputs(selected=sel, baseline=ModelFigures(method="baseline", size_bytes=12345),
                           notes=[f"backend fbgemm chosen: fastest at batch 32 on cpu (fbgemm {LONG:.3f} ms)"],
                           verdict=f"structured pruning 50% + dynamic INT8 beats the uncompressed model on latency: "
                                   f"{LONG / 3:.4g} ms vs {LONG:.4g} ms at batch 1")


@pytest.mark.parametrize("path", ["no candidate within the drop", "not better on the goal", "compression failed",
                                  "skipped for time", "compressed"])
def test_each_compression_verdict_is_printed_rounded(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    comp = _compress(path)
    final = FINAL if comp.selected is None else dataclasses.replace(FINAL, compressed=_compressed(comp.selected))
    vs = VsBaseline(metric="accuracy", compression=comp.verdict or comp.skipped)
    text = _printed(_result(stages=(_row("compress", comp),), vs_baseline=vs, final=final), monkeypatch)
    assert "compressed model faster" in text
    assert not _unrounded(text), _unrounded(text)


def _compressed(sel: ModelFigures) -> CompressedModel:
    return CompressedModel(**{f.name: getattr(sel, f.name) for f in dataclasses.fields(ModelFigures)},
                           model="model_compressed.pt")


# -- what the stages before found: the computed values, flags, warnings, layers -----------------
def _flags() -> list[YellowFlag]:
    """A region found by find_flags where trials at long-float rates failed (nan)."""
    rows = [_trial(0, {"lr": 0.0012345678901, "hidden": 8}, 0.9068511373751352),
            *(_trial(i, {"lr": lr, "hidden": 8 + i}, None, state="pruned", reason="non-finite values: nan_loss")
              for i, lr in enumerate([LONG, 0.1868511373751352, 0.2868511373751352], start=1))]
    found = find_flags(rows, _plan(), flag_min=3)
    assert found
    # and one as a small rate writes itself: 3.4567891234e-05
    return [*found, YellowFlag(cause="oom", trials=[4, 5, 6], region={"lr": {"low": 3.4567891234e-05,
                                                                            "high": 1.0868511373751352e-4}},
                               evidence=[])]


FOUND: dict[str, Callable[[], dict[str, Any]]] = {
    # the optimizer row measured SGD better (on a loaded machine: another share of steps); its rate
    "optimizer alternative": lambda: {"stages": (_row("compute", ComputeOutputs(computed=ComputedValues(
        batch_size=64, lr=0.0012345678901, optimizer_alternative=OptimizerChoice(optimizer="sgd", lr=LONG,
                                                                                  momentum=0.9)))),)},
    "yellow flag": lambda: {"flags": _flags()},
    "warning": lambda: {"warnings": [Finding(
        cause="oscillating_loss", severity="warning", fix=f"lower the lr (the loss swings {LONG}x its mean).",
        summary=f"the loss swings by {LONG * 100}% of its mean over the last epoch: {LONG}.")]},
    "layer finding": lambda: {"layer_findings": [LayerFinding(
        layer="fc1", action="replace it by a smaller one",
        finding=f"fc1 (Linear) takes 61% of the step time, but replacing its output by its mean costs only "
                f"{LONG / 100:.4g} accuracy (3% of the measured contribution)")]},
}


@pytest.mark.parametrize("found", list(FOUND))
def test_what_the_stages_found_is_printed_rounded(monkeypatch: pytest.MonkeyPatch, found: str) -> None:
    text = _printed(_result(**FOUND[found]()), monkeypatch)
    marker = {"optimizer alternative": "optimizer_alternative", "yellow flag": "yellow flag: nan in ",
              "warning": "warning about the defaults' training: oscillating_loss",
              "layer finding": "layer fc1"}[found]
    assert marker in text
    assert not _unrounded(text), _unrounded(text)


def test_the_budget_plan_line_is_rounded() -> None:
    plan = BudgetPlan(full_epochs=10, full_s=LONG * 100, left_s=50.0868511373751352, full_trainings=5.0868511373751352,
                      seeds=3, finalists=2, race_s=26.0868511373751352, after_s=10.0868511373751352,
                      search_s=14.0868511373751352, trial_epochs=3, race_fits=True, min_budget_s=90.0868511373751352,
                      budget_s=60.0)
    for fits in (True, False):
        line = dataclasses.replace(plan, race_fits=fits).describe()
        assert not _unrounded(line), _unrounded(line)


def test_the_one_formatter_rounds_any_number_in_a_sentence() -> None:
    assert rounded(f"an accuracy drop of {LONG}.") == "an accuracy drop of 0.0869."
    assert rounded(f"waited {LONG}s, {1.2345678}x faster") == "waited 0.0869s, 1.23x faster"
    assert rounded("lr 3.4567891234e-05 to 1e-05") == "lr 3.46e-05 to 1e-05"
    assert rounded("torch 2.14.1, 0.5 and 12.5, 98%") == "torch 2.14.1, 0.5 and 12.5, 98%"


def test_a_reserve_kept_before_any_trial_is_given_back_once_the_trials_show_no_leader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the race's reserve as the trials stand: 20 s before any trial (a leader may come), none after
    # (the trials show none ahead of the defaults); the search's window follows it both ways
    rows: list[TrialRecord] = []

    def fake_call(task: Any, plan: Any, settings: Any, *, store: Any, trials: int, timeout: float | None,
                  items: Any) -> Any:
        for item in items:
            rows.append(_trial(len(rows), item.params, 0.5))
        return SimpleNamespace(trials=list(rows))

    clock = StepClock(0.05)
    monkeypatch.setattr(_search, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(_search, "_call", fake_call)
    monkeypatch.setattr(_search, "study_trials", lambda study, *, store: [])
    monkeypatch.setattr(_search, "cancel_waiting", lambda study, *, store, reason: [])
    monkeypatch.setattr(_search, "STALL_AFTER", 2.0)
    monkeypatch.setattr(_search, "propose", lambda rows_, plan, settings, flags, n: [
        enqueued("tpe", {"lr": 0.001 * (1 + len(rows_) + i), "hidden": 8}) for i in range(n)])
    settings = StageSettings(objective="accuracy:max", metric="accuracy", maximize=True, max_trials=10**6,
                             defaults={"lr": 0.01}, trial_s_estimate=LONG)
    def ran(reserve_after: float) -> float:
        start = clock.t
        rows.clear()
        run_search_stage(TinyTask(), _plan(), settings, store=None, seconds=30.0,  # type: ignore[arg-type]
                         must_end=clock.t + 30.0, reserve=lambda rs: 20.0 if not rs else reserve_after)
        return clock.t - start

    given_back, kept = ran(0.0), ran(20.0)
    assert kept < 12.0  # the 20 s kept for the race: the search stops within the 10 s left
    assert given_back > 25.0  # given back: the search runs on to its own 30 s
