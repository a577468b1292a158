"""The generated benchmark (issue 60): ``proftune optimize`` beside a plain Optuna loop and the
defaults on tasks drawn from a space (``benchmarks/generated_tasks.py``), so that no mechanism can
be fitted to the benchmark by hand.

    python benchmarks/generated.py --seed S --n 40 --budgets 8 [--jobs 2] [--out r.json] [--resume]
    python benchmarks/generated.py --seed S --n 40 --budgets 8 --vs-optuna-at 32 --out r.json

``--seed S --n N`` draws N tasks (``draw_tasks(S, N)``: data, model, the user's optimizer and
schedule, one or two mistakes in the defaults; each with a test split nothing selects on).
``--max-training-s`` (3 s) caps each drawn task's estimated training of the defaults, so that a
run fits a session. For each task one training of the defaults is timed (after a warm-up step,
outside every clock): the budget's unit is that time, or ``--unit-floor-s`` (1 s) where it is
shorter (below that a budget measures the process, not a tuner). Every arm then gets ``k`` units of
wall clock for each ``k`` in ``--budgets`` (8 and 60 by default), in one process at one thread
(``PROFTUNE_THREADS=1``; ``--jobs 2`` runs two tasks at a time, each in its own process):

- ``defaults``: the task's defaults at their own protocol (its epochs, its optimizer and schedule);
- ``ours``: ``proftune.optimize(task, budget=k units, goal="none")``, its model (a failure keeps
  the defaults and says so);
- ``optuna-tpe``: the plain Optuna loop a user writes: TPE over lr, weight decay, dropout, batch
  and the model's width where it has one, each trial a full training at the task's protocol with
  the task's own optimizer and schedule, the best-on-validation model kept (``optimize.py``'s
  ``optuna_arm``); a trial running at the end finishes, as ``study.optimize(timeout=...)`` has it;
- ``optuna-hyperband``: the same with Optuna's ``HyperbandPruner`` (``optimize.py``'s
  ``hyperband_arm``; a trial running at the end is cut);
- ``tpe@32`` (with ``--vs-optuna-at 32`` and a budget of 8): the TPE loop at 32 units, beside ours
  at 8: what computing from measurements should buy;
- ``tpe-again`` (with ``--tpe-again``): the same TPE loop at another seed (its sampler and its
  trainings), at every budget: how often a plain loop is within one standard error of itself, the
  ceiling of the issue's per-task criterion at one repetition.

Repetition ``r`` of task ``i`` runs every arm at seed ``100 i + r`` (the trainings, Optuna's sampler,
ours' seeds): paired within a task, independent across tasks. Every figure is the test accuracy of
the arm's model. Printed per task: each arm's figure, ours'
differences to each anchor with their noise (the test split's binomial standard error of the pair,
sqrt(p1(1-p1)/n + p2(1-p2)/n), with one repetition; the paired differences' standard error with
more), and ours' decision. At the end, per budget, over tasks: the distribution of ours - optuna-tpe,
ours - hyperband and ours - defaults (mean, its paired standard error across tasks, median, std,
quantiles), the share of tasks where ours >= optuna-tpe - one standard error of the task, the tasks
where ours is below the defaults beyond noise (by more than two standard errors), and the worst
five tasks against optuna-tpe with why (the task, what ours chose, what Optuna chose).

``--out FILE.json`` is rewritten as each task finishes (an existing file needs ``--force``, or
``--resume`` to keep its tasks and run only the others); an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import math
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import headroom  # noqa: E402
from generated_tasks import GeneratedTask, draw  # noqa: E402

import proftune  # noqa: E402
from proftune.optimize import FinalOutputs  # noqa: E402
from proftune.train import fit  # noqa: E402

_bench = headroom._bench  # benchmarks/optimize.py, loaded once under its own name
defaults_arm, hyperband_arm, optuna_arm, ours_arm = (_bench.defaults_arm, _bench.hyperband_arm, _bench.optuna_arm,
                                                     _bench.ours_arm)
_q = _bench._q
ARMS = ("optuna-tpe", "optuna-hyperband", "defaults")
#: Seconds a run of ours spends beyond its budget (its stages' fixed costs), and a task's own
#: overhead (data, warm-up, evaluations): for the estimate printed at the start.
OURS_OVERHEAD_S, TASK_OVERHEAD_S = 5.0, 5.0
#: Ours is stopped (and counted as a crash that keeps the defaults) past this many times its budget
#: plus these seconds: a run of ours that hangs would otherwise stop the whole benchmark.
OURS_LIMIT_X, OURS_LIMIT_PLUS_S = 5.0, 120.0
#: ``tpe-again`` runs at the paired seed plus this (no other task's or repetition's seed).
AGAIN_SEED = 1_000_000


# -- one task ------------------------------------------------------------------------------------
def _changed(params: dict[str, Any], defaults: dict[str, Any]) -> str:
    keys = ("lr", "batch_size", "weight_decay", "dropout", "hidden", "width", "d_model", "optimizer", "epochs")
    diffs = [f"{k} {_short(defaults.get(k))}->{_short(params[k])}" for k in keys
             if k in params and params[k] != defaults.get(k)]
    return ", ".join(diffs) or "the defaults"


def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


class ArmTimeout(Exception):
    """An arm ran far past its budget (a hang would stop a long run of many tasks)."""


@contextlib.contextmanager
def _limit(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`ArmTimeout` in this (main) thread after ``seconds`` of wall clock."""

    def fire(signum: int, frame: Any) -> None:
        raise ArmTimeout(f"{what} ran past {seconds:.0f} s, {OURS_LIMIT_X:g}x its budget (+{OURS_LIMIT_PLUS_S:g} s)")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _ours(task: GeneratedTask, budget: float, rep: int, tmp: Path, fallback: float) -> dict[str, Any]:
    try:
        with _limit(OURS_LIMIT_X * budget + OURS_LIMIT_PLUS_S, "ours"):
            r = ours_arm(task, budget, rep, tmp, judge=task, goal="none")
    except Exception as exc:  # noqa: BLE001  (a crash keeps the defaults too, and the table says so)
        kind = "failed" if isinstance(exc, proftune.ProftuneError) else f"crashed ({type(exc).__name__})"
        return {"test": fallback, "decision": f"{kind}: {str(exc).splitlines()[0][:160] if str(exc) else ''}",
                "failed": True, "trace": traceback.format_exc(limit=4)}
    keep = ("test", "val", "wall", "decision", "gain_test", "beyond_noise", "stop", "epochs", "race_note", "cut")
    out = {k: r.get(k) for k in keep}
    out["params"] = {k: v for k, v in r["params"].items() if isinstance(v, (int, float, str, bool))}
    out["changed"] = _changed({**out["params"], "epochs": r.get("epochs")},
                              {**task.default_params, "epochs": task.default_epochs})
    out["search_best"] = _search_best(task, Path(r["out"]), rep)
    out["race"] = _race_summary(Path(r["out"]))
    out["stages_s"] = _stage_seconds(Path(r["out"]))
    return out


