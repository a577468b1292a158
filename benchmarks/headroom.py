"""The headroom benchmark (issue 45): on tasks whose defaults are far from their best, does
``proftune optimize`` find the gain that is there, beside a plain Optuna loop, at budgets of a few
trainings?

Tasks (``benchmarks/headroom_tasks.py``, each with a test split that no arm selects on): a
plateau-start CNN whose lr is 30x too low, an MLP whose lr is 10x too high, a batch too large
for small data, few-shot, 20% noisy labels, and a small transformer.

For each task one full training of the defaults is timed first (the median of three), and every
arm gets ``k * T`` seconds for ``k`` in ``--budgets`` (8, 16 and 32 trainings), where ``T`` is that
time or ``--training-s`` (2 s) if it is shorter: these tasks train in 0.05-1 s on one thread, a
user's task in seconds to hours, and a budget of 0.4 s measures the process, not a tuner (every
arm gets the same wall clock; the unit is printed):

- defaults: the task's defaults at their own protocol, one training per repetition (seed = rep);
- optuna: Optuna's TPE with its ``HyperbandPruner`` over the same wide space, a plain PyTorch loop,
  the same wall clock (``benchmarks/optimize.py``'s ``hyperband_arm``);
- ours: ``proftune.optimize(task, budget=k*T, goal="none")``, its model at its own protocol;
- oracle: a grid of lr x batch size at the full protocol, three seeds each, the cell with the best
  median *test* accuracy (it sees the test data: the ceiling a tuner could reach in this space).

Printed per task and budget: test accuracy mean +- std over ``--reps`` repetitions for each arm,
the paired ratio ours/optuna (median over the repetitions, with the paired difference's mean +-
its standard error), ours' share of the oracle's gain over the defaults (where the oracle is
ahead of the defaults beyond their seeds' noise), and how often ours handed back less than the
defaults beyond noise. ``--out`` writes every figure as JSON (an existing file needs ``--force``).

    python benchmarks/headroom.py [--tasks plateau-cnn few-shot ...] [--budgets 8 16 32] [--reps 5]
    python benchmarks/headroom.py --quick      # budgets 8 and 16, 2 repetitions, a smaller grid
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from headroom_tasks import HEADROOM, HEADROOM_BENCH  # noqa: E402

import proftune  # noqa: E402


def _sibling(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module of its own name (a package ``optimize`` elsewhere on
    the path, as the test suite's, is not it)."""
    spec = importlib.util.spec_from_file_location(f"proftune_bench_{name}", HERE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_bench = _sibling("optimize")
_mean_std, defaults_arm, hyperband_arm = _bench._mean_std, _bench.defaults_arm, _bench.hyperband_arm
ours_arm, plain_fit, test_accuracy = _bench.ours_arm, _bench.plain_fit, _bench.test_accuracy

#: The oracle grid: learning rates (absolute, log-spaced) and batch sizes; the quick grid is coarser.
GRID_LR = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
GRID_BATCH = (16, 32, 64)
QUICK_LR = (3e-4, 3e-3, 3e-2)
QUICK_BATCH = (16, 64)
GRID_SEEDS = 3


def _time_defaults(task: proftune.Task) -> float:
    """Seconds of one full training of the defaults: the median of three."""
    times = []
    for seed in range(3):
        t0 = time.perf_counter()
        plain_fit(task, dict(task.default_params), task.default_epochs, seed)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def oracle(task: proftune.Task, lrs: tuple[float, ...], batches: tuple[int, ...]) -> dict[str, Any]:
    """Every cell of the grid at the full protocol over ``GRID_SEEDS`` seeds; the best by median test."""
    cells = []
    for lr in lrs:
        for bs in batches:
            params = {**task.default_params, "lr": lr, "batch_size": bs}
            tests = []
            for seed in range(GRID_SEEDS):
                model, _ = plain_fit(task, params, task.default_epochs, 500 + seed)
                tests.append(test_accuracy(task, model, bs))
            cells.append({"lr": lr, "batch_size": bs, "tests": tests, "median": statistics.median(tests)})
    best = max(cells, key=lambda c: c["median"])
    return {"best": best, "cells": cells}


def _paired(ours: list[float], other: list[float]) -> dict[str, float | None]:
    diffs = [a - b for a, b in zip(ours, other, strict=True) if math.isfinite(a) and math.isfinite(b)]
    ratios = [a / b for a, b in zip(ours, other, strict=True) if math.isfinite(a) and math.isfinite(b) and b > 0]
    return {"ratio": statistics.median(ratios) if ratios else None,
            "diff": statistics.fmean(diffs) if diffs else None,
            "se": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None}


def _noise(xs: list[float], test_n: int) -> float:
    """What two figures of one arm differ by without a cause: its seeds' spread, or one test sample."""
    spread = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return max(spread, 1.0 / max(test_n, 1))


def run_task(name: str, *, budgets: list[float], reps: int, grid: tuple[tuple[float, ...], tuple[int, ...]],
             tmp: Path, floor_s: float) -> dict[str, Any]:
    task = HEADROOM[name]()
    test_n = len(task._tensors()[5])  # type: ignore[attr-defined]
    measured = _time_defaults(task)
    t_one = max(measured, floor_s)
    print(f"\n== {name}: {task.description}; one training of the defaults {measured:.2f} s, the budget's unit "
          f"{t_one:.2f} s", flush=True)
    orc = oracle(task, *grid)
    best = orc["best"]
    print(f"oracle grid ({len(orc['cells'])} cells x {GRID_SEEDS} seeds): lr {best['lr']:g} batch "
          f"{best['batch_size']}: test {_mean_std(best['tests'])}", flush=True)
    defaults = [defaults_arm(task, seed) for seed in range(reps)]
    d_test = [float(d["test"]) for d in defaults]
    rows: dict[str, Any] = {"task": name, "description": task.description, "training_s": measured, "unit_s": t_one,
                            "test_n": test_n,
                            "oracle": orc, "defaults": defaults, "budgets": {}}
    for k in budgets:
        budget = k * t_one
        ours, optuna = [], []
        for rep in range(reps):
            try:
                ours.append(ours_arm(task, budget, rep, tmp, judge=task, goal="none"))
            except proftune.ProftuneError as exc:  # the user keeps their defaults, and the table says so
                ours.append({"test": d_test[rep], "decision": f"failed: {str(exc).splitlines()[0]}", "failed": True})
            optuna.append(hyperband_arm(task, budget, rep))
            print(f"  {k:g} trainings ({budget:.1f} s) rep {rep}: ours {ours[-1]['test']:.3f} "
                  f"({ours[-1]['decision']}), optuna {optuna[-1]['test']:.3f}, defaults {d_test[rep]:.3f}", flush=True)
        rows["budgets"][f"{k:g}"] = {"budget_s": budget, "ours": ours, "optuna": optuna,
                                     "summary": summarise(ours, optuna, d_test, best["median"], test_n)}
    return rows


def summarise(ours: list[dict[str, Any]], optuna: list[dict[str, Any]], d_test: list[float], oracle_test: float,
              test_n: int) -> dict[str, Any]:
    o = [float(r["test"]) for r in ours]
    p = [float(r["test"]) for r in optuna]
    d_mean = statistics.fmean(d_test)
    noise = _noise(d_test, test_n)
    headroom = oracle_test - d_mean
    has_headroom = headroom > 2 * noise
    share = (statistics.fmean(o) - d_mean) / headroom if has_headroom else None
    below = sum(1 for a, b in zip(o, d_test, strict=True) if a < b - 1.0 / test_n and a < d_mean - 2 * noise)
    failed = sum(1 for r in ours if r.get("failed"))
    vs = _paired(o, p)
    return {"ours": _mean_std(o), "optuna": _mean_std(p), "defaults": _mean_std(d_test), "oracle": oracle_test,
            "ratio_ours_optuna": vs["ratio"], "diff_ours_optuna": vs["diff"], "diff_se": vs["se"],
            "has_headroom": has_headroom, "share_of_oracle_gain": share, "below_defaults": below, "failed": failed,
            "ours_ge_optuna": vs["diff"] is not None and vs["diff"] >= -(vs["se"] or 0.0) - 1.0 / test_n}


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def table(results: list[dict[str, Any]]) -> None:
    print("\n| task | trainings | defaults | optuna+hyperband | ours | oracle | ours/optuna (paired) "
          "| ours - optuna | share of oracle gain | below defaults | ours failed (defaults kept) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for k, b in r["budgets"].items():
            s = b["summary"]
            diff = (f"{s['diff_ours_optuna']:+.3f} ± {s['diff_se']:.3f}" if s["diff_se"] is not None
                    else _fmt(s["diff_ours_optuna"], "+.3f"))
            print(f"| {r['task']} | {k} ({b['budget_s']:.0f} s) | {s['defaults']} | {s['optuna']} | {s['ours']} | "
                  f"{s['oracle']:.3f} | {_fmt(s['ratio_ours_optuna'], '.3f')} | {diff} | "
                  f"{_fmt(s['share_of_oracle_gain'], '.0%') if s['has_headroom'] else 'no headroom'} | "
                  f"{s['below_defaults']}/{len(b['ours'])} | {s.get('failed', 0)}/{len(b['ours'])} |")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--tasks", nargs="+", default=list(HEADROOM_BENCH), choices=sorted(HEADROOM),
                    metavar="TASK", help=f"of {', '.join(sorted(HEADROOM))} (default: the six of the benchmark)")
    ap.add_argument("--budgets", nargs="+", type=float, default=None,
                    help="budgets in full trainings of the defaults (default 8 16 32; --quick: 8 16)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (seeds) per arm (default 5; --quick: 2)")
    ap.add_argument("--training-s", type=float, default=2.0,
                    help="the budget's unit is one training of the defaults, or this many seconds if longer")
    ap.add_argument("--quick", action="store_true", help="budgets 8 and 16, 2 repetitions, a coarser oracle grid")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    args = ap.parse_args(argv)
    args.budgets = args.budgets or ([8.0, 16.0] if args.quick else [8.0, 16.0, 32.0])
    args.reps = args.reps or (2 if args.quick else 5)
    if args.reps < 1 or not args.training_s >= 0 or any(not math.isfinite(k) or k <= 0 for k in args.budgets):
        ap.error(f"--reps must be >= 1, --training-s >= 0 and --budgets positive trainings; got --reps {args.reps}, "
                 f"--training-s {args.training_s}, "
                 f"--budgets {' '.join(f'{k:g}' for k in args.budgets)}")
    if args.out is not None and args.out.exists() and not args.force:
        ap.error(f"--out {args.out} exists; pass --force to overwrite it, or name another file")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    grid = (QUICK_LR, QUICK_BATCH) if args.quick else (GRID_LR, GRID_BATCH)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.tasks:
            results.append(run_task(name, budgets=args.budgets, reps=args.reps, grid=grid, tmp=Path(tmp),
                                    floor_s=args.training_s))
            table(results)
            if args.out is not None:  # after each task: an interrupted run keeps what it measured
                args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                "results": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
