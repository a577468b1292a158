"""``proftune optimize -- python train.py`` beside the plain Optuna loop a user writes around a
script, and beside the script's own defaults, at the same wall clock (issue 61).

The script, chosen by ``--script``:
- ``plain``: ``benchmarks/scripts/train.py``, a plain argparse training loop (a digits MLP, AdamW;
  ``--lr --batch-size --weight-decay --epochs --seed``, default lr 1e-5: far too low) that prints
  ``val_acc: X`` each epoch and ``test_acc: X`` at the end; objective ``val_acc:max``.
- ``hf``: ``benchmarks/scripts/hf_train.py``, a Hugging Face ``Trainer`` script (a digits MLP
  returning ``{"loss", "logits"}``, ``eval_strategy="epoch"``, a ``compute_metrics`` giving
  ``accuracy``; ``--lr/--learning-rate`` (dest ``learning_rate``, default 1e-5: far too low)
  ``--batch-size --weight-decay --epochs --seed --output-dir``) that prints ``test_acc: X`` at the
  end; objective ``eval_accuracy:max``, which proftune reads from the Trainer's eval metrics (a
  callback) and the Optuna loop from the eval dicts the Trainer prints (``{'eval_loss': ...,
  'eval_accuracy': '0.93', ...}``, what a user's loop parses).
- ``lit``: ``benchmarks/scripts/lit_train.py``, a Lightning script (a ``LightningModule`` digits MLP,
  AdamW; ``--lr --batch-size --weight-decay --epochs --seed --log-dir``, default lr 1e-5: far too low)
  that logs ``self.log("val_acc", ...)`` each validation and ``test_acc`` from ``trainer.test`` through
  Lightning's ``CSVLogger`` (``LOG_DIR/digits/version_N/metrics.csv``); objective ``val_acc:max``, which
  proftune reads from Lightning's logged metrics (a callback) and the Optuna loop from that run's
  ``metrics.csv`` (what a user's loop reads).
Nothing selects on ``test_acc``.

Arms, one after the other, each at the same budget ``B`` seconds, every process at one thread
(``OMP_NUM_THREADS=1``; the machine is shared), each in its own temporary directory:
- defaults: the script as it is;
- ours: ``python -m proftune optimize --json --budget B --seed S -- python SCRIPT --objective
  OBJ`` (the CLI, in its own process): its defaults' run, search, race, final flags;
- optuna: the loop a user writes: ``optuna.create_study(direction="maximize",
  sampler=TPESampler(seed=S))``, each trial ``subprocess.run([python, SCRIPT, --lr, ...])`` at the
  script's own epochs and seed, its last validation figure its value, ``study.optimize(timeout=B)``;
  the best trial on validation is kept. Its space is the one proftune derives from the flags (lr
  1e-6..1e-2 log, batch 8..512 for ``plain`` and ``lit``, 4..256 for ``hf``, weight decay 1e-6..0.3 log), so
  that the loops are compared, not the ranges.

Judged the same way for every arm: the flags it hands back, run again at ``--eval-seeds`` fresh
seeds (out of the budget), the mean of their ``test_acc``. Also printed: Optuna's best trial's own
``test_acc`` (the model that loop keeps). Per arm over ``--reps`` seeds: mean +- std, the script
runs it started and its wall time; then ours - Optuna (paired by seed, mean +- its standard
error) and ours / Optuna.

    python benchmarks/script.py [--script plain|hf|lit] [--budget 90] [--reps 3] [--first-rep 0] [--eval-seeds 2]
        [--out F.json]

Writes nothing to the repository (temporary databases and output directories; the script is run,
never changed).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)}
LINE = re.compile(r"\b(val_acc|test_acc):\s*([0-9.]+)")


def read_plain(stdout: str, workdir: Path) -> dict[str, float]:
    """``val_acc: X`` / ``test_acc: X`` lines: the last of each."""
    found: dict[str, float] = {}
    for line in stdout.splitlines():
        for name, value in LINE.findall(line):
            found[name] = float(value)
    return found


def read_hf(stdout: str, workdir: Path) -> dict[str, float]:
    """The eval dicts the Trainer prints (``{'eval_loss': '2.3', 'eval_accuracy': '0.93', ...}``,
    the last one wins) and the script's ``test_acc: X`` line."""
    found: dict[str, float] = {}
    for line in stdout.splitlines():
        text = line.strip()
        if text.startswith("{") and "'eval_accuracy'" in text:
            with contextlib.suppress(ValueError, SyntaxError):
                found["eval_accuracy"] = float(ast.literal_eval(text)["eval_accuracy"])
        found.update({k: float(v) for k, v in LINE.findall(line) if k == "test_acc"})
    return found


