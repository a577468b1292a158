"""``proftune optimize`` beside plain Optuna TPE and "by hand", at the same wall-clock budget.

Three tasks: digits-cnn, wine-mlp, and digits-mlp whose defaults are harmful (SGD momentum 0.9 at
lr 1.0, 10x the rate a sweep picks; the health stage flags it, so this arm passes
``ignore_findings=True`` as a user who read the finding and wants the loop to fix it would).

- ours: ``proftune.optimize(task, budget=B, goal="latency", seeds=3)``.
- Optuna: TPE over the full space (lr, batch_size, weight_decay, dropout, width/hidden), each trial
  the same fit loop at a third of the task's default epochs, for B minus the time of its 3-seed
  retrain; then the best configuration retrained with 3 seeds at those epochs.
- by hand: torch-lr-finder's LR (Leslie Smith's range test, steepest descent) + the task's
  defaults, 3 seeds.

Printed per task: final accuracy (median of 3 seeds), wall time to reach Optuna's best
validation accuracy (ours: the first search trial at or above it, from the start of the run),
final model latency at batch 1 and at the task's batch (CPU, 1 thread, median) and size; and the
ratios ours/anchor. Goal: accuracy >= Optuna's at <= 50% of its time-to-best, final model >= 2x
faster within the accuracy budget.

    python benchmarks/optimize.py [--budget 120] [--quick] [--tasks digits-cnn wine-mlp harmful]
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

import proftune
from proftune.examples._digits import DigitsMLP
from proftune.train import fit

SEEDS = (0, 1, 2)


class HarmfulDefaults(DigitsMLP):
    """digits-mlp whose defaults are harmful: SGD momentum 0.9 at lr 1.0 (10x the tuned 0.1)."""

    name = "digits-mlp-lr10x"
    default_params: ClassVar[dict[str, Any]] = {"optimizer": "sgd", "momentum": 0.9, "lr": 1.0,
                                                "batch_size": 64}


def _task(name: str) -> proftune.Task:
    return HarmfulDefaults() if name == "harmful" else proftune.load_task(name)


def _arch_param(task: proftune.Task) -> tuple[str, int]:
    return ("width", 16) if task.name == "digits-cnn" else ("hidden", 64 if task.name == "wine-mlp" else 128)


@torch.no_grad()
def latency_ms(model: nn.Module, x: torch.Tensor, rounds: int = 30) -> float:
    """Median forward time of ``model(x)`` in ms, eval mode, after warm-up."""
    model.eval()
    for _ in range(5):
        model(x)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        model(x)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def size_bytes(model: nn.Module) -> int:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getbuffer().nbytes


def measure(task: proftune.Task, model: Any, batch: int) -> dict[str, float]:
    x = task.example_batch(batch)[0]
    return {"lat1": latency_ms(model, x[:1]), "latb": latency_ms(model, x[:batch]),
            "size": float(size_bytes(model))}


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# -- arms --------------------------------------------------------------------------------------
def optuna_arm(task: proftune.Task, budget: float) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    arch, default_w = _arch_param(task)
    # a third of the task's epochs per trial (and for the retrain): enough trials to search at all
    # within the budget on 2 shared cores; the retrain uses the epochs the search was run at
    epochs = max(1, math.ceil(task.default_epochs / 3))
    base = dict(task.default_params)
    started = time.perf_counter()
    best_at: list[tuple[float, float]] = []
    durations: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        params = {**base,
                  "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
                  "batch_size": trial.suggest_categorical("batch_size", [16, 32, 64, 128]),
                  "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-1, log=True),
                  "dropout": trial.suggest_float("dropout", 0.0, 0.5),
                  arch: trial.suggest_int(arch, max(4, default_w // 2), default_w * 2, log=True)}
        t = time.perf_counter()
        acc = fit(task, params, epochs=epochs, seed=0).metrics.get("accuracy", float("nan"))
        durations.append(time.perf_counter() - t)
        acc = acc if math.isfinite(acc) else 0.0
        prev = best_at[-1][1] if best_at else -1.0
        best_at.append((time.perf_counter() - started, max(prev, acc)))
        return acc

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    # keep room for the 3-seed retrain: the search stops when it would not fit any more
    while True:
        per = median(durations) if durations else 0.0
        if durations and time.perf_counter() - started + per * (1 + len(SEEDS)) > budget:
            break
        study.optimize(objective, n_trials=1)
    best_value = study.best_value
    time_to_best = next(t for t, v in best_at if v >= best_value)
    params = {**base, **study.best_params}
    runs = [fit(task, params, epochs=epochs, seed=s) for s in SEEDS]
    accs = [r.metrics["accuracy"] for r in runs]
    model = runs[sorted(range(3), key=lambda i: accs[i])[1]].model.cpu()
    return {"acc": median(accs), "accs": accs, "best_trial": best_value, "time_to_best": time_to_best,
            "trials": len(study.trials), "wall": time.perf_counter() - started, "params": params,
            **measure(task, model, int(params["batch_size"]))}


def by_hand_arm(task: proftune.Task) -> dict[str, Any]:
    from torch_lr_finder import LRFinder

    started = time.perf_counter()
    params = dict(task.default_params)
    bs = int(params.get("batch_size", 32))
    torch.manual_seed(0)
    model = task.build_model(params)
    optimizer = task.configure_optimizer(model, {**params, "lr": 1e-7})
    finder = LRFinder(model, optimizer, nn.CrossEntropyLoss(), device="cpu")
    xs, ys = zip(*task.train_data(bs, params), strict=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys)),
                                         batch_size=bs, shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        finder.range_test(loader, end_lr=10, num_iter=100)
    lrs, losses = finder.history["lr"], finder.history["loss"]
    grads = [(losses[i + 1] - losses[i]) / max(math.log(lrs[i + 1]) - math.log(lrs[i]), 1e-12)
             for i in range(10, len(losses) - 1)]
    lr = lrs[10 + min(range(len(grads)), key=lambda i: grads[i])] if grads else params.get("lr", 1e-3)
    finder.reset()
    params["lr"] = float(lr)
    runs = [fit(task, params, epochs=task.default_epochs, seed=s) for s in SEEDS]
    accs = [r.metrics["accuracy"] for r in runs]
    model = runs[sorted(range(3), key=lambda i: accs[i])[1]].model.cpu()
    return {"acc": median(accs), "accs": accs, "lr": lr, "wall": time.perf_counter() - started,
            **measure(task, model, bs)}


def ours_arm(task: proftune.Task, budget: float, optuna_best: float, tmp: Path) -> dict[str, Any]:
    import optuna

    harmful = isinstance(task, HarmfulDefaults)
    started = time.time()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = proftune.optimize(task, budget=budget, out=str(tmp / f"out-{task.name}"),
                                db=f"sqlite:///{tmp / 'ours.db'}", goal="latency", seeds=3,
                                ignore_findings=harmful)
    wall = time.perf_counter() - t0
    study = optuna.load_study(study_name=res.study, storage=f"sqlite:///{tmp / 'ours.db'}")
    reached = [(t.datetime_complete.timestamp() - started) for t in study.trials
               if t.values and t.values[0] >= optuna_best and t.datetime_complete is not None]
    time_to = min(reached) if reached else None
    vals = [v for v in res.final["metrics"]["accuracy"]["values"] if v is not None]
    bs = int(res.final["params"].get("batch_size", 32))
    final = task.build_model(res.final["params"])
    final.load_state_dict(torch.load(Path(res.out) / "model.pt", weights_only=True))
    fp32 = measure(task, final, bs)
    out = {"acc": median(vals), "accs": vals, "time_to_best": time_to, "wall": wall, "fp32": fp32,
           "compressed": None, "params": res.final["params"],
           "stages": {s["name"]: round(s["duration_s"] or 0.0, 1) for s in res.stages}}
    comp = res.final.get("compressed")
    out.update(fp32)
    if comp:
        from proftune.compress import load_model

        model = load_model(comp["model"])
        m = measure(task, model, bs)
        m["size"] = float(Path(comp["model"]).stat().st_size)  # a saved INT8 model's state dict hides its packed weights
        out.update(m)
        out["compressed"] = {"method": comp.get("method"), "metric": comp.get("metric"),
                             "drop": comp.get("metric_drop")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per arm (ours and Optuna)")
    parser.add_argument("--quick", action="store_true", help="60 s per arm")
    parser.add_argument("--tasks", nargs="+", default=["digits-cnn", "wine-mlp", "harmful"])
    args = parser.parse_args()
    budget = 60.0 if args.quick else args.budget
    torch.set_num_threads(1)
    import optuna  # noqa: F401  (imported before any clock starts, as a user's session would have it)

    rows = []
    with tempfile.TemporaryDirectory(prefix="proftune-bench-opt-") as tmpdir:
        tmp = Path(tmpdir)
        for name in args.tasks:
            task = _task(name)
            print(f"== {task.name}: {budget:.0f} s per arm", flush=True)
            # warm-up outside every arm's clock: the first fit pays one-time imports and data loads
            fit(task, dict(task.default_params), max_steps=1)
            opt = optuna_arm(task, budget)
            print(f"   optuna: {opt['trials']} trials, best trial {opt['best_trial']:.4f} at "
                  f"{opt['time_to_best']:.1f} s, retrained median {opt['acc']:.4f}", flush=True)
            hand = by_hand_arm(task)
            print(f"   by hand: lr {hand['lr']:.3g}, median {hand['acc']:.4f}", flush=True)
            ours = ours_arm(task, budget, opt["best_trial"], tmp)
            print(f"   ours: median {ours['acc']:.4f}, reached Optuna's best at {ours['time_to_best']}, "
                  f"stages {ours['stages']}, compressed {ours['compressed']}", flush=True)
            rows.append((task.name, ours, opt, hand))
    print()
    head = (f"{'task':18} {'arm':8} {'acc (med 3)':>11} {'t->opt best s':>13} {'lat b1 ms':>9} "
            f"{'lat bT ms':>9} {'size KiB':>9} {'wall s':>7}")
    print(head)
    for name, ours, opt, hand in rows:
        for arm, r in (("ours", ours), ("optuna", opt), ("by hand", hand)):
            ttb = r.get("time_to_best")
            print(f"{name:18} {arm:8} {r['acc']:11.4f} {('-' if ttb is None else f'{ttb:.1f}'):>13} "
                  f"{r['lat1']:9.3f} {r['latb']:9.3f} {r['size'] / 1024:9.1f} {r['wall']:7.1f}")
        t_ratio = (ours["time_to_best"] / opt["time_to_best"]) if ours["time_to_best"] is not None else None
        print(f"{name:18} {'ratio':8} {'ours-optuna':>11} {'ours/optuna':>13} {'optuna/ours':>9} "
              f"{'optuna/ours':>9} {'optuna/ours':>9}")
        print(f"{'':18} {'':8} {ours['acc'] - opt['acc']:+11.4f} "
              f"{('not reached' if t_ratio is None else f'{t_ratio:.2f}'):>13} "
              f"{opt['lat1'] / ours['lat1']:9.2f} {opt['latb'] / ours['latb']:9.2f} "
              f"{opt['size'] / ours['size']:9.2f}")
        goal = (ours["acc"] >= opt["acc"] and t_ratio is not None and t_ratio <= 0.5
                and opt["lat1"] / ours["lat1"] >= 2)
        print(f"{'':18} goal (acc >= optuna, <= 50% of its time-to-best, >= 2x faster): "
              f"{'met' if goal else 'not met'}")


if __name__ == "__main__":
    main()
