"""proftune's Ray Tune backend beside its local backend (issue 14), on digits-cnn.

Two parts (``--part parallel|compute|all``, default ``all``):

parallel  16 trials x 2 epochs of digits-cnn, space {lr log 1e-4..1e-1, width 8..64 step 8}, TPE,
          fixed seed, device cpu: wall time with 2 Ray workers vs 1 Ray worker (target ratio <= 0.6)
          and vs the local backend with 2 worker processes; the per-trial overhead of each backend
          (median over trials of the trial's span in the study, ask to tell, minus the trial's own
          duration_s: for Ray the actor start, the searcher round trip and the driver's records);
          best accuracy of each (should be about equal).
compute   equal compute (the same total epochs): Ray PBT, a population of P members x E*T/P
          epochs, beside Ray ASHA (T trials, at most E epochs each, halving every epoch) and the
          local TPE study (T trials x E epochs), all on 2 workers: best accuracy, total training
          steps (sum of the trials' steps) and wall time.

rescue    PBT on digits-mlp with SGD from a learning rate 10x too low (0.01, lr 1e-4..0.1), 10x too
          high (1.0, lr 1e-3..1.0) and the issue's start (no default: the range's centre 3.2e-3,
          lr 1e-4..0.1), a population of 4 for E epochs (``--pbt-epochs``, default 6) on 2 workers:
          the best accuracy of proftune's PBT (seeded, synchronous, ladder) beside the anchor, Ray
          Tune's stock PopulationBasedTraining on the same trainable and population (its defaults:
          asynchronous, a random parent from the top quarter, x0.8/x1.2 of a loguniform or a
          resample 25% of the time; unseeded, so ``--repeats`` runs, median and range), the
          fixed-rate run at the start (proftune.fit) and the best fixed rate on the ladder.

Every study gets a fresh temporary SQLite database and a fresh Ray storage folder; Ray starts a
local instance of its own per study (its start-up is inside the wall times). Trials train on one
CPU thread each. ``--quick``: 4 trials x 1 epoch (PBT 2 x 2), a few minutes. Wall times are
comparable within one run only. Writes nothing to the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

import proftune
from proftune.search import RayOptions

SPACE: dict[str, Any] = {"params": {
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "width": {"type": "int", "low": 8, "high": 64, "step": 8},
}}
TASK = "digits-cnn"


@dataclass
class Outcome:
    """What one study cost and found."""

    label: str
    wall_s: float
    trials: int
    complete: int
    pruned: int
    best: float | None
    steps: int
    median_trial_s: float | None
    overhead_s: float | None
    retries: int
    #: Epochs trained, counted from the per-epoch reports (Ray) or trials x epochs (local).
    epochs: int
    #: The best accuracy reported at any epoch of any trial (Ray: also trials stopped early).
    best_reported: float | None

    def row(self) -> str:
        return (f"{self.label:<22} {self.wall_s:7.1f} {self.complete:>3}/{self.trials:<3} {self.pruned:>6} "
                f"{_num(self.median_trial_s, 8, 2)} {_num(self.overhead_s, 8, 2)} "
                f"{_num(self.best, 8, 4)} {_num(self.best_reported, 8, 4)} {self.steps:>6} {self.epochs:>6}")


HEADER = (f"{'study':<22} {'wall s':>7} {'done':>7} {'pruned':>6} {'trial s':>8} {'ovh/tr s':>8} "
          f"{'best acc':>8} {'any-ep':>8} {'steps':>6} {'epochs':>6}")
LEGEND = ("done: complete/all trials; trial s: median duration_s of complete trials; ovh/tr s: median "
          "over trials of (span in the study - duration_s); best acc: best complete trial; any-ep: best "
          "accuracy reported at any epoch (Ray's per-epoch reports); steps: sum of trial steps; epochs: "
          "epochs trained (count of per-epoch reports under Ray)")


def _num(v: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:{width}.{digits}f}"


def _overheads(db: str, study: str, durations: dict[int, float]) -> list[float]:
    """Per trial: its span in the study (created to finished) minus its own duration_s."""
    out = []
    for t in optuna.load_study(study_name=study, storage=db).trials:
        own = durations.get(t.number)
        if t.datetime_start is None or t.datetime_complete is None or own is None:
            continue
        out.append((t.datetime_complete - t.datetime_start).total_seconds() - own)
    return out


def run_study(label: str, tmp: Path, *, trials: int, epochs: int, seed: int, backend: str,
              workers: int, scheduler: str = "fifo", population: int | None = None) -> Outcome:
    """One study on a fresh database (and Ray folder); wall time around the whole call."""
    key = label.replace(" ", "-").replace("/", "-")
    db = f"sqlite:///{tmp / f'{key}.db'}"
    ray = None
    if backend == "ray":
        ray = RayOptions(workers=workers, scheduler=scheduler, population=population,
                         storage_path=tmp / f"ray-{key}")
    print(f"  running {label} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    res = proftune.search(TASK, SPACE, trials=trials, epochs=epochs, seed=seed, device="cpu", db=db,
                          study=key, backend=backend, workers=workers if backend == "local" else 1,
                          ray=ray)
    wall = time.perf_counter() - t0
    done = [t for t in res.trials if t.state == "complete"]
    durations = {t.number: t.duration_s for t in done if t.duration_s is not None}
    # PBT adds its members after the fact: their spans in the study are not the trials' own
    over = [] if scheduler == "pbt" else _overheads(db, key, durations)
    accs = [float(t.metrics["accuracy"]) for t in done if "accuracy" in t.metrics]
    points = [p for pts in res.backend.get("schedule", {}).values() for p in pts]
    reported = [float(p["objective"]) for p in points if p.get("objective") is not None]
    if backend == "ray":
        epochs_trained = len(points)
        for number, pts in res.backend.get("schedule", {}).items():  # on stderr, for a diagnosis
            print(f"    trial {number}: reported epochs {[p.get('epoch') for p in pts]}", file=sys.stderr)
        for t in res.trials:
            print(f"    trial {t.number}: {t.state}, {t.steps} steps, {_num(t.duration_s, 0, 1)} s, "
                  f"params {t.params}, {t.reason or ''}", file=sys.stderr)
    else:
        epochs_trained = sum(epochs for t in res.trials if t.steps > 0)
    return Outcome(
        label=label, wall_s=wall, trials=len(res.trials), complete=len(done),
        pruned=sum(t.state == "pruned" for t in res.trials),
        best=max(accs) if accs else None, steps=sum(t.steps for t in res.trials),
        median_trial_s=statistics.median(durations.values()) if durations else None,
        overhead_s=statistics.median(over) if over else None,
        retries=int(res.backend.get("retries", 0)), epochs=epochs_trained,
        best_reported=max(reported) if reported else (max(accs) if accs else None))


def part_parallel(args: argparse.Namespace, tmp: Path) -> bool:
    n, e = args.trials, args.epochs
    print(f"\n== parallel: {TASK}, {n} trials x {e} epochs, TPE, seed {args.seed}, cpu ==", flush=True)
    common = {"trials": n, "epochs": e, "seed": args.seed}
    ray2 = run_study("ray 2 workers", tmp, backend="ray", workers=2, **common)
    ray1 = run_study("ray 1 worker", tmp, backend="ray", workers=1, **common)
    local2 = run_study("local 2 workers", tmp, backend="local", workers=2, **common)
    print(HEADER)
    for o in (ray2, ray1, local2):
        print(o.row())
    print(LEGEND)
    speed = ray2.wall_s / ray1.wall_s
    vs_local = ray2.wall_s / local2.wall_s
    print(f"wall ray 2 workers / ray 1 worker: {speed:.2f} (target <= 0.60)")
    print(f"wall ray 2 workers / local 2 workers: {vs_local:.2f} ({ray2.wall_s - local2.wall_s:+.1f} s)")
    if ray2.overhead_s is not None and local2.overhead_s is not None:
        print(f"per-trial overhead (median span minus own duration): ray {ray2.overhead_s:.2f} s "
              f"(1 worker {_num(ray1.overhead_s, 0, 2)} s) vs local {local2.overhead_s:.2f} s: "
              f"ratio {ray2.overhead_s / max(local2.overhead_s, 1e-6):.1f}x, "
              f"{ray2.overhead_s - local2.overhead_s:+.2f} s per trial")
    bests = [o.best for o in (ray2, ray1, local2)]
    spread = (max(b for b in bests if b is not None) - min(b for b in bests if b is not None)
              if all(b is not None for b in bests) else float("inf"))
    print(f"best accuracy spread across the three: {spread * 100:.2f} pt; Ray retries: "
          f"{ray2.retries + ray1.retries}")
    return speed <= 0.60 and all(o.complete == n for o in (ray2, ray1, local2))


def part_compute(args: argparse.Namespace, tmp: Path) -> bool:
    n, e, pop = args.trials, args.epochs, args.population
    budget = n * e
    if budget % pop:
        raise SystemExit(f"--population {pop} does not divide the budget {n} x {e} = {budget} epochs")
    pbt_epochs = budget // pop
    print(f"\n== compute: {TASK}, {budget} trial-epochs each, 2 workers, seed {args.seed} ==", flush=True)
    pbt = run_study(f"ray pbt {pop}x{pbt_epochs}ep", tmp, trials=pop, epochs=pbt_epochs, seed=args.seed,
                    backend="ray", workers=2, scheduler="pbt", population=pop)
    asha = run_study(f"ray asha {n}x<={e}ep", tmp, trials=n, epochs=e, seed=args.seed, backend="ray",
                     workers=2, scheduler="asha")
    tpe = run_study(f"local tpe {n}x{e}ep", tmp, trials=n, epochs=e, seed=args.seed, backend="local",
                    workers=2)
    print(HEADER)
    for o in (pbt, asha, tpe):
        print(o.row())
    print(LEGEND)
    anchor = tpe.best or 0.0
    for o in (pbt, asha):
        print(f"{o.label} vs local TPE: best complete trial {_num(o.best, 0, 4)} vs {anchor:.4f} "
              f"({((o.best or 0.0) - anchor) * 100:+.2f} pt), best at any epoch "
              f"{_num(o.best_reported, 0, 4)}; steps {o.steps} vs {tpe.steps} (ratio "
              f"{o.steps / max(tpe.steps, 1):.2f}); epochs trained {o.epochs} vs {tpe.epochs} of "
              f"{budget}; wall ratio {o.wall_s / tpe.wall_s:.2f}")
    if asha.pruned:
        print("note: a trial ASHA stopped at a rung sends no record (its steps count 0 here); "
              "'epochs' and 'any-ep' come from Ray's per-epoch reports and include those trials")
    return all(o.best is not None for o in (pbt, asha, tpe))


RESCUE = (  # (label, start or None for the range's centre, low, high)
    ("10x too low", 0.01, 1e-4, 0.1),
    ("10x too high", 1.0, 1e-3, 1.0),
    ("issue 22 start", None, 1e-4, 0.1),
)
RESCUE_TASK = "digits-mlp"


def _stock_pbt_class() -> type:
    """Ray Tune's PopulationBasedTraining with its defaults, built where proftune builds its own."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    class StockPBT(PopulationBasedTraining):
        def __init__(self, *, seed: int, hyperparam_mutations: dict[str, list[float]], quantile_fraction: float,
                     resample_probability: float, synch: bool, **kw: Any) -> None:
            # what a Ray user writes: the declared range as a loguniform, everything else Ray's default
            super().__init__(hyperparam_mutations={k: tune.loguniform(min(v), max(v))
                                                   for k, v in hyperparam_mutations.items()}, **kw)

    return StockPBT


