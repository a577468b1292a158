"""Ours vs the tuners Lightning and Hugging Face users already have, on one LightningModule.

The LightningModule (an MLP on sklearn's digits, written the way Lightning users write it, with
a LightningDataModule that holds ``batch_size``) goes through both sides unchanged:

- batch size under a memory budget on CPU (the 'device'): a step whose peak (the profiler's
  measured peak of one training step, cached per batch size so every side reads the same number)
  exceeds the budget raises the CPU out-of-memory error that Lightning and accelerate catch.
  * ours: ``proftune.find_batch_size`` on the LightningModule task (probes + 1 verifying step);
  * Lightning: ``Tuner.scale_batch_size(mode="binsearch")`` in a real Trainer (3 steps a trial);
  * accelerate: ``find_executable_batch_size`` (what ``TrainingArguments(auto_find_batch_size=
    True)`` runs), from a starting batch size, shrinking by 10% after each out-of-memory;
  * truth: bisection on the same peaks for the largest batch that fits.
- learning rate: ``proftune.lr_find`` vs ``Tuner.lr_find`` (100 steps each, their own
  suggestion rules); then each suggested LR trains the same model with the same fit loop for
  ``--epochs`` epochs (3 seeds), and the validation accuracy is reported.

Usage: python benchmarks/integrations.py [--budget 40MB] [--epochs 3] [--start 1024]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

LIT_FILE = '''
import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class DigitsData(L.LightningDataModule):
    def __init__(self, batch_size=32):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage=None):
        x, y = load_digits(return_X_y=True)
        x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
        g = torch.Generator().manual_seed(0)
        order = torch.randperm(len(y), generator=g)
        x, y = x[order], y[order]
        self.train_set, self.val_set = TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)


class WideMLP(L.LightningModule):
    def __init__(self, hidden=1024, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("accuracy", (logits.argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
'''

OOM = "DefaultCPUAllocator: can't allocate memory: the step needs {peak} bytes, over the budget of {budget}"


class Oracle:
    """peak(B) of one training step, measured once per B; counts who asked and what failed."""

    def __init__(self, task: Any, budget: int) -> None:
        from proftune.recommend._full_batches import FullBatchTask

        self.task = FullBatchTask(task)
        self.budget = budget
        self.cache: dict[int, int] = {}

    def peak(self, b: int) -> int:
        from proftune.profile import peak_step_memory

        if b not in self.cache:
            self.cache[b] = int(peak_step_memory(self.task, None, batch_size=b, device="cpu"))
        return self.cache[b]

    def fits(self, b: int) -> bool:
        return self.peak(b) <= self.budget

    def check(self, b: int) -> None:
        if not self.fits(b):
            raise RuntimeError(OOM.format(peak=self.peak(b), budget=self.budget))


def truth(oracle: Oracle, high: int) -> int:
    lo, hi = 1, high + 1  # fits(lo); the answer is below hi
    if oracle.fits(high):
        return high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if oracle.fits(mid) else (lo, mid)
    return lo


def trainer(L: Any, tmp: Path, callbacks: list[Any], **kw: Any) -> Any:
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp),
                     callbacks=callbacks, **kw)


def bench_batch_size(mod: Any, task: Any, oracle: Oracle, tmp: Path, start: int) -> dict[str, Any]:
    import lightning as L
    from accelerate.utils import find_executable_batch_size

    import proftune

    rows: dict[str, Any] = {}
    asked: list[int] = []

    def measure(b: int) -> int:
        asked.append(b)
        return oracle.peak(b)

    t0 = time.perf_counter()
    ours = proftune.find_batch_size(task, memory_budget=oracle.budget, device="cpu", measure=measure)
    answer = ours.memory_max_batch_size or ours.max_batch_size
    rows["ours"] = {"runs": len(asked), "over": sum(not oracle.fits(b) for b in asked), "batch": answer,
                    "s": time.perf_counter() - t0, "tried": asked}

    trials: list[int] = []

    class BudgetMLP(mod.WideMLP):  # type: ignore[misc, name-defined]
        """The same module; a step over the budget raises the CPU OOM error the tuner catches.
        (Inside the module: the tuner runs its trials without the Trainer's callbacks.)"""

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            b = int(batch[0].shape[0])
            if batch_idx == 0:
                trials.append(b)
            oracle.check(b)
            return super().training_step(batch, batch_idx)

    t0 = time.perf_counter()
    tr = trainer(L, tmp, [], max_epochs=1)
    dm = mod.DigitsData(batch_size=2)
    found = L.pytorch.tuner.Tuner(tr).scale_batch_size(BudgetMLP(), datamodule=dm, mode="binsearch")
    rows["lightning"] = {"runs": len(trials), "over": sum(not oracle.fits(b) for b in trials),
                         "batch": int(found or 0), "s": time.perf_counter() - t0, "tried": trials}

    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=start)
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        oracle.check(batch_size)
        return batch_size

    t0 = time.perf_counter()
    got = train()
    rows["accelerate"] = {"runs": len(tried), "over": sum(not oracle.fits(b) for b in tried), "batch": got,
                          "s": time.perf_counter() - t0, "tried": tried}
    rows["truth"] = {"batch": truth(oracle, 1400)}
    return rows