def _stage_seconds(out: Path) -> dict[str, float] | None:
    """Each stage's wall clock in ours' run (where the budget went), from its state.json."""
    try:
        stages = json.loads((out / "state.json").read_text())["stages"]
    except (OSError, ValueError, KeyError):
        return None
    return {name: round(float(s.get("duration_s") or 0.0), 2) for name, s in stages.items()}


def _race_summary(out: Path) -> dict[str, Any] | None:
    """What the final race saw (a diagnostic of the decision): each arm's search lead and validation
    mean over the race's seeds, the leader and the comparison that decided."""
    try:
        race = FinalOutputs.from_dict(json.loads((out / "state.json").read_text())["stages"]["final"]["outputs"]).race
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if race is None:
        return None
    c = race.comparison
    return {"seeds": len(race.seeds), "leader": race.leader, "decision": race.decision,
            "arms": {a.name: {"search": a.search_mean, "n": a.search_n, "val": a.summary("val").mean,
                              "runs": len([r for r in a.runs if r.val is not None])} for a in race.arms},
            "gain": c.gain if c else None, "lower": c.lower if c else None,
            "reason": (c.reason[:300] if c else None)}


def _search_best(task: GeneratedTask, out: Path, rep: int) -> dict[str, Any] | None:
    """A diagnostic beside ours' result, outside its clock: the search's best trial on validation
    (at the most epochs a trial ran) trained again at the run's seed and judged on test; what ours
    would score had it taken the search's best draw, as a plain loop does, without its race."""
    try:
        rows = json.loads((out / "search_trials.json").read_text())
    except (OSError, ValueError):
        return None
    rows = rows if isinstance(rows, list) else rows.get("trials", [])
    done = [t for t in rows if t.get("state") == "complete" and isinstance(t.get("value"), (int, float))]
    if not done:
        return None
    top = max(int(t.get("epochs") or 0) for t in done)
    best = max((t for t in done if int(t.get("epochs") or 0) == top), key=lambda t: t["value"])
    res = fit(task, dict(best["params"]), seed=rep, device="cpu", epochs=top or None)
    bs = int(res.params["batch_size"])
    return {"test": _bench.test_accuracy(task, res.model, bs), "val": best["value"], "arm": best.get("arm"),
            "trials": len(rows), "complete": len(done)}