def _pbt_best(tmp: Path, key: str, lr: dict[str, Any], epochs: int, seed: int, *, stock: bool) -> tuple[float, float]:
    """(best accuracy, the highest lr any member trained at) of one PBT study on 2 workers."""
    from unittest import mock

    from proftune.search import _ray

    space = {"params": {"lr": lr}, "fixed": {"optimizer": "sgd"}}
    patch = mock.patch.object(_ray, "_pbt_class", _stock_pbt_class) if stock else contextlib.nullcontext()
    if stock:
        random.seed(seed)  # Ray's PBT draws from the global generator; this does not make it repeatable
    print(f"  running {'ray stock' if stock else 'proftune'} pbt {key} ...", file=sys.stderr, flush=True)
    with patch:
        res = proftune.search(RESCUE_TASK, space, trials=4, epochs=epochs, seed=seed, device="cpu",
                              db=f"sqlite:///{tmp / f'{key}.db'}", study=key, backend="ray",
                              ray=RayOptions(workers=2, scheduler="pbt", population=4, storage_path=tmp / f"ray-{key}"))
    accs = [float(t.metrics["accuracy"]) for t in res.trials if t.state == "complete" and "accuracy" in t.metrics]
    lrs = [float(p["lr"]) for pts in res.backend.get("schedule", {}).values() for p in pts if p.get("lr")]
    return (max(accs) if accs else float("nan")), (max(lrs) if lrs else float("nan"))