def bench_lr(mod: Any, task: Any, tmp: Path, epochs: int, seeds: int) -> dict[str, Any]:
    import lightning as L

    import proftune

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    ours = proftune.lr_find(task, {"batch_size": 32}, steps=100, device="cpu")
    out["ours"] = {"lr": ours.suggested_lr, "steps": len(ours.lrs), "s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    tr = trainer(L, tmp, [], max_epochs=1)
    finder = L.pytorch.tuner.Tuner(tr).lr_find(mod.WideMLP(), datamodule=mod.DigitsData(batch_size=32),
                                               num_training=100)
    out["lightning"] = {"lr": finder.suggestion(), "steps": len(finder.results["lr"]),
                        "s": time.perf_counter() - t0}
    for side in ("ours", "lightning"):
        lr = out[side]["lr"]
        accs = [] if lr is None else [
            proftune.fit(task, {"lr": lr, "batch_size": 32}, epochs=epochs, seed=s, device="cpu").metrics["accuracy"]
            for s in range(seeds)]
        out[side]["accuracy"] = statistics.fmean(accs) if accs else float("nan")
        out[side]["accuracies"] = accs
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="45MB")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--start", type=int, default=1024, help="accelerate's starting batch size")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import torch

    import proftune
    from proftune._units import format_bytes, parse_memory
    from proftune.integrations import resolve_object

    tmp = Path(tempfile.mkdtemp(prefix="proftune-bench-"))
    path = tmp / "lit_bench.py"
    path.write_text(LIT_FILE)
    import importlib

    mod = importlib.import_module(resolve_object(f"{path}:WideMLP", what="TASK").__module__)
    task = proftune.load_task(f"{path}:WideMLP")
    budget = parse_memory(args.budget)
    oracle = Oracle(task, budget)
    print(f"torch={torch.__version__} threads={torch.get_num_threads()} device=cpu, budget {format_bytes(budget)} "
          f"(peak of one step, profiler-measured); task {task.name} with {task.description}")

    bs = bench_batch_size(mod, task, oracle, tmp, args.start)
    t = bs["truth"]["batch"]
    print(f"\nbatch size (truth, bisection on the same peaks: {t})")
    print(f"{'':<12}{'trial runs':>11}{'over budget':>12}{'batch':>7}{'batch/truth':>12}{'wall s':>8}  tried")
    for side in ("ours", "lightning", "accelerate"):
        r = bs[side]
        print(f"{side:<12}{r['runs']:>11}{r['over']:>12}{r['batch']:>7}{r['batch'] / t:>12.3f}{r['s']:>8.1f}  "
              f"{r['tried']}")
    for side in ("lightning", "accelerate"):
        r = bs[side]
        print(f"ours / {side}: runs x{bs['ours']['runs'] / max(r['runs'], 1):.2f}, over-budget steps "
              f"{bs['ours']['over']} vs {r['over']}, batch x{bs['ours']['batch'] / max(r['batch'], 1):.2f}")

    lr = bench_lr(mod, task, tmp, args.epochs, args.seeds)
    print(f"\nlearning rate (100-step range tests; accuracy after {args.epochs} epochs, batch 32, "
          f"mean of {args.seeds} seeds, same fit loop)")
    print(f"{'':<12}{'suggested lr':>13}{'steps':>7}{'accuracy':>10}{'wall s':>8}  per seed")
    for side in ("ours", "lightning"):
        r = lr[side]
        lr_text = "none" if r["lr"] is None else f"{r['lr']:.3g}"
        print(f"{side:<12}{lr_text:>13}{r['steps']:>7}{r['accuracy']:>10.4f}{r['s']:>8.1f}  "
              f"{[round(a, 4) for a in r['accuracies']]}")
    print(f"ours - lightning: accuracy {lr['ours']['accuracy'] - lr['lightning']['accuracy']:+.4f}, "
          f"steps x{lr['ours']['steps'] / max(lr['lightning']['steps'], 1):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