def _optuna(task: GeneratedTask, budget: float, rep: int, *, hyperband: bool) -> dict[str, Any]:
    r = hyperband_arm(task, budget, rep) if hyperband else optuna_arm(task, budget, rep, pruner=False)
    keep = ("test", "val", "trials", "complete", "wall", "params", "from")
    out = {k: r[k] for k in keep if k in r}
    if out.get("params"):
        out["changed"] = _changed(out["params"], task.default_params)
    return out


def run_task(seed: int, index: int, *, budgets: list[float], reps: int, cap: float, floor_s: float,
             vs_at: float | None, again: bool = False) -> dict[str, Any]:
    """Every arm on task ``index`` of ``seed``; a JSON-able record."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    task = GeneratedTask(draw(seed, index, max_training_s=cap))
    rec: dict[str, Any] = {"name": task.name, "index": index, "description": task.description,
                           "kinds": {"data": task.spec.data, "model": task.spec.model,
                                     "optimizer": task.spec.optimizer,
                                     "mistakes": [k for k, _ in task.spec.mistakes]},
                           "test_n": task.spec.n_test, "est_s": task.spec.est_s}
    try:
        fit(task, dict(task.default_params), seed=0, device="cpu", max_steps=1)  # warm-up, outside every clock
        seeds = [100 * index + rep for rep in range(reps)]  # paired within a task, apart across tasks
        defaults = [defaults_arm(task, s) for s in seeds]
        rec["defaults"] = [{"test": d["test"], "val": d["val"], "wall": d["wall"]} for d in defaults]
        rec["training_s"] = float(defaults[0]["wall"])
        rec["unit_s"] = unit = max(rec["training_s"], floor_s)
        rec["budgets"] = {}
        with tempfile.TemporaryDirectory(prefix="proftune-generated-") as tmpdir:
            for k in budgets:
                budget = k * unit
                cell: dict[str, Any] = {"budget_s": budget, "ours": [], "optuna-tpe": [], "optuna-hyperband": []}
                for rep, s in enumerate(seeds):
                    cell["ours"].append(_ours(task, budget, s, Path(tmpdir), float(defaults[rep]["test"])))
                    cell["optuna-tpe"].append(_optuna(task, budget, s, hyperband=False))
                    cell["optuna-hyperband"].append(_optuna(task, budget, s, hyperband=True))
                if vs_at is not None and k == 8:
                    cell["tpe@32"] = [_optuna(task, vs_at * unit, s, hyperband=False) for s in seeds]
                if again:
                    cell["tpe-again"] = [_optuna(task, budget, s + AGAIN_SEED, hyperband=False) for s in seeds]
                rec["budgets"][f"{k:g}"] = cell
    except Exception as exc:  # noqa: BLE001  (one task's failure is reported; a long run goes on)
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["trace"] = traceback.format_exc(limit=6)
    rec["wall_s"] = time.perf_counter() - started
    return rec


# -- figures ---------------------------------------------------------------------------------------
def _tests(rows: list[dict[str, Any]], fallback: list[float]) -> list[float]:
    """An arm's test figures; an arm that handed back nothing (not one trial finished, NaN) is
    given the defaults: what its user would have."""
    return [float(r["test"]) if r.get("test") is not None and math.isfinite(float(r["test"])) else f
            for r, f in zip(rows, fallback, strict=True)]


def paired(a: list[float], b: list[float], n: int) -> tuple[float, float]:
    """The mean difference a - b over the repetitions and its standard error: with one repetition
    the test split's binomial error of the pair, with more the paired differences' (never below
    the binomial error of their mean)."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    binom = math.sqrt(sum(p * (1 - p) / n for p in (statistics.fmean(a), statistics.fmean(b))))
    se = binom / math.sqrt(len(diffs))
    if len(diffs) > 1:
        se = max(se, statistics.stdev(diffs) / math.sqrt(len(diffs)))
    return statistics.fmean(diffs), se


