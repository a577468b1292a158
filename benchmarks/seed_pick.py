"""Which of the chosen configuration's seeds to hand back (issue 45): the one best on validation,
or the median one?

The race decides on a configuration by its mean over paired seeds; the model it saves is one of
those seeds. A seed's validation figure is its model's quality plus the validation set's draw. If
the draw were all of it, the best seed would be the luckiest and no better than the median on new
data; if part of it is the model's own, the best is better on new data in expectation.

Measured here on the headroom tasks (``benchmarks/headroom_tasks.py``), each at one good
configuration (the oracle grid's best cell of ``benchmarks/headroom.py``'s last full run, or
``--lr``/``--batch``): ``--seeds`` trainings at the task's own protocol, each on the race's
partition of the training and validation samples where the task offers them
(``Task.resplit``), judged on the test split no arm selects on. Then ``--draws`` groups of
``--k`` seeds are drawn from them, as a race of ``k`` rounds would hold, and three picks are
compared on test:

- ours: ``proftune.optimize._final.representative`` (the best on validation; its note's expected
  figure is the gain shrunk toward the mean);
- median: the seed whose validation figure is the group's median (the rule before this round);
- random: any seed (what a single training hands back).

Printed per task: the correlation of validation and test across seeds, each pick's mean test
accuracy, and ours - median. Trainings are the plain PyTorch loop of ``benchmarks/optimize.py``.

    python benchmarks/seed_pick.py [--tasks few-shot big-batch ...] [--seeds 30] [--k 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from headroom import plain_fit, test_accuracy  # noqa: E402
from headroom_tasks import HEADROOM  # noqa: E402

from proftune.optimize._final import ArmRun, representative, sampling_std  # noqa: E402

#: One good configuration per task: the oracle grid's best cell (lr, batch) in the last full run.
GOOD = {"few-shot": (1e-2, 32), "big-batch": (3e-3, 16), "lr-too-high": (3e-3, 32), "noisy-labels": (3e-4, 16)}


def trainings(name: str, lr: float, batch: int, seeds: int) -> list[tuple[float, float]]:
    """(validation, test) of ``seeds`` trainings of the task at ``lr`` and ``batch``."""
    task = HEADROOM[name]()
    params = {**task.default_params, "lr": lr, "batch_size": batch}
    out = []
    for i in range(seeds):
        part = task.resplit(i + 1) or task
        model, val = plain_fit(part, params, task.default_epochs, 900 + i)
        out.append((val, test_accuracy(task, model, batch)))
    return out


def picks(rows: list[tuple[float, float]], *, k: int, draws: int, val_samples: int) -> dict[str, float]:
    rng = random.Random(0)
    got: dict[str, list[float]] = {"ours": [], "median": [], "random": []}
    for _ in range(draws):
        group = rng.sample(range(len(rows)), k)
        runs = [ArmRun(seed=i, run_id=None, val=rows[i][0], test=rows[i][1], epochs=0, duration_s=0.0, cut=False)
                for i in group]
        level = statistics.fmean(r.val for r in runs if r.val is not None)
        ours, _ = representative(runs, sampling_std=sampling_std("accuracy", val_samples, level))
        assert ours is not None
        mid = statistics.median(rows[i][0] for i in group)
        median = min(group, key=lambda i: (abs(rows[i][0] - mid), i))
        got["ours"].append(rows[ours.seed][1])
        got["median"].append(rows[median][1])
        got["random"].append(rows[rng.choice(group)][1])
    return {key: statistics.fmean(v) for key, v in got.items()}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(GOOD), choices=sorted(GOOD))
    ap.add_argument("--seeds", type=int, default=30, help="trainings per task (default 30)")
    ap.add_argument("--k", type=int, default=10, help="seeds per race (default 10, the race's most)")
    ap.add_argument("--draws", type=int, default=2000, help="races drawn from the trainings (default 2000)")
    args = ap.parse_args(argv)
    if args.k < 2 or args.seeds < args.k:
        ap.error(f"--k {args.k} and --seeds {args.seeds}: need 2 <= k <= seeds")
    if args.draws < 1:
        ap.error(f"--draws {args.draws}: need at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    lines: list[dict[str, Any]] = []
    for name in args.tasks:
        lr, batch = GOOD[name]
        rows = trainings(name, lr, batch, args.seeds)
        vals, tests = zip(*rows, strict=True)
        val_samples = len(HEADROOM[name]()._tensors()[3])  # type: ignore[attr-defined]
        got = picks(rows, k=args.k, draws=args.draws, val_samples=val_samples)
        lines.append({"task": name, "corr": statistics.correlation(vals, tests), **got})
        print(f"{name}: lr {lr:g} batch {batch}, {args.seeds} seeds: val {statistics.fmean(vals):.3f} +- "
              f"{statistics.stdev(vals):.3f}, test {statistics.fmean(tests):.3f} +- {statistics.stdev(tests):.3f}",
              flush=True)
    print(f"\n| task | corr(val, test) | ours: best of {args.k} on val | median of {args.k} | random | ours - median |")
    print("|---|---|---|---|---|---|")
    for r in lines:
        print(f"| {r['task']} | {r['corr']:.2f} | {r['ours']:.4f} | {r['median']:.4f} | {r['random']:.4f} | "
              f"{r['ours'] - r['median']:+.4f} |")


if __name__ == "__main__":
    main()
