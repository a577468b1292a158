"""proftune's profile-gated search beside plain Optuna, on the same tasks, trials and seeds.

Three parts (``--part gate|prune|overhead|all``, default ``gate``):

gate      digits-cnn, space {lr, batch_size, width, dropout}, a step-time constraint set at the
          60th percentile of step times measured on a Halton sample of the space (~40% of the
          space infeasible). proftune.search (its defaults: TPE, gated: profiles each
          configuration for a few steps, trains only feasible ones), once with its feasibility
          scan (the default with a hard profile constraint: Halton profiles first, the space
          restricted to where the constraint holds) and once without (--scan 0), beside plain
          Optuna TPE (its defaults) with the same constraint reported through
          Trial.set_constraint after training. Same trained-trial count, epochs, training code
          (proftune.fit), 3 seeds. Per run: share of sampled configurations that were
          infeasible, trained trials per minute, time to reach Optuna's best (ratio to Optuna's
          wall time; the scan's own time included), best feasible accuracy.
prune     digits-mlp, the same random-sampled search with and without the median pruner:
          total training steps and best accuracy.
overhead  trials that do nothing (a one-sample task, one step) on SQLite: per-trial wall time of
          proftune's loop beside plain Optuna's with the same work, and the difference.

Everything runs on one CPU thread (the machine is shared; threads make timings erratic). Wall
times are comparable within one run only. Writes nothing to the repository (temp databases).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, ClassVar

import optuna
import torch
from torch import nn

import proftune
from proftune.exceptions import ProblemCollector
from proftune.search import ProfileGate, load_space, parse_constraint
from proftune.search._storage import open_storage
from proftune.train import Callback, FitState

GATE_SPACE: dict[str, Any] = {"params": {
    "lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True},
    "batch_size": {"type": "categorical", "choices": [32, 64, 128]},
    "width": {"type": "int", "low": 8, "high": 64, "step": 8},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
}}
PRUNE_SPACE: dict[str, Any] = {"params": {
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "hidden": {"type": "int", "low": 16, "high": 256, "log": True},
    "batch_size": {"type": "categorical", "choices": [32, 64, 128]},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
}}


# -- part 1: gated search vs plain Optuna with constraints --------------------------------------
def calibrate(n: int, seed: int) -> tuple[float, list[float]]:
    """Step times (ms) of ``n`` Halton configurations; the 60th percentile is the limit."""
    space = load_space(GATE_SPACE)
    task = proftune.load_task("digits-cnn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.QMCSampler(qmc_type="halton", scramble=True, seed=seed + 99)
    study = optuna.create_study(sampler=sampler)
    any_time = parse_constraint("step_time_ms<1e9", ProblemCollector())
    assert any_time is not None
    gate = ProfileGate([any_time], steps=3, warmup=1, device="cpu", seed=0)  # what the search measures
    gate.check(task, {**task.default_params, "width": 8, "batch_size": 32})
    times = []
    for _ in range(n):
        trial = study.ask()
        params = space.suggest(trial)
        ms = gate.check(task, {**task.default_params, **params}).metrics["step_time_ms"]
        times.append(ms)
        study.tell(trial, ms)
    return statistics.quantiles(times, n=10)[5], times


class _StepTimes(Callback):
    """Median step time of a training run (after the first step), as plain Optuna users measure it."""

    def __init__(self) -> None:
        self.ms: list[float] = []

    def on_fit_start(self, state: FitState) -> None:
        state.sync_timing = True

    def on_step_end(self, state: FitState) -> None:
        if state.step > 1:
            self.ms.append(state.timing["step_ms"])


def _timeline(study: optuna.Study, started: float) -> list[tuple[float, float | None]]:
    """(seconds since the search started, accuracy if feasible else None) per finished trial."""
    out = []
    for t in study.trials:
        if t.datetime_complete is None:
            continue
        feasible = t.state == optuna.trial.TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values())
        out.append((t.datetime_complete.timestamp() - started, float(t.value) if feasible else None))
    return sorted(out)


def _time_to(timeline: list[tuple[float, float | None]], target: float) -> float | None:
    for when, acc in timeline:
        if acc is not None and acc >= target - 1e-12:
            return when
    return None


def plain_optuna(limit_ms: float, trials: int, epochs: int, seed: int, db: str) -> dict[str, Any]:
    """Optuna TPE (its defaults): sample, train, then report the measured step time as a constraint."""
    space = load_space(GATE_SPACE)
    task = proftune.load_task("digits-cnn")
    started = time.time()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed),
                                storage=optuna.storages.RDBStorage(db))
    infeasible_s = 0.0

    def objective(trial: optuna.Trial) -> float:
        nonlocal infeasible_s
        t0 = time.perf_counter()
        params = space.suggest(trial)
        meter = _StepTimes()
        result = proftune.fit(task, params, epochs=epochs, device="cpu", seed=seed, callbacks=[meter])
        step_ms = statistics.median(meter.ms)
        violation = (step_ms - limit_ms) / limit_ms
        trial.set_constraint("step_time_ms", violation if violation != 0 else 1e-9)
        if violation > 0:
            infeasible_s += time.perf_counter() - t0
        return result.metrics["accuracy"]

    study.optimize(objective, n_trials=trials)
    wall = time.time() - started
    timeline = _timeline(study, started)
    accs = [a for _, a in timeline if a is not None]
    n_inf = sum(1 for t in study.trials if any(v > 0 for v in t.constraints.values()))
    return {"wall_s": wall, "best": max(accs) if accs else None, "infeasible_s": infeasible_s,
            "infeasible": n_inf, "timeline": timeline, "infeasible_train_s": infeasible_s,
            "sampled": len(study.trials), "trained": len(study.trials), "scan_s": 0.0}


def ours(limit_ms: float, trials: int, epochs: int, seed: int, db: str, *, scan: int | None = None) -> dict[str, Any]:
    """proftune.search with its defaults (TPE, gated by the step-time constraint; ``scan=0``: no scan)."""
    started = time.time()
    study = f"bench-{seed}-{'scan' if scan is None else scan}"
    result = proftune.search("digits-cnn", GATE_SPACE, constraints=[f"step_time_ms<{limit_ms:.3f}"],
                             trials=trials, epochs=epochs, sampler="tpe", seed=seed, device="cpu",
                             db=db, study=study, scan=scan)
    wall = time.time() - started
    inf = [t for t in result.trials if t.state == "infeasible"]
    timeline = _timeline(optuna.load_study(study_name=study, storage=db), started)
    return {"wall_s": wall, "best": result.best.metrics["accuracy"] if result.best else None,
            "infeasible_s": sum(t.duration_s or 0.0 for t in inf), "infeasible": len(inf),
            "infeasible_train_s": sum(t.train_s for t in inf), "timeline": timeline,
            "sampled": len(result.trials), "trained": result.budget()["trained"],
            "scan_s": result.scan.duration_s if result.scan else 0.0,
            "bounds": [b.describe() for b in result.scan.bounds] if result.scan else []}


def _row(name: str, r: dict[str, Any], optuna_run: dict[str, Any]) -> dict[str, Any]:
    reach = _time_to(r["timeline"], optuna_run["best"]) if optuna_run["best"] is not None else None
    return {"name": name, "infeasible_share": r["infeasible"] / max(r["sampled"], 1),
            "trained_per_min": r["trained"] / (r["wall_s"] / 60), "reach_s": reach,
            "reach_ratio": (reach / optuna_run["wall_s"]) if reach is not None else float("inf"),
            "best": r["best"], "wall_s": r["wall_s"], "scan_s": r["scan_s"]}


def part_gate(args: argparse.Namespace, tmp: Path) -> bool:
    limit, times = calibrate(args.calibration, seed=0)
    frac = sum(t >= limit for t in times) / len(times)
    print(f"\n== gate: digits-cnn, {args.trials} trained trials x {args.epochs} epochs, seeds {args.seeds} ==")
    print(f"step-time limit {limit:.2f} ms = 60th percentile of {len(times)} Halton configurations "
          f"(min {min(times):.1f}, max {max(times):.1f} ms): {frac:.0%} of the sample infeasible")
    print(f"{'seed':>4}  {'run':<18} {'infeasible':>10} {'trained/min':>11} {'to Optuna best':>15} "
          f"{'ratio':>6} {'best acc':>8} {'wall s':>7} {'scan s':>6}")
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        runs: dict[str, dict[str, Any]] = {}
        # rotate the order so that no method always runs on a warmer or quieter machine
        names = ["optuna", "proftune-scan", "proftune-noscan"]
        for name in names[seed % 3:] + names[:seed % 3]:
            db = f"sqlite:///{tmp / f'{name}-{seed}.db'}"
            if name == "optuna":
                runs[name] = plain_optuna(limit, args.trials, args.epochs, seed, db)
            else:
                runs[name] = ours(limit, args.trials, args.epochs, seed, db,
                                  scan=None if name == "proftune-scan" else 0)
        for name in ("optuna", "proftune-noscan", "proftune-scan"):
            row = {**_row(name, runs[name], runs["optuna"]), "seed": seed}
            rows.append(row)
            reach = "never" if row["reach_s"] is None else f"{row['reach_s']:.1f} s"
            print(f"{seed:>4}  {name:<18} {row['infeasible_share']:>10.0%} {row['trained_per_min']:>11.1f} "
                  f"{reach:>15} {row['reach_ratio']:>6.2f} {_acc(row['best']):>8} {row['wall_s']:>7.1f} "
                  f"{row['scan_s']:>6.1f}")
        for text in runs["proftune-scan"].get("bounds", []):
            print(f"      scan bound: {text}")
    return _gate_summary(rows)


def _gate_summary(rows: list[dict[str, Any]]) -> bool:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["name"] == name)

    by_seed: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], {})[r["name"]] = r
    acc_ok = all((s["proftune-scan"]["best"] or 0) >= (s["optuna"]["best"] or 0) - 1e-9 for s in by_seed.values())
    print("medians over seeds:")
    for name in ("optuna", "proftune-noscan", "proftune-scan"):
        print(f"  {name:<18} infeasible {med(name, 'infeasible_share'):.0%}, trained/min "
              f"{med(name, 'trained_per_min'):.1f}, time to Optuna's best {med(name, 'reach_ratio'):.2f} of "
              f"Optuna's wall time")
    inf, ratio = med("proftune-scan", "infeasible_share"), med("proftune-scan", "reach_ratio")
    print(f"with the scan: infeasible share {inf:.0%} (goal <= 10%), time-to-best ratio {ratio:.2f} "
          f"(goal <= 0.35; without the scan {med('proftune-noscan', 'reach_ratio'):.2f}), best accuracy "
          f"equal or better than Optuna's on every seed: {acc_ok}")
    return inf <= 0.10 and ratio <= 0.35 and acc_ok


def _acc(v: float | None) -> str:
    return "  none" if v is None else f"{v:.4f}"


# -- part 2: median pruner vs none ----------------------------------------------------------------
def part_prune(args: argparse.Namespace, tmp: Path) -> bool:
    print(f"\n== prune: digits-mlp, random sampler, {args.prune_trials} trials x {args.prune_epochs} "
          f"epochs, median pruner vs none ==")
    rows = []
    for seed in args.seeds:
        out = {}
        for pruner in ("none", "median"):
            t0 = time.perf_counter()
            r = proftune.search("digits-mlp", PRUNE_SPACE, trials=args.prune_trials,
                                epochs=args.prune_epochs, sampler="random", pruner=pruner, seed=seed,
                                device="cpu", db=f"sqlite:///{tmp / f'prune-{pruner}-{seed}.db'}",
                                study="prune")
            out[pruner] = {"steps": sum(t.steps for t in r.trials), "wall_s": time.perf_counter() - t0,
                           "best": r.best.metrics["accuracy"] if r.best else 0.0,
                           "pruned": r.counts()["pruned"]}
        n, m = out["none"], out["median"]
        factor = n["steps"] / max(m["steps"], 1)
        gap = (n["best"] - m["best"]) * 100
        rows.append((n, m, factor, gap))
        print(f"seed {seed}: no pruning {n['steps']} steps, best acc {n['best']:.4f}, {n['wall_s']:.1f} s | "
              f"median {m['steps']} steps ({m['pruned']} pruned), best acc {m['best']:.4f}, "
              f"{m['wall_s']:.1f} s | {factor:.2f}x fewer steps, accuracy gap {gap:+.2f} pt")
    med = statistics.median(f for _, _, f, _ in rows)
    total = sum(n["steps"] for n, *_ in rows) / max(sum(m["steps"] for _, m, *_ in rows), 1)
    worst_gap = max(g for *_, g in rows)
    print(f"median over seeds {med:.2f}x fewer training steps (all seeds together {total:.2f}x; target "
          f">= 2); largest best-accuracy gap {worst_gap:+.2f} pt (target <= 0.5)")
    return med >= 2.0 and worst_gap <= 0.5


# -- part 3: per-trial overhead -------------------------------------------------------------------
class NullTask(proftune.Task):
    """A trial that does nothing: one sample, one weight, one step."""

    name = "null"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 1}
    metrics: ClassVar[list[str]] = ["val_loss"]
    _x = torch.zeros(1, 1)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Linear(1, 1)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        return [(self._x, self._x)]

    def val_data(self, batch_size: int) -> Any:
        return [(self._x, self._x)]

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return ((model(x) - y) ** 2).mean()


def part_overhead(args: argparse.Namespace, tmp: Path) -> bool:
    n, warm = args.overhead_trials, 5
    space = {"params": {"x": {"type": "float", "low": 0.0, "high": 1.0}}}
    task = NullTask()
    print(f"\n== overhead: {n} trials that do nothing (one step of a 1-weight model), SQLite ==")
    ours_ms, plain_ms, fit_ms, tuned_ms = [], [], [], []
    for rep in range(args.repeats):
        db = f"sqlite:///{tmp / f'overhead-{rep}.db'}"
        proftune.search(task, space, objectives=["val_loss:min"], trials=warm, max_steps=1,
                        sampler="random", device="cpu", db=db, study="o")
        t0 = time.perf_counter()
        r = proftune.search(task, space, objectives=["val_loss:min"], trials=warm + n, max_steps=1,
                            sampler="random", device="cpu", db=db, study="o")
        t_all = time.perf_counter() - t0
        t0 = time.perf_counter()  # the same call again: no trial left, only the fixed cost
        proftune.search(task, space, objectives=["val_loss:min"], trials=warm + n, max_steps=1,
                        sampler="random", device="cpu", db=db, study="o")
        t_fixed = time.perf_counter() - t0
        per_trial = (t_all - t_fixed) / n * 1e3
        fit_mean = statistics.mean(t.train_s for t in r.trials[warm:]) * 1e3
        ours_ms.append(per_trial)
        fit_ms.append(fit_mean)

        pdb = f"sqlite:///{tmp / f'overhead-optuna-{rep}.db'}"
        study = optuna.create_study(storage=pdb, sampler=optuna.samplers.RandomSampler(seed=0))

        def objective(trial: optuna.Trial) -> float:
            params = {"x": trial.suggest_float("x", 0.0, 1.0)}
            return proftune.fit(task, params, max_steps=1, device="cpu").metrics["val_loss"]

        study.optimize(objective, n_trials=warm)
        t0 = time.perf_counter()
        study.optimize(objective, n_trials=n)
        plain_ms.append((time.perf_counter() - t0) / n * 1e3)

        # the same, on the SQLite connection settings proftune uses (WAL, synchronous=NORMAL)
        tdb = f"sqlite:///{tmp / f'overhead-optuna-wal-{rep}.db'}"
        proftune.Store(tdb)
        tuned_study = optuna.create_study(storage=open_storage(tdb),
                                          sampler=optuna.samplers.RandomSampler(seed=0))
        tuned_study.optimize(objective, n_trials=warm)
        t0 = time.perf_counter()
        tuned_study.optimize(objective, n_trials=n)
        tuned_ms.append((time.perf_counter() - t0) / n * 1e3)
    o, p, f = statistics.median(ours_ms), statistics.median(plain_ms), statistics.median(fit_ms)
    t = statistics.median(tuned_ms)
    print(f"per trial (median of {args.repeats}): proftune {o:.1f} ms | plain Optuna, default SQLite "
          f"{p:.1f} ms (ratio {o / p:.2f}) | plain Optuna on proftune's SQLite settings {t:.1f} ms "
          f"(ratio {o / t:.2f}) | the trial's own fit {f:.1f} ms")
    print(f"framework overhead per trial: proftune {o - f:.1f} ms (target < 50); Optuna alone "
          f"{p - f:.1f} ms (default SQLite), {t - f:.1f} ms (WAL); what proftune adds to Optuna "
          f"(Run records, constraint bookkeeping, trial-budget check): {o - t:+.1f} ms")
    return (o - f) < 50.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("gate", "prune", "overhead", "all"), default="gate")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--calibration", type=int, default=24)
    ap.add_argument("--prune-trials", type=int, default=32)
    ap.add_argument("--prune-epochs", type=int, default=10)
    ap.add_argument("--overhead-trials", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    results = {}
    with tempfile.TemporaryDirectory(prefix="proftune-bench-") as d:
        tmp = Path(d)
        parts = ("gate", "prune", "overhead") if args.part == "all" else (args.part,)
        for part in parts:
            results[part] = {"gate": part_gate, "prune": part_prune, "overhead": part_overhead}[part](args, tmp)
    print("\n" + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