def task_figures(rec: dict[str, Any], k: str) -> dict[str, Any]:
    """One task's figures at budget ``k``: each arm's mean test, ours' differences with their noise."""
    d = [float(x["test"]) for x in rec["defaults"]]
    cell = rec["budgets"][k]
    arms = {"ours": _tests(cell["ours"], d), "optuna-tpe": _tests(cell["optuna-tpe"], d),
            "optuna-hyperband": _tests(cell["optuna-hyperband"], d), "defaults": d}
    if "tpe@32" in cell:
        arms["tpe@32"] = _tests(cell["tpe@32"], d)
    n = int(rec["test_n"])
    out: dict[str, Any] = {"mean": {a: statistics.fmean(v) for a, v in arms.items()}, "diff": {}}
    for other in arms:
        if other != "ours":
            out["diff"][other] = paired(arms["ours"], arms[other], n)
    return out


def print_task(rec: dict[str, Any]) -> None:
    print(f"\n== {rec['name']}: {rec['description']}", flush=True)
    if "error" in rec:
        print(f"   FAILED before the arms finished: {rec['error']}\n{rec.get('trace', '')}", flush=True)
        return
    print(f"   one training of the defaults {rec['training_s']:.2f} s; the budget's unit {rec['unit_s']:.2f} s; "
          f"{rec['test_n']} test samples; {rec['wall_s']:.0f} s for the task", flush=True)
    for k, cell in rec["budgets"].items():
        f = task_figures(rec, k)
        m, dd = f["mean"], f["diff"]
        extra = ""
        if "tpe@32" in m:
            extra = f" | tpe@32 {m['tpe@32']:.3f} (ours@{k} - tpe@32 {dd['tpe@32'][0]:+.3f} ± {dd['tpe@32'][1]:.3f})"
        print(f"   {k} trainings ({cell['budget_s']:.1f} s): ours {m['ours']:.3f} | optuna-tpe {m['optuna-tpe']:.3f} "
              f"| optuna-hyperband {m['optuna-hyperband']:.3f} | defaults {m['defaults']:.3f}{extra}", flush=True)
        print(f"      ours - tpe {dd['optuna-tpe'][0]:+.3f} ± {dd['optuna-tpe'][1]:.3f}, - hyperband "
              f"{dd['optuna-hyperband'][0]:+.3f} ± {dd['optuna-hyperband'][1]:.3f}, - defaults "
              f"{dd['defaults'][0]:+.3f} ± {dd['defaults'][1]:.3f}", flush=True)
        for rep, (o, t) in enumerate(zip(cell["ours"], cell["optuna-tpe"], strict=True)):
            ours_line = f"{o['decision']}: {o.get('changed', '')}; {o.get('wall', 0) or 0:.1f} s"
            print(f"      rep {rep} ours: {ours_line}; {(o.get('stop') or '')[:200]}", flush=True)
            print(f"      rep {rep} optuna-tpe: {t.get('trials', 0)} trials in {t.get('wall', 0):.1f} s, best "
                  f"{t.get('changed', 'nothing')}", flush=True)


def _dist(xs: list[float]) -> str:
    if not xs:
        return "-"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    qs = " ".join(f"{_q(xs, q):+.3f}" for q in (0.05, 0.25, 0.5, 0.75, 0.95))
    return (f"mean {statistics.fmean(xs):+.4f} ± {sd / math.sqrt(len(xs)):.4f} (paired SE), median "
            f"{statistics.median(xs):+.3f}, std {sd:.3f}, quantiles 5/25/50/75/95% {qs}")


