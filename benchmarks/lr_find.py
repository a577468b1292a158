"""LR range test: 5 epochs at our suggested lr vs the best of an 8-point log grid, and vs
torch-lr-finder's suggestion (the real package, steepest-gradient rule).

For digits-mlp and digits-cnn (AdamW, batch 64, seed 0, CPU):
- grid: 8 log-spaced lrs from 1e-4 to 1e-1, 5 epochs each; its best validation accuracy;
- ours: ``proftune.lr_find`` (range 1e-5..10 over 60 steps, stops on divergence), then 5 epochs
  at ``suggested_lr``; compute = samples of the range test + samples of the 5 epochs, as a
  fraction of the grid's 8 x 5 epochs (forward+backward samples, the same cost per sample);
- ours at the CLI defaults (1e-7..10, 100 steps), for reference;
- torch-lr-finder: LRFinder.range_test (1e-7..10, 100 iterations, its defaults) and its plot's
  suggestion, then 5 epochs at it.
Usage: python benchmarks/lr_find.py [--tasks digits-mlp digits-cnn] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import proftune
from proftune.examples._sklearn import load_split

GRID = np.geomspace(1e-4, 1e-1, 8)
EPOCHS = 5


def train_accuracy(task: str, lr: float, seed: int) -> float:
    result = proftune.fit(task, {"lr": float(lr)}, epochs=EPOCHS, seed=seed, device="cpu")
    return float(result.metrics["accuracy"])


def torch_lr_finder_suggestion(task_name: str, seed: int) -> tuple[float, int]:
    """torch-lr-finder with its defaults; (suggested lr, samples it trained on)."""
    from torch_lr_finder import LRFinder

    task = proftune.load_task(task_name)
    proftune.train.seed_everything(seed)
    model = task.build_model(dict(task.default_params))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, weight_decay=1e-2)
    x, y, _, _ = load_split("digits")
    shape = getattr(task, "input_shape", (64,))
    loader = DataLoader(TensorDataset(x.reshape(-1, *shape), y), batch_size=64, shuffle=True)
    finder = LRFinder(model, optimizer, torch.nn.CrossEntropyLoss(), device="cpu")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        finder.range_test(loader, end_lr=10, num_iter=100, step_mode="exp")
        fig, ax = plt.subplots()
        _, suggestion = finder.plot(ax=ax, suggest_lr=True)
        plt.close(fig)
    steps = len(finder.history["lr"])
    finder.reset()
    return float(suggestion), steps * 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["digits-mlp", "digits-cnn"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"device=cpu torch={torch.__version__} threads={torch.get_num_threads()} cpus={os.cpu_count()} "
          f"seed={args.seed}, {EPOCHS} epochs per training run")
    ok = True
    for task in args.tasks:
        samples_per_epoch = int(load_split("digits")[0].shape[0])
        run_samples = EPOCHS * samples_per_epoch
        grid_samples = len(GRID) * run_samples
        t0 = time.perf_counter()
        grid = [(lr, train_accuracy(task, lr, args.seed)) for lr in GRID]
        grid_s = time.perf_counter() - t0
        best_lr, best_acc = max(grid, key=lambda p: p[1])
        print(f"\n{task}: grid ({grid_s:.0f} s) " + "  ".join(f"{lr:.1e}:{acc:.3f}" for lr, acc in grid))
        print(f"  best of grid: lr {best_lr:.2e} accuracy {best_acc:.4f}  (compute {grid_samples} samples)")

        rows = []
        for label, kw in (("ours", {"min_lr": 1e-5, "max_lr": 10.0, "steps": 60}),
                          ("ours (CLI defaults)", {"min_lr": 1e-7, "max_lr": 10.0, "steps": 100})):
            t0 = time.perf_counter()
            r = proftune.lr_find(task, device="cpu", seed=args.seed, **kw)
            test_s = time.perf_counter() - t0
            test_samples = r.steps * r.batch_size
            acc = train_accuracy(task, r.suggested_lr, args.seed) if r.suggested_lr else float("nan")
            rows.append((label, r.suggested_lr, acc, test_samples, test_s))
        t0 = time.perf_counter()
        tlf_lr, tlf_samples = torch_lr_finder_suggestion(task, args.seed)
        tlf_s = time.perf_counter() - t0
        rows.append(("torch-lr-finder", tlf_lr, train_accuracy(task, tlf_lr, args.seed), tlf_samples, tlf_s))

        print(f"  {'method':<22}{'suggested lr':>13}{'accuracy':>10}{'vs best':>9}{'test samples':>14}"
              f"{'compute/grid':>14}{'test s':>8}")
        for label, lr, acc, test_samples, secs in rows:
            frac = (test_samples + run_samples) / grid_samples
            print(f"  {label:<22}{lr if lr else float('nan'):>13.3e}{acc:>10.4f}{100 * (acc - best_acc):>+8.1f}p"
                  f"{test_samples:>14}{frac:>14.3f}{secs:>8.1f}")
        ours = rows[0]
        frac = (ours[3] + run_samples) / grid_samples
        good = ours[1] is not None and ours[2] >= best_acc - 0.01 and frac <= 0.2
        ok &= good
        print(f"  ours within 1 point of the grid's best at <= 1/5 of its compute: {'PASS' if good else 'FAIL'}"
              f" (accuracy {ours[2]:.4f} vs {best_acc:.4f}, compute {frac:.3f});"
              f" torch-lr-finder/ours lr ratio {rows[2][1] / ours[1]:.2f}" if ours[1] else "")
    print("\nall tasks:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