def read_lit(stdout: str, workdir: Path) -> dict[str, float]:
    """The ``metrics.csv`` Lightning's ``CSVLogger`` wrote in that run's ``--log-dir`` (its newest
    version): the last non-empty ``val_acc`` and ``test_acc`` of its rows."""
    found: dict[str, float] = {}
    files = sorted((workdir / "lit_logs" / "digits").glob("version_*/metrics.csv"),
                   key=lambda f: int(f.parent.name.removeprefix("version_")))
    if not files:
        return found
    with files[-1].open(newline="") as fh:
        for row in csv.DictReader(fh):
            found.update({k: float(row[k]) for k in ("val_acc", "test_acc") if row.get(k)})
    return found


@dataclass(frozen=True)
class Spec:
    """One script: its file, its metric (what the loops select on), its defaults (argparse dest names),
    the space proftune derives from its flags (printed by the run; given to Optuna too) and how a
    user's loop reads its output."""

    path: Path
    metric: str
    defaults: dict[str, Any]
    space: dict[str, Any]
    read: Callable[[str, Path], dict[str, float]]


SCRIPTS = {
    "plain": Spec(HERE / "scripts" / "train.py", "val_acc", {"lr": 1e-5, "batch_size": 64, "weight_decay": 0.0},
                  {"lr": (1e-6, 1e-2), "batch_size": [8, 16, 32, 64, 128, 256, 512], "weight_decay": (1e-6, 0.3)},
                  read_plain),
    "hf": Spec(HERE / "scripts" / "hf_train.py", "eval_accuracy",
               {"learning_rate": 1e-5, "batch_size": 32, "weight_decay": 0.0},
               {"learning_rate": (1e-6, 1e-2), "batch_size": [4, 8, 16, 32, 64, 128, 256],
                "weight_decay": (1e-6, 0.3)},
               read_hf),
    "lit": Spec(HERE / "scripts" / "lit_train.py", "val_acc", {"lr": 1e-5, "batch_size": 64, "weight_decay": 0.0},
                {"lr": (1e-6, 1e-2), "batch_size": [8, 16, 32, 64, 128, 256, 512], "weight_decay": (1e-6, 0.3)},
                read_lit),
}


def run_script(spec: Spec, flags: dict[str, Any], seed: int) -> dict[str, float]:
    """One run of the script with ``flags`` (argparse dest names) at ``seed``, in a temporary
    directory (what it writes goes there): its last figures."""
    cmd = [sys.executable, str(spec.path)]
    for k, v in flags.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    cmd += ["--seed", str(seed)]
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, cwd=tmp, check=False)
        found = spec.read(out.stdout, Path(tmp))
    if out.returncode != 0 or spec.metric not in found:
        return {spec.metric: 0.0, "test_acc": 0.0, "failed": 1.0}
    return found


def evaluate(spec: Spec, flags: dict[str, Any], seeds: list[int]) -> float:
    """The flags' test accuracy, the mean over fresh seeds (the same protocol for every arm)."""
    return statistics.fmean(run_script(spec, flags, s)["test_acc"] for s in seeds)


def arm_ours(spec: Spec, budget: float, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "proftune", "optimize", "--json", "--db", f"sqlite:///{tmp}/ours.db",
               "--budget", f"{budget:g}s", "--seed", str(seed), "--", sys.executable, str(spec.path),
               "--objective", f"{spec.metric}:max"]
        t0 = time.monotonic()
        out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, cwd=tmp, check=False)
        wall = time.monotonic() - t0
        if out.returncode != 0:
            raise SystemExit(f"proftune optimize failed ({out.returncode}):\n{out.stderr[-3000:]}")
        from proftune.track import Store  # every process of the script: the search's trials (repeats too),
        store = Store(f"sqlite:///{tmp}/ours.db")  # the defaults' run and the race's (train Runs)
        runs = len(store.list_runs(kind="trial")) + len(store.list_runs(kind="train"))
    d = json.loads(out.stdout)
    search = next((s for s in d["stages"] if s["stage"] == "search"), {})
    m = re.match(r"(\d+) trials", search.get("did", ""))
    trials = int(m.group(1)) if m else 0
    return {"flags": d["final"]["params"], "adopted": d["final"]["adopted"], "decision": d["final"]["decision"],
            "wall_s": wall, "loop_s": d["duration_s"], "trials": trials, "runs": runs,
            "source": d["metric_source"], "notes": d["notes"],
            "stages": [{k: st.get(k) for k in ("stage", "status", "time_s", "did")} for st in d["stages"]]}