def part_rescue(args: argparse.Namespace, tmp: Path) -> bool:
    from proftune.search import Space
    from proftune.search._pbt import ladder as _ladder

    e = args.pbt_epochs
    print(f"\n== rescue: {RESCUE_TASK}, SGD, PBT 4 members x {e} epochs, 2 workers, seed {args.seed}; "
          f"Ray stock PBT x{args.repeats} ==", flush=True)
    rows, ok = [], True
    for label, start, low, high in RESCUE:
        lr: dict[str, Any] = {"type": "float", "low": low, "high": high, "log": True}
        if start is not None:
            lr["default"] = start
        param = Space.from_dict({"params": {"lr": lr}}).params[0]
        begin = float(param.center())
        fixed = {rung: proftune.fit(RESCUE_TASK, {"lr": rung, "optimizer": "sgd"}, epochs=e, device="cpu",
                                    seed=args.seed).metrics["accuracy"] for rung in _ladder(param)}
        at_start = fixed[begin]
        best_rung = max(fixed, key=lambda r: fixed[r])
        key = label.replace(" ", "-")
        ours, ours_top = _pbt_best(tmp, f"ours-{key}", lr, e, args.seed, stock=False)
        stock = [_pbt_best(tmp, f"stock-{key}-{i}", lr, e, args.seed + i, stock=True)[0]
                 for i in range(args.repeats)]
        med = statistics.median(stock)
        rows.append((label, begin, at_start, best_rung, fixed[best_rung], ours, ours_top, med, min(stock), max(stock)))
        ok = ok and ours >= at_start + 0.2
    print(f"{'start':<15} {'lr':>7} {'fixed@start':>11} {'best rung':>15} {'proftune PBT':>12} {'top lr':>7} "
          f"{'Ray stock PBT med [min, max]':>29} {'ours-stock':>10} {'ours-fixed':>10}")
    for label, begin, at_start, rung, at_rung, ours, top, med, lo, hi in rows:
        print(f"{label:<15} {begin:7.3g} {at_start:11.4f} {at_rung:8.4f} @{rung:<6.3g} {ours:12.4f} {top:7.3g} "
              f"{med:12.4f} [{lo:.4f}, {hi:.4f}]   {(ours - med) * 100:+8.1f}pt {(ours - at_start) * 100:+8.1f}pt")
    print("fixed@start: proftune.fit at the start for the same epochs; best rung: the best fixed rate on the "
          "ladder (an oracle: one full run per rung); top lr: the highest rate any member trained at; "
          "ours-stock: proftune's PBT minus the median of Ray's stock PBT, in accuracy points")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("parallel", "compute", "rescue", "all"), default="all")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--population", type=int, default=4, help="PBT members (divides trials x epochs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pbt-epochs", type=int, default=6, help="rescue: epochs of each PBT member")
    ap.add_argument("--repeats", type=int, default=3, help="rescue: runs of Ray's stock (unseeded) PBT")
    ap.add_argument("--quick", action="store_true", help="4 trials x 1 epoch, PBT 2 x 2: a few minutes")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.epochs, args.population = 4, 1, 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    results = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="proftune-ray-bench-") as d:
        tmp = Path(d)
        parts = ("parallel", "compute", "rescue") if args.part == "all" else (args.part,)
        for part in parts:
            results[part] = {"parallel": part_parallel, "compute": part_compute,
                             "rescue": part_rescue}[part](args, tmp)
    verdicts = ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in results.items())
    print(f"\n{verdicts} ({time.perf_counter() - started:.0f} s in all)")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
