"""The loop on a script as it is: its defaults, the search, the race of the best against the
defaults (paired ``--seed`` where the script has one), and the flags to pass."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from ..exceptions import ConfigError, ProblemCollector, ProftuneError, RunFailedError
from ..optimize import compare_race
from ..search import Objective, SearchResult, Space, parse_objective, search
from ..track import Store, environment, open_store
from ._flags import ScriptFlags, read_flags
from ._script_space import script_space
from ._task import ScriptCut, ScriptTask

__all__ = ["SKIPPED_STAGES", "load_script", "optimize_script", "tune_script"]

#: The stages of ``optimize`` that need the model in this process, and why a script skips each.
SKIPPED_STAGES = {
    "health": "the health checks run inside the fit loop; a script keeps its own loop",
    "compute": "the LR range test and the batch-size search train the model in this process",
    "layer_value": "the value of each layer needs the model in this process",
    "compress": "compression needs the trained model in this process; the script keeps its own files",
}
#: Rounds of the race (each one run of the best and one of the defaults), at least and at most.
MIN_ROUNDS, MAX_ROUNDS = 2, 5
#: A trial of the search may take this many times the defaults' run before it is ended.
TRIAL_CAP = 3.0
#: Seconds of the budget kept back after the last run of the script, at least and as a share of
#: it: the records, the JSON and the interpreter's exit (unloading torch: 1-2 s on a loaded machine).
CLOSE_S, CLOSE_SHARE = 2.0, 0.02
#: Seconds the search takes past its last trial (its tune Run's records; 0.8 s at a load of 4 on 2
#: cores), kept from its timeout so that the race's rounds still fit.
SEARCH_CLOSE_S = 1.0


class Spread(TypedDict):
    """One side's runs in the race: the mean and standard deviation of their figures (None: too few
    runs), how many, and the figures."""

    mean: float | None
    std: float | None
    n: int
    values: list[float]


class _Stage(TypedDict):
    stage: str
    status: str
    time_s: float
    did: str


class StageRow(_Stage, total=False):
    """A stage of the loop: finished, skipped or failed, its seconds and what it did; the search's
    row, its best params."""

    best: dict[str, Any] | None


class _Rounds(TypedDict):
    rounds: int


class Race(_Rounds, total=False):
    """The race of the search's best against the defaults (no rounds: not run): the seeds (None: not
    paired), each side's figures, and the script's held-out metric beside them (``*_test``)."""

    seeds: list[int] | None
    paired: bool
    best: Spread
    defaults: Spread
    test_metric: str | None
    best_test: Spread
    defaults_test: Spread


def load_script(command: Sequence[str], *, objective: str | None, constraints: Sequence[str] = (),
                space: str | Path | Mapping[str, Any] | None = None, profile: bool | None = None,
                flags: ScriptFlags | None = None) -> tuple[ScriptTask, Space, Objective]:
    """The script as a task, its space and its objective (``val_acc:max``); ``flags``: its flags where
    they were read already (reading them runs the script up to its ``parse_args``: its imports)."""
    if not objective:
        raise ConfigError("a script's objective must be named with objective= (NAME[:max|min]): the metric it prints "
                          "as `NAME=value` (or `NAME: value`) or reports with proftune.report(NAME=value).")
    flags = flags if flags is not None else read_flags(command)
    problems = ProblemCollector()
    obj = parse_objective(objective, problems, name="objective")
    problems.raise_if_any()
    assert obj is not None
    metrics = [obj.metric, *(c.split("<")[0].split(">")[0].strip() for c in constraints)]
    task = ScriptTask(command, metrics=metrics, flags=flags, profile=profile)
    task.metric_directions = {obj.metric: "max" if obj.direction == "maximize" else "min"}  # type: ignore[misc]
    return task, script_space(task, space), obj


def tune_script(task: ScriptTask, space: Space, objective: Objective, **options: Any) -> SearchResult:
    """:func:`proftune.search` over the script's flags, each trial one process of it."""
    return search(task, space, objectives=[objective.text], **options)