def _search_best_line(rows: list[tuple[dict[str, Any], dict[str, Any]]], k: str) -> None:
    """The diagnostic: ours had it taken its search's best draw on validation (no race), against
    optuna-tpe and the defaults, over the tasks where both were measured (first repetition)."""
    pairs = []
    for r, _ in rows:
        cell, n = r["budgets"][k], r["test_n"]
        best = cell["ours"][0].get("search_best")
        tpe, base = cell["optuna-tpe"][0].get("test"), r["defaults"][0].get("test")
        if best is None or tpe is None or base is None or tpe != tpe:
            continue
        b = best["test"]
        pairs.append((b - tpe, math.sqrt((b * (1 - b) + tpe * (1 - tpe)) / n), b - base,
                      math.sqrt((b * (1 - b) + base * (1 - base)) / n)))
    if pairs:
        within = sum(d >= -se for d, se, _, _ in pairs)
        below = sum(dd < -2 * sd for _, _, dd, sd in pairs)
        print(f"(diagnostic) the search's best draw on validation, no race: - tpe {_dist([p[0] for p in pairs])}; "
              f">= tpe - one SE {within}/{len(pairs)}; - defaults {_dist([p[2] for p in pairs])}; below the "
              f"defaults by > 2 SE {below}/{len(pairs)}")


def _again_line(rows: list[tuple[dict[str, Any], dict[str, Any]]], k: str) -> None:
    """The per-task criterion's ceiling: the TPE loop at another seed against itself (first
    repetition), where ``--tpe-again`` ran it."""
    pairs = []
    for r, _ in rows:
        again, tpe = r["budgets"][k].get("tpe-again"), r["budgets"][k]["optuna-tpe"][0].get("test")
        if not again or again[0].get("test") is None or tpe is None or tpe != tpe:
            continue
        a, n = float(again[0]["test"]), r["test_n"]
        pairs.append((a - tpe, math.sqrt((a * (1 - a) + tpe * (1 - tpe)) / n)))
    if pairs:
        within = sum(d >= -se for d, se in pairs)
        print(f"(the criterion's ceiling) optuna-tpe at another seed - optuna-tpe: {_dist([d for d, _ in pairs])}; "
              f">= optuna-tpe - one SE {within}/{len(pairs)} ({within / len(pairs):.0%})")


def summary(results: list[dict[str, Any]], budgets: list[str]) -> dict[str, Any]:
    """The distribution over tasks, per budget; printed and returned."""
    done = [r for r in results if "error" not in r]
    failed = [r["name"] for r in results if "error" in r]
    out: dict[str, Any] = {}
    print(f"\n#### Over {len(done)} tasks{f' ({len(failed)} failed: {failed})' if failed else ''}")
    for k in budgets:
        rows = [(r, task_figures(r, k)) for r in done if k in r.get("budgets", {})]
        if not rows:
            continue
        diffs = {a: [f["diff"][a][0] for _, f in rows] for a in rows[0][1]["diff"]}
        within = [f["diff"]["optuna-tpe"][0] >= -f["diff"]["optuna-tpe"][1] for _, f in rows]
        below = [r["name"] for r, f in rows if f["diff"]["defaults"][0] < -2 * f["diff"]["defaults"][1]]
        failed_ours = sum(any(o.get("failed") for o in r["budgets"][k]["ours"]) for r, _ in rows)
        print(f"\n### budget {k} trainings of the defaults ({len(rows)} tasks)")
        for a, xs in diffs.items():
            print(f"ours - {a:16}: {_dist(xs)}")
        print(f"ours >= optuna-tpe - one SE of the task: {sum(within)}/{len(rows)} ({sum(within) / len(rows):.0%})")
        named = f" ({', '.join(below)})" if below else ""
        print(f"ours below the defaults beyond noise (by > 2 SE): {len(below)}/{len(rows)}{named}; "
              f"ours failed (defaults kept): {failed_ours}")
        _search_best_line(rows, k)
        _again_line(rows, k)
        print(f"worst five against optuna-tpe at {k}:")
        worst = sorted(rows, key=lambda rf: rf[1]["diff"]["optuna-tpe"][0])[:5]
        for r, f in worst:
            o, t = r["budgets"][k]["ours"][0], r["budgets"][k]["optuna-tpe"][0]
            print(f"  {r['name']}: ours - tpe {f['diff']['optuna-tpe'][0]:+.3f} ± {f['diff']['optuna-tpe'][1]:.3f} "
                  f"(ours {f['mean']['ours']:.3f}, tpe {f['mean']['optuna-tpe']:.3f}, defaults "
                  f"{f['mean']['defaults']:.3f})\n    task: {r['description']}\n    ours: {o['decision']}: "
                  f"{o.get('changed', '')}; {(o.get('stop') or '')[:160]}\n    optuna-tpe: {t.get('trials', 0)} "
                  f"trials, best {t.get('changed', 'nothing')}")
        out[k] = {"tasks": len(rows), "diffs": diffs, "within_one_se": sum(within), "below_defaults": below,
                  "failed": failed_ours, "worst": [r["name"] for r, _ in worst]}
    return out


