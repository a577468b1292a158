"""AdaptiveLR on a learning rate 10x too large, beside a well-tuned fixed rate and torch's
ReduceLROnPlateau (the scheduler a user would reach for), on sklearn digits (MLP, SGD momentum 0.9).

The tuned rate 0.1 is the best of a sweep over 0.03..3; 1.0 (10x) diverges to chance with a fixed
rate. Each arm trains the same seeded model for the same epochs; accuracy on the validation split.
Passes when AdaptiveLR ends within 2 points of the tuned run on every seed.

    python benchmarks/adaptive_lr.py [--epochs 10] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from proftune import AdaptiveLR, Callback, FitState, fit

TASK = "digits-mlp"
BASE = {"optimizer": "sgd", "momentum": 0.9, "batch_size": 64}
TUNED_LR = 0.1


class PlateauScheduler(Callback):
    """torch.optim.lr_scheduler.ReduceLROnPlateau stepped on the validation loss after each epoch."""

    def __init__(self, **kwargs: float) -> None:
        self.kwargs = kwargs
        self.scheduler: torch.optim.lr_scheduler.ReduceLROnPlateau | None = None

    def on_fit_start(self, state: FitState) -> None:
        assert state.optimizer is not None
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(state.optimizer, **self.kwargs)

    def on_epoch_end(self, state: FitState) -> None:
        assert self.scheduler is not None
        self.scheduler.step(state.metrics["val_loss"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"{TASK}, SGD momentum 0.9, {args.epochs} epochs; accuracy on the validation split")
    print(f"{'seed':>4} {'tuned lr 0.1':>13} {'fixed lr 1.0':>13} {'plateau lr 1.0':>15} "
          f"{'AdaptiveLR lr 1.0':>18} {'ours - tuned':>13} {'lr changes':>11} {'final lr':>9}")
    for seed in args.seeds:
        t0 = time.perf_counter()
        tuned = fit(TASK, {**BASE, "lr": TUNED_LR}, epochs=args.epochs, seed=seed).metrics["accuracy"]
        fixed = fit(TASK, {**BASE, "lr": 10 * TUNED_LR}, epochs=args.epochs, seed=seed).metrics["accuracy"]
        plateau = fit(TASK, {**BASE, "lr": 10 * TUNED_LR}, epochs=args.epochs, seed=seed,
                      callbacks=[PlateauScheduler(factor=0.5, patience=1)]).metrics["accuracy"]
        ctrl = AdaptiveLR()
        ours = fit(TASK, {**BASE, "lr": 10 * TUNED_LR}, epochs=args.epochs, seed=seed,
                   callbacks=[ctrl]).metrics["accuracy"]
        on_tuned = fit(TASK, {**BASE, "lr": TUNED_LR}, epochs=args.epochs, seed=seed,
                       callbacks=[AdaptiveLR()]).metrics["accuracy"]
        final_lr = ctrl.changes[-1]["new_lr"] if ctrl.changes else 10 * TUNED_LR
        rows.append((tuned, fixed, plateau, ours))
        print(f"{seed:>4} {tuned:>13.4f} {fixed:>13.4f} {plateau:>15.4f} {ours:>18.4f} "
              f"{100 * (ours - tuned):>+12.2f}p {len(ctrl.changes):>11} {final_lr:>9.3g}"
              f"   (AdaptiveLR at lr 0.1: {on_tuned:.4f}; {time.perf_counter() - t0:.1f} s)")
        for c in ctrl.changes[:3]:
            print(f"       step {c['step']}: lr {c['old_lr']:.3g} -> {c['new_lr']:.3g} ({c['reason']})")
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(f"{'med':>4} {med[0]:>13.4f} {med[1]:>13.4f} {med[2]:>15.4f} {med[3]:>18.4f} "
          f"{100 * (med[3] - med[0]):>+12.2f}p")
    print(f"ratio AdaptiveLR / ReduceLROnPlateau accuracy (median): {med[3] / med[2]:.2f}x; "
          f"AdaptiveLR / tuned: {med[3] / med[0]:.3f}")
    ok = all(ours >= tuned - 0.02 for tuned, _, _, ours in rows)
    diverged = all(fixed < tuned - 0.2 for tuned, fixed, _, _ in rows)
    print(f"fixed lr 1.0 diverges on every seed: {'yes' if diverged else 'NO'}; "
          f"AdaptiveLR within 2 points of tuned on every seed: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