def _test_metric(metrics: Mapping[str, float], objective: str) -> str | None:
    """The script's own held-out figure beside the objective (``test_acc`` for ``val_acc``)."""
    for prefix in ("val_", "valid_", "validation_", "eval_"):
        if objective.startswith(prefix) and f"test_{objective[len(prefix):]}" in metrics:
            return f"test_{objective[len(prefix):]}"
    tests = sorted(k for k in metrics if k.startswith("test"))
    return tests[0] if tests else None


def _best_value(result: SearchResult | None) -> float | None:
    """The objective's value of the search's pick (its mean where it re-evaluated it)."""
    if result is None:
        return None
    if result.selection is not None:
        return float(result.selection.mean)
    return float(result.best.values[0]) if result.best is not None and result.best.values else None


def _pooled_std(groups: Sequence[Sequence[float]]) -> float | None:
    """The seeds' noise: the standard deviation within each configuration's runs, pooled (None with
    no configuration run twice). A race of two seeds judged by its gains' own spread alone needs a
    gain 9x that spread (Student's t at one degree of freedom): +0.60 +- 0.14 was kept as noise."""
    num = sum((len(g) - 1) * statistics.variance(g) for g in groups if len(g) > 1)
    df = sum(len(g) - 1 for g in groups if len(g) > 1)
    return math.sqrt(num / df) if df else None


def _mean_std(values: Sequence[float]) -> Spread:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return {"mean": statistics.fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) > 1 else None, "n": len(vals), "values": vals}


def _search_stage(task: ScriptTask, space: Space, objective: Objective, *, search_s: float, run_s: float,
                  **options: Any) -> tuple[SearchResult | None, dict[str, Any] | None, StageRow]:
    """The search within ``search_s`` seconds: its result, its best params and its stage row (a search
    whose trials failed too often keeps the defaults, with why)."""
    t1 = time.monotonic()
    task.timeout_s = max(TRIAL_CAP * run_s, 10.0)
    try:
        # no importance or correlations at the end: the loop reads the best, and their fit costs seconds
        result = search(task, space, objectives=[objective.text], trials=10_000, timeout=search_s,
                        analyse=False, **options)
    except RunFailedError as exc:
        return None, None, {"stage": "search", "status": "failed", "time_s": time.monotonic() - t1, "did": str(exc)}
    finally:
        task.timeout_s = None
    best = (dict(result.selection.params) if result.selection is not None
            else dict(result.best.params) if result.best is not None else None)
    states = [t.state for t in result.trials]
    did = (f"{len(states)} trials ({states.count('complete')} complete, {states.count('pruned')} pruned, "
           f"{states.count('failed')} failed), study {result.study}")
    return result, best, {"stage": "search", "status": "finished", "time_s": time.monotonic() - t1, "did": did,
                          "best": best}


def _cut_trials(result: SearchResult | None) -> int:
    """The search's trials cut at its end (the race's time kept): failed trials, of no value."""
    return sum(t.state == "failed" and ScriptCut.__name__ in (t.reason or "") for t in
               (result.trials if result is not None else ()))


def _stop_reason(budget_s: float, used_s: float, cut: Sequence[str], cut_trials: int, short: str, rounds: int,
                 no_search: str) -> str:
    """Why the loop ended when it did, in one sentence: the runs the budget's end cut, if any."""
    ended = [*([f"{cut_trials} search trial(s)"] if cut_trials else []),
             *(f"the {role} run" for role in dict.fromkeys(cut))]
    short = "; ".join(t for t in (no_search, short) if t)
    if ended or short:
        return (f"the budget's end: {used_s:.0f} s of {budget_s:.0f} s used"
                + (f"; cut or not started there: {', '.join(ended)}" if ended else "")
                + (f"; {short}" if short else ""))
    if used_s < 0.8 * budget_s:
        return (f"every stage finished its work in {used_s:.0f} s of {budget_s:.0f} s "
                f"(race: {rounds} round(s), at most {MAX_ROUNDS})")
    return f"the budget is spent: {used_s:.0f} s of {budget_s:.0f} s (race: {rounds} round(s))"