def estimate_s(indices: list[int], args: argparse.Namespace) -> float:
    """Seconds the run should take on a quiet machine: each task's estimated unit times its arms'
    budgets, ours' overhead, the task's own; over the jobs (a busy machine's trainings are slower,
    and so are its units: the pace printed after each task says it)."""
    total = 0.0
    for i in indices:
        unit = max(draw(args.seed, i, max_training_s=args.max_training_s).est_s, args.unit_floor_s)
        tpe = len(args.budgets) + (args.vs_optuna_at is not None)  # the TPE loop finishes its last trial
        per_rep = unit * (1 + (3 + args.tpe_again) * sum(args.budgets) + (args.vs_optuna_at or 0) + tpe)
        total += args.reps * (per_rep + OURS_OVERHEAD_S * len(args.budgets)) + TASK_OVERHEAD_S
    return total / args.jobs


# -- the command -----------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--seed", type=int, default=1, help="the draw's seed (default 1)")
    ap.add_argument("--n", type=int, default=40, help="how many tasks to draw (default 40)")
    ap.add_argument("--budgets", nargs="+", type=float, default=[8.0, 60.0],
                    help="budgets in trainings of the defaults (default 8 60)")
    ap.add_argument("--reps", type=int, default=1, help="repetitions (seeds) per arm (default 1)")
    ap.add_argument("--max-training-s", type=float, default=3.0,
                    help="cap on a drawn task's estimated training of the defaults, in s (default 3)")
    ap.add_argument("--unit-floor-s", type=float, default=1.0,
                    help="the budget's unit is one training of the defaults, or this many s if longer (default 1)")
    ap.add_argument("--vs-optuna-at", type=float, default=None,
                    help="also run optuna-tpe at this many trainings beside ours at 8 (e.g. 32)")
    ap.add_argument("--tpe-again", action="store_true",
                    help="also run optuna-tpe at another seed: how often it is within one SE of itself")
    ap.add_argument("--jobs", type=int, default=1, choices=(1, 2), help="tasks at a time, one process each (1 or 2)")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here, after each task")
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    ap.add_argument("--resume", action="store_true", help="keep --out's tasks and run only the others")
    args = ap.parse_args(argv)
    problems = []
    if args.n < 1:
        problems.append(f"--n must be >= 1, got {args.n}")
    if args.reps < 1:
        problems.append(f"--reps must be >= 1, got {args.reps}")
    if any(not math.isfinite(k) or k <= 0 for k in args.budgets):
        problems.append(f"--budgets must be positive trainings, got {' '.join(f'{k:g}' for k in args.budgets)}")
    if not args.max_training_s > 0:
        problems.append(f"--max-training-s must be > 0, got {args.max_training_s}")
    if not args.unit_floor_s >= 0:
        problems.append(f"--unit-floor-s must be >= 0, got {args.unit_floor_s}")
    if args.vs_optuna_at is not None and (not args.vs_optuna_at > 0 or 8.0 not in args.budgets):
        problems.append(f"--vs-optuna-at must be > 0 and --budgets must include 8, got --vs-optuna-at "
                        f"{args.vs_optuna_at} and --budgets {' '.join(f'{k:g}' for k in args.budgets)}")
    if args.resume and args.out is None:
        problems.append("--resume needs --out, the file whose tasks it keeps")
    if args.resume and args.force:
        problems.append("--resume and --force contradict each other: keep --out's tasks, or overwrite the file")
    if args.out is not None and args.out.exists() and not (args.force or args.resume):
        problems.append(f"--out {args.out} exists; pass --force to overwrite it, --resume to go on with it, "
                        "or name another file")
    if args.out is not None and not args.out.parent.is_dir():
        problems.append(f"--out {args.out}: its folder {args.out.parent} does not exist")
    if problems:
        ap.error("; ".join(problems))
    return args