def arm_optuna(spec: Spec, budget: float, seed: int) -> dict[str, Any]:
    """The loop a user writes around the script."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    runs: list[dict[str, float]] = []

    def objective(trial: optuna.Trial) -> float:
        flags = {k: (trial.suggest_categorical(k, v) if isinstance(v, list) else trial.suggest_float(k, *v, log=True))
                 for k, v in spec.space.items()}
        res = run_script(spec, flags, 0)  # the script's own seed
        trial.set_user_attr("test_acc", res["test_acc"])
        runs.append(res)
        return res[spec.metric]

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    t0 = time.monotonic()
    study.optimize(objective, timeout=budget)
    wall = time.monotonic() - t0
    best = study.best_trial
    return {"flags": dict(best.params), "wall_s": wall, "trials": len(study.trials), "runs": len(study.trials),
            "own_test": best.user_attrs["test_acc"], "best_val": best.value}


def mean_std(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.4f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.4f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", choices=sorted(SCRIPTS), default="plain", help="which script (see above)")
    ap.add_argument("--budget", type=float, default=90.0, help="seconds per arm")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (seeds 0..reps-1)")
    ap.add_argument("--first-rep", type=int, default=0,
                    help="the first repetition's seed (repetitions FIRST..FIRST+reps-1: part of a run, same figures)")
    ap.add_argument("--eval-seeds", type=int, default=2, help="fresh seeds each arm's flags are judged at")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    args = ap.parse_args()
    spec = SCRIPTS[args.script]
    rows: list[dict[str, Any]] = []
    for rep in range(args.first_rep, args.first_rep + args.reps):
        eval_seeds = [1000 + 10 * rep + k for k in range(args.eval_seeds)]
        ours = arm_ours(spec, args.budget, rep)
        opt = arm_optuna(spec, args.budget, rep)
        row = {"rep": rep, "script": args.script, "eval_seeds": eval_seeds, "ours": ours, "optuna": opt,
               "defaults_test": evaluate(spec, spec.defaults, eval_seeds),
               "ours_test": evaluate(spec, ours["flags"], eval_seeds),
               "optuna_test": evaluate(spec, opt["flags"], eval_seeds)}
        rows.append(row)
        print(f"rep {rep}: defaults {row['defaults_test']:.4f} | ours {row['ours_test']:.4f} "
              f"({ours['runs']} runs, {ours['wall_s']:.0f} s, its loop {ours['loop_s']:.0f} s, "
              f"{'adopted' if ours['adopted'] else 'kept defaults'}: "
              f"{json.dumps(ours['flags'])}; {ours['decision']}) | "
              f"optuna {row['optuna_test']:.4f} (own run {opt['own_test']:.4f}; "
              f"{opt['runs']} runs, {opt['wall_s']:.0f} s: {json.dumps(opt['flags'])})", flush=True)
    d = [r["defaults_test"] for r in rows]
    o = [r["ours_test"] for r in rows]
    q = [r["optuna_test"] for r in rows]
    diff = [a - b for a, b in zip(o, q, strict=True)]
    se = statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
    print(f"\nscript {spec.path.name}, budget {args.budget:g} s per arm, {args.reps} seeds, test_acc at "
          f"{args.eval_seeds} fresh seeds per arm (mean ± std over seeds); metric source: {rows[0]['ours']['source']}")
    print(f"{'arm':<10}{'test_acc':>18}{'script runs':>14}{'wall s':>9}")
    print(f"{'defaults':<10}{mean_std(d):>18}{1:>14}{'':>9}")
    print(f"{'ours':<10}{mean_std(o):>18}{statistics.fmean(r['ours']['runs'] for r in rows):>14.1f}"
          f"{statistics.fmean(r['ours']['wall_s'] for r in rows):>9.0f}")
    print(f"{'optuna':<10}{mean_std(q):>18}{statistics.fmean(r['optuna']['runs'] for r in rows):>14.1f}"
          f"{statistics.fmean(r['optuna']['wall_s'] for r in rows):>9.0f}")
    print(f"optuna's best trial's own test_acc: {mean_std([r['optuna']['own_test'] for r in rows])}")
    print(f"ours - optuna: {statistics.fmean(diff):+.4f} ± {se:.4f} (paired by seed, SE); "
          f"ours / optuna: {statistics.fmean(o) / statistics.fmean(q):.3f}; "
          f"ours - defaults: {statistics.fmean(o) - statistics.fmean(d):+.4f}; "
          f"ours adopted its search's best in {sum(r['ours']['adopted'] for r in rows)} of {len(rows)}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1, allow_nan=False))


if __name__ == "__main__":
    main()