def _search_run(result: SearchResult | None, params: Mapping[str, Any], seed: int) -> dict[str, float] | None:
    """The search's complete trial of ``params`` at ``seed`` (a first evaluation, not a repeat): its
    metrics, or None."""
    for t in result.trials if result is not None else ():
        if t.state == "complete" and not t.repeat and t.seed == seed and all(
                t.params.get(k) == v for k, v in params.items()):
            return dict(t.metrics)
    return None


class _Recorder:
    """Each run of the script outside the search, a ``train`` Run under the optimize Run."""

    def __init__(self, store: Store, task: ScriptTask, parent: int) -> None:
        self.store, self.task, self.parent = store, task, parent
        #: The runs cut at the budget's end (or not started past it), by role.
        self.cut: list[str] = []

    def run(self, params: Mapping[str, Any], seed: int, role: str) -> dict[str, float] | None:
        """One run of ``params`` at ``seed``: its metrics, or None (failed, or cut at the budget's end)."""
        if self.task.deadline is not None and time.monotonic() >= self.task.deadline:
            self.cut.append(role)  # past the budget's end: not started, nothing to record
            return None
        rid = self.store.start_run("train", self.task.name, parent_id=self.parent, env=environment(None),
                                   config={"params": dict(params), "seed": seed, "role": role,
                                           "command": self.task.command_for({**params, **(
                                               {"seed": seed} if self.task.takes_seed else {})})})
        try:
            metrics = self.task.call(params, seed)
        except ScriptCut as exc:
            self.cut.append(role)
            self.store.finish_run(rid, status="interrupted", error=str(exc),
                                  artifacts={"output": self.task.output(), "cut": True})
            return None
        except ProftuneError as exc:
            self.store.finish_run(rid, status="failed", error=str(exc), artifacts={"output": self.task.output()})
            return None
        except BaseException as exc:
            self.store.finish_run(rid, status="interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
                                  error=f"{type(exc).__name__}: {exc}")
            raise
        self.store.finish_run(rid, metrics=metrics, artifacts={"output": self.task.output()})
        return metrics