#: The arguments a resumed file must share with the command: the tasks and how they are measured.
_SAME = ("seed", "budgets", "reps", "max_training_s", "unit_floor_s", "vs_optuna_at", "tpe_again")


def _load_resumed(args: argparse.Namespace) -> list[dict[str, Any]]:
    if not args.resume or not args.out.exists():
        return []
    try:
        doc = json.loads(args.out.read_text())
    except json.JSONDecodeError as exc:
        sys.exit(f"generated.py: --out {args.out} is not JSON ({exc}); cannot resume from it")
    mine = _args_record(args)
    theirs = {"tpe_again": False, **doc.get("args", {})}  # (files from before the option ran without it)
    diffs = [f"{k} {theirs.get(k)!r} != {mine[k]!r}" for k in _SAME if theirs.get(k) != mine[k]]
    if diffs:
        print(f"generated.py: --out {args.out} was measured with other arguments: {'; '.join(diffs)}",
              file=sys.stderr)
        sys.exit(2)
    return [r for r in doc.get("results", []) if "error" not in r]


def _args_record(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def _write(args: argparse.Namespace, results: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
    if args.out is None:
        return
    tmp = args.out.with_name(args.out.name + ".tmp")
    doc = {"args": _args_record(args), "results": sorted(results, key=lambda r: r["index"]), **(extra or {})}
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(args.out)  # a run killed while writing leaves the last complete file


def _init_worker() -> None:
    os.environ.setdefault("PROFTUNE_THREADS", "1")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    _init_worker()
    results = _load_resumed(args)
    have = {r["index"] for r in results}
    todo = [i for i in range(args.n) if i not in have]
    est = estimate_s(todo, args)
    print(f"generated benchmark: seed {args.seed}, {args.n} tasks ({len(have)} kept from {args.out}, {len(todo)} to "
          f"run), budgets {' '.join(f'{k:g}' for k in args.budgets)} trainings, {args.reps} repetition(s), training "
          f"capped at {args.max_training_s:g} s, unit floor {args.unit_floor_s:g} s, {args.jobs} job(s) at one thread; "
          f"estimated {est / 60:.0f} min", flush=True)
    kw = {"budgets": args.budgets, "reps": args.reps, "cap": args.max_training_s, "floor_s": args.unit_floor_s,
          "vs_at": args.vs_optuna_at, "again": args.tpe_again}
    started = time.perf_counter()

    def done(rec: dict[str, Any]) -> None:
        results.append(rec)
        print_task(rec)
        spent = time.perf_counter() - started
        ran = len(results) - len(have)
        left = spent / ran * (len(todo) - ran)  # the measured pace: the machine's load shows in it
        print(f"   [{len(results)}/{args.n} tasks, {spent / 60:.1f} min; at this pace about {left / 60:.0f} min left]",
              flush=True)
        _write(args, results)

    if args.jobs == 1:
        for i in todo:
            done(run_task(args.seed, i, **kw))
    else:
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx, initializer=_init_worker) as pool:
            futures = [pool.submit(run_task, args.seed, i, **kw) for i in todo]
            for fut in cf.as_completed(futures):
                done(fut.result())
    stats = summary(sorted(results, key=lambda r: r["index"]), [f"{k:g}" for k in args.budgets])
    _write(args, results, {"summary": stats})


if __name__ == "__main__":
    main()
