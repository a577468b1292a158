"""The optimizer by measurement: the task's own optimizer (the anchor) beside the one
``recommend``'s ``optimizer`` row picks from its short equal-time comparison.

For each task: profile it, run the comparison (AdamW and SGD+momentum at their own range-test
rates, full-batch L-BFGS where it fits; ``--budget`` seconds in all), then train the task's
default epochs with the task's default params (anchor) and with the row's params (ours: the
chosen optimizer at its measured rate), over several seeds. Printed: the choice and the
comparison's cost, validation loss and the task's metric, mean ± std, and the ratio ours/anchor.
Tasks: digits-mlp, digits-cnn, wine-mlp, and a 400-sample least-squares problem with features
on scales 1..10 (``lsq``), where a quasi-Newton method should win.
Usage: python benchmarks/optimizer.py [--tasks digits-mlp wine-mlp lsq] [--seeds 0 1 2] [--budget 4]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

import proftune
from proftune.examples import TensorBatches
from proftune.recommend._optimizer import (
    CompareConfig,
    compare_optimizers,
    optimizer_recommendation,
)


class LeastSquares(proftune.Task):
    """400 samples, 20 features on scales 1..10 (condition ~100), linear model, MSE."""

    name = "lsq"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 32, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 10

    def _data(self) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(500, 20, generator=gen) * torch.logspace(0, 1, 20)
        w = torch.randn(20, 1, generator=gen)
        return x, (x @ w).squeeze(-1) + 0.01 * torch.randn(500, generator=gen)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Linear(20, 1)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y = self._data()
        return TensorBatches(x[:400], y[:400], batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        x, y = self._data()
        return TensorBatches(x[400:], y[400:], batch_size, shuffle=False)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x).squeeze(-1), y)


def _metric(metrics: dict[str, float]) -> tuple[str, float]:
    for key in ("accuracy",):
        if key in metrics:
            return key, metrics[key]
    return "val_loss", metrics.get("val_loss", math.nan)


def _train(task: proftune.Task, params: dict[str, Any], seed: int) -> dict[str, float]:
    """The task's default epochs (for full-batch L-BFGS one epoch is one step of up to 20
    iterations); the metrics and the training time in seconds."""
    result = proftune.fit(task, params, epochs=task.default_epochs, seed=seed, device="cpu")
    return {**result.metrics, "train_s": result.duration_s}


def _ms(values: list[float]) -> str:
    return f"{statistics.mean(values):.4g} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.2g}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["digits-mlp", "digits-cnn", "wine-mlp", "lsq"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = []
    for name in args.tasks:
        task = LeastSquares() if name == "lsq" else proftune.load_task(name)
        params = dict(task.default_params)
        prof = proftune.profile(task, params=params, device="cpu")
        t0 = time.perf_counter()
        comp = compare_optimizers(task, params, profile=prof, device=torch.device("cpu"),
                                  config=CompareConfig(budget_s=args.budget, batch_size=int(prof.batch_size)))
        spent = time.perf_counter() - t0
        row = optimizer_recommendation(comp)
        ours = {**params, **row.evidence["params"]}
        print(f"{name}: {row.value} ({row.confidence}); {comp.reason}; comparison {spent:.1f} s", flush=True)
        # the task's optimizer at its own measured rate: what is left is the optimizer's effect
        mine = comp.trial(comp.current)
        tuned = {**params, **(mine.params if mine is not None else {})}
        runs = {label: [_train(task, p, s) for s in args.seeds]
                for label, p in (("anchor", params), ("anchor@rate", tuned), ("ours", ours))}
        key, _ = _metric(runs["anchor"][0])
        lines.append((name, params.get("optimizer"), row.value, spent, key, runs))
    labels = ("anchor", "anchor@rate", "ours")
    print(f"\n{'task':11s}{'anchor':>7s}{'ours':>7s}{'cmp s':>6s}"
          + "".join(f"{'val_loss ' + k:>24s}" for k in labels) + f"{'ours/anchor':>12s}{'ours/@rate':>11s}")
    for name, a_opt, o_opt, spent, key, runs in lines:
        loss = {k: [m["val_loss"] for m in runs[k]] for k in labels}
        mean = {k: statistics.mean(v) for k, v in loss.items()}
        print(f"{name:11s}{a_opt:>7s}{o_opt:>7s}{spent:>6.1f}" + "".join(f"{_ms(loss[k]):>24s}" for k in labels)
              + f"{mean['ours'] / mean['anchor']:>12.3g}{mean['ours'] / mean['anchor@rate']:>11.3g}")
        print(f"{'':31s}" + "".join(f"  {key + ' ' + _ms([_metric(m)[1] for m in runs[k]]):>22s}" for k in labels)
              + "   train s " + "/".join(f"{statistics.median(m['train_s'] for m in runs[k]):.1f}" for k in labels))


if __name__ == "__main__":
    main()
