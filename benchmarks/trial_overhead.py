"""What a search trial costs beside a plain Optuna loop's, training the same model (issue 60).

The same configurations (drawn once from a seeded RNG: lr, weight decay, dropout, batch) are
trained by each arm, in rounds, the arms in a rotated order each round:

- ``plain``: the loop a user writes: an in-memory Optuna study whose objective builds the task's
  model, trains it with AdamW for the epochs, and returns its validation accuracy (the anchor);
- ``search``: one call of ``proftune.search`` with the configurations enqueued (a SQLite store
  in a temporary folder, pruner none, the trial Runs recorded as always);
- ``chunks``: ``proftune.search`` called once per chunk of ``--chunk`` configurations on one
  study, as ``optimize``'s search stage calls it (a chunk of about a second of trials).

Every arm trains at ``--threads`` torch threads (1: timed comparisons on a shared machine run at
one). Each arm's figure is its wall time per trial; the figure of record is the median over rounds of
the round's ratio to the plain loop (paired: load drifting over the run cancels out), with a
bootstrap 95% interval. The goal: <= 1.1x.

    python benchmarks/trial_overhead.py [--task noisy-labels] [--trials 12] [--epochs 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import torch
from torch import nn

import proftune

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paired import median_interval
from headroom_tasks import HEADROOM

SPACE = {"params": {"lr": {"type": "float", "low": 1e-4, "high": 3e-2, "log": True},
                    "weight_decay": {"type": "float", "low": 1e-6, "high": 1e-1, "log": True},
                    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
                    "batch_size": {"type": "categorical", "choices": [16, 32, 64, 128]}}}


def configurations(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"lr": 10 ** rng.uniform(-4, -1.6), "weight_decay": 10 ** rng.uniform(-6, -1),
             "dropout": rng.uniform(0.0, 0.5), "batch_size": rng.choice([16, 32, 64, 128])} for _ in range(n)]


def plain_arm(task: proftune.Task, configs: list[dict[str, Any]], epochs: int, *,
              asha: bool = False) -> tuple[float, int]:
    """Seconds of the user's own loop over ``configs`` (an in-memory Optuna study) and the epochs
    it trained; ``asha``: evaluated each epoch, reported, pruned as Optuna's docs show."""
    trained = 0

    def objective(trial: optuna.Trial) -> float:
        p = {"lr": trial.suggest_float("lr", 1e-4, 3e-2, log=True),
             "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-1, log=True),
             "dropout": trial.suggest_float("dropout", 0.0, 0.5),
             "batch_size": trial.suggest_categorical("batch_size", [16, 32, 64, 128])}
        torch.manual_seed(trial.number)
        model = task.build_model({**task.default_params, **p})
        opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], weight_decay=p["weight_decay"])
        nonlocal trained
        for epoch in range(1, epochs + 1):
            model.train()
            for x, y in task.train_data(p["batch_size"], p):
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            trained += 1
            if asha or epoch == epochs:
                acc = accuracy(model)
            if asha:
                trial.report(acc, epoch)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        return acc

    def accuracy(model: nn.Module) -> float:
        model.eval()
        right = total = 0
        with torch.no_grad():
            for x, y in task.val_data(256):
                right += int((model(x).argmax(1) == y).sum())
                total += len(y)
        return right / total

    pruner = (optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3) if asha
              else optuna.pruners.NopPruner())
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0), pruner=pruner)
    for c in configs:
        study.enqueue_trial(c)
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=len(configs))
    return time.perf_counter() - t0, trained


def search_arm(task: proftune.Task, configs: list[dict[str, Any]], epochs: int, folder: Path, *,
               chunk: int | None, asha: bool = False) -> tuple[float, int]:
    """Seconds of ``proftune.search`` over ``configs`` (one call, or one call per ``chunk``) and
    the epochs its trials trained; ``asha``: ASHA at the plain loop's rungs (first 1, factor 3)."""
    db = f"sqlite:///{folder / 'p.db'}"
    store = proftune.Store(db)
    groups = [configs] if chunk is None else [configs[i:i + chunk] for i in range(0, len(configs), chunk)]
    study = f"overhead-{time.time_ns()}"
    space = {**SPACE, "pruner": {"min_resource": 1, "reduction_factor": 3}} if asha else SPACE
    t0 = time.perf_counter()
    done = 0
    for group in groups:
        done += len(group)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = proftune.search(task, space, objectives=["accuracy:max"], trials=done, sampler="random",
                                     pruner="asha" if asha else "none", epochs=epochs, study=study, store=store,
                                     seed=0, device="cpu", scan=0, analyse=False,
                                     enqueue=[{"params": c} for c in group])
    seconds = time.perf_counter() - t0
    return seconds, sum(t.epochs for t in result.trials)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="noisy-labels", choices=sorted(HEADROOM))
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=["plain", "search", "chunks"])
    ap.add_argument("--pruner", choices=["none", "asha"], default="none",
                    help="asha: every arm evaluates and reports each epoch and prunes (first rung 1, factor 3); "
                         "the figure is then per trained epoch")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every arm (fit's through "
                                                           "$PROFTUNE_THREADS)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["PROFTUNE_THREADS"] = str(args.threads)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    task = HEADROOM[args.task]()
    configs = configurations(args.trials)
    plain_arm(task, configs[:1], 1)  # warm-up outside every clock
    per: dict[str, list[float]] = {a: [] for a in args.arms}
    asha = args.pruner == "asha"
    unit = "epoch" if asha else "trial"
    print(f"== {args.task}: {args.trials} configurations x {args.epochs} epoch(s), {args.rounds} rounds, pruner "
          f"{args.pruner}; torch threads {torch.get_num_threads()}; ms per {unit}", flush=True)
    for r in range(args.rounds):
        order = args.arms[r % len(args.arms):] + args.arms[:r % len(args.arms)]
        for arm in order:
            with tempfile.TemporaryDirectory(prefix="proftune-overhead-") as tmp:
                if arm == "plain":
                    s, n = plain_arm(task, configs, args.epochs, asha=asha)
                else:
                    s, n = search_arm(task, configs, args.epochs, Path(tmp),
                                      chunk=args.chunk if arm == "chunks" else None, asha=asha)
            per[arm].append(s / (n if asha else args.trials))
        print(f"round {r + 1}: " + ", ".join(f"{a} {per[a][-1] * 1000:.0f} ms/{unit}" for a in args.arms),
              flush=True)
    print(f"{'arm':<8} {f'ms/{unit} (median)':>18} {'ratio to plain (median, 95% CI)':>34}")
    for a in args.arms:
        med = statistics.median(per[a]) * 1000
        if a == "plain" or "plain" not in per:
            print(f"{a:<8} {med:>18.0f} {'1.00 (anchor)' if a == 'plain' else '-':>34}")
            continue
        ratios = [x / p for x, p in zip(per[a], per["plain"], strict=True)]
        lo, hi = median_interval(ratios)
        print(f"{a:<8} {med:>18.0f} {statistics.median(ratios):>20.2f} [{lo:.2f}, {hi:.2f}]")


if __name__ == "__main__":
    main()