def optimize_script(task: ScriptTask, space: Space, objective: Objective, *, budget_s: float, seed: int = 0,
                    db: str | None = None, study: str | None = None, sampler: str = "tpe", pruner: str = "asha",
                    progress: Callable[[str], None] | None = None, started: float | None = None,
                    **search_options: Any) -> dict[str, Any]:
    """The loop on a script within ``budget_s`` seconds: one run of its defaults, the search, the race
    of the search's best against the defaults, and the flags to pass (the defaults unless the best
    is better beyond noise). Returns the result as a JSON-safe dict (``final.params``: each flag's
    argparse name to its value; ``stop_reason``: why it ended when it did).

    ``started``: the ``time.monotonic()`` at which the budget's clock started (the command's start,
    reading the script's flags included; default: now). A run of the script still going at the
    budget's end (less ``CLOSE_S`` kept for the records and the exit) is cut: its process group
    ended, its Run ``interrupted``; the race stops at fewer rounds where the next would not fit."""
    say = progress or (lambda text: None)
    started = time.monotonic() if started is None else float(started)
    end = started + budget_s - max(CLOSE_S, CLOSE_SHARE * budget_s)
    store = open_store(None, db=db)
    metric, maximize = objective.metric, objective.direction == "maximize"
    defaults = {f.dest: task.default_params[f.dest] for f in task.flags.flags
                if f.settable and f.dest in task.default_params and f.dest != "seed"}
    run_id = store.start_run("optimize", task.name, env=environment(None),
                             config={"command": task.flags_text({}), "budget_s": budget_s, "objective": objective.text,
                                     "space": space.to_dict(), "seed": seed, "source": "script"})
    rec = _Recorder(store, task, run_id)
    stages: list[StageRow] = []
    notes: list[str] = []
    task.deadline = end
    try:
        say("baseline: one run of the script's defaults")
        t0 = time.monotonic()
        base = rec.run(defaults, seed, "baseline")
        run_s = time.monotonic() - t0
        if base is None and rec.cut:
            raise ProftuneError(f"the budget ({budget_s:g} s) ended before one run of the script's defaults did: "
                                f"{t0 - started:.1f} s went to reading its flags and starting, and the run was cut "
                                f"after {run_s:.1f} s; give a larger budget=.")
        if base is None:
            raise ProftuneError("the script failed with its own defaults; its last lines:\n"
                                + "\n".join(task.output()[-12:]))
        stages.append({"stage": "baseline", "status": "finished", "time_s": run_s,
                       "did": f"{metric}={base.get(metric)} with the script's defaults in {run_s:.1f} s"})
        for name, why in SKIPPED_STAGES.items():
            stages.append({"stage": name, "status": "skipped", "time_s": 0.0, "did": why})
        left = end - time.monotonic()
        # paired by --seed, the defaults' run above is their run at the race's first seed: the race
        # trains the best there and both at the seeds after it (one run fewer to keep back)
        # and the search's trial of its best at --seed S (the first trials' seed) is the best's run
        # there: neither is run again
        race_s = (2 * MIN_ROUNDS - (2 if task.takes_seed else 0)) * run_s
        # the search stops starting trials at its timeout and the last one started runs to its end
        # (a trial past TRIAL_CAP runs of the defaults' time, or past the race's time, is ended, a
        # failed trial): its timeout leaves one run's time for that; the first trial always runs
        # where one fits beside the race
        room = left - race_s
        search_s = max(room - run_s - SEARCH_CLOSE_S, 0.5 * run_s)
        best_params: dict[str, Any] | None = None
        result: SearchResult | None = None
        short = ""  # the race cut short by the budget's end, why
        no_search = ""  # the search skipped for want of time, why
        if room < run_s + SEARCH_CLOSE_S:
            no_search = (f"the budget left ({left:.0f} s) holds no trial beside a race of {MIN_ROUNDS} "
                         f"rounds at {run_s:.1f} s a run (give a larger --budget)")
            stages.append({"stage": "search", "status": "skipped", "time_s": 0.0, "did": no_search})
        else:
            say(f"search: {search_s:.0f} s of trials, each one process of the script")
            # the race's time is kept: a trial going on one run past the search's timeout is cut
            task.cut_after(search_s + run_s)
            try:
                result, best_params, row = _search_stage(task, space, objective, search_s=search_s, run_s=run_s,
                                                         sampler=sampler, pruner=pruner, study=study, db=store.url,
                                                         seed=seed, **search_options)
            finally:
                task.cut_after(None)
            stages.append(row)
        proposed = best_params
        race: Race = {"rounds": 0}
        comparison = None
        paired = task.takes_seed
        searched = _best_value(result)
        if (best_params is not None and searched is not None and base.get(metric) is not None
                and (searched <= base[metric] if maximize else searched >= base[metric])):
            notes.append(f"the search's best ({metric}={searched:.4g}) is not better than the defaults' run "
                         f"({base[metric]:.4g}): nothing to race")
            best_params = None
        chosen = {**defaults, **(best_params or {})}
        first_best = _search_run(result, best_params, seed) if paired and best_params is not None else None
        if best_params is not None and chosen != defaults:
            t2 = time.monotonic()
            seeds: list[int] = []
            c_runs: list[dict[str, float] | None] = []
            d_runs: list[dict[str, float] | None] = []
            while len(seeds) < MAX_ROUNDS:
                reuse = paired and not seeds  # the defaults' run at --seed S is their first race run
                s = seed if reuse else seed + 1 + len(seeds)
                again = first_best if reuse else None  # the search's run of the best at --seed S
                runs = (again is None) + (not reuse)
                if runs and time.monotonic() + runs * run_s > end:  # a round that would be cut
                    if len(seeds) < MIN_ROUNDS:
                        short = f"the race ran {len(seeds)} of its {MIN_ROUNDS} rounds: the budget's end"
                    break
                say(f"race round {len(seeds) + 1}: " + ("the best and " if again is None else "")
                    + ("the defaults" if not reuse else "") + (f" at --seed {s}" if paired else "")
                    + (" (both run before the race)" if reuse and again is not None else ""))
                seeds.append(s)
                c_runs.append(again if again is not None else rec.run(chosen, s, "race-best"))
                d_runs.append(base if reuse else rec.run(defaults, s, "race-defaults"))
            c_vals = [r.get(metric) if r else None for r in c_runs]
            d_vals = [r.get(metric) if r else None for r in d_runs]
            more = [] if paired else [base.get(metric)]  # paired: the baseline is the first pair's
            prior = _pooled_std([[v for v in c_vals if v is not None],
                                 [v for v in [*d_vals, *more] if v is not None]])
            raw = list(c_vals)  # the runs' own figures, for the report
            if first_best is not None and c_vals and c_vals[0] is not None and prior is not None and result is not None:
                # the search's run is the best of its draws: less the expected maximum of their noise
                drawn = sum(t.state == "complete" for t in result.trials)
                c_vals[0] -= (1.0 if maximize else -1.0) * prior * math.sqrt(2.0 * math.log(max(drawn, 1)))
                notes.append(f"the best's first race run is its search trial at --seed {seed}, counted less the "
                             f"winner's curse of {drawn} complete trials")
            comparison = compare_race(c_vals, d_vals, seeds=seeds, defaults_more=more, metric=metric,
                                      maximize=maximize, split="val", prior_std=prior)
            test = _test_metric(base, metric)
            race = {"rounds": len(seeds), "seeds": seeds if paired else None, "paired": paired,
                    "best": _mean_std([v for v in raw if v is not None]),
                    "defaults": _mean_std([v for v in [*d_vals, *more] if v is not None]),
                    "test_metric": test}
            if test is not None:
                race["best_test"] = _mean_std([r[test] for r in c_runs if r and test in r])
                race["defaults_test"] = _mean_std([r[test] for r in [*d_runs, *([] if paired else [base])]
                                                   if r and test in r])
            # a pair with a run failed or cut at the budget's end is not judged: say so beside the seeds run
            pairs = sum(c is not None and d is not None for c, d in zip(c_vals, d_vals, strict=True))
            how = (f"paired by --seed over {len(seeds)} seeds"
                   + (f", {pairs} of them with both runs (the rest failed or cut)" if pairs < len(seeds) else "")
                   if paired else
                   f"the script has no --seed flag, so seeds cannot be paired: {len(seeds)} runs of each, judged "
                   "by a rank-sum test of the runs beside the t-test on the runs in order")
            stages.append({"stage": "final", "status": "finished" if seeds else "skipped",
                           "time_s": time.monotonic() - t2,
                           "did": f"race of the best against the defaults, {how}: {comparison.describe()}" if seeds
                           else f"no round of the race fits in the {end - t2:.1f} s left at {run_s:.1f} s a run"})
            if short:
                notes.append(short)
            if not paired:
                notes.append("the script has no --seed flag: seeds cannot be paired; " + how)
        else:
            stages.append({"stage": "final", "status": "skipped", "time_s": 0.0,
                           "did": "no configuration other than the defaults to race"})
        adopted = bool(comparison is not None and comparison.beyond_noise)
        final = chosen if adopted else defaults
        decision = (f"adopted the search's best: {comparison.describe()}" if adopted and comparison is not None else
                    "kept the script's defaults" + (f": {comparison.describe()}" if comparison is not None else
                                                    " (nothing to race)"))
        out = {"task": task.name, "run_id": run_id, "objective": objective.text,
               "metric_source": task.describe_source(), "budget_s": budget_s,
               "duration_s": time.monotonic() - started, "stages": stages,
               "final": {"params": final, "command": task.flags_text(final), "adopted": adopted,
                         "decision": decision},
               "vs_baseline": {"comparison": comparison.to_dict() if comparison is not None else None, **race,
                               "search_best": proposed, "baseline": base},
               "flags": [f.to_dict() for f in task.flags.flags], "space": space.to_dict(),
               "study": result.study if result is not None else None, "notes": notes,
               "stop_reason": _stop_reason(budget_s, time.monotonic() - started, rec.cut, _cut_trials(result), short,
                                           race.get("rounds", 0), no_search)}
    except BaseException as exc:
        store.finish_run(run_id, status="interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
                         error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        task.deadline = None  # this budget's: the task may run again
    figure = race.get("best") if adopted else race.get("defaults")
    value = figure["mean"] if figure is not None and figure["mean"] is not None else base.get(metric)
    store.finish_run(run_id, metrics={metric: value} if value is not None else {}, result=out)
    return out
