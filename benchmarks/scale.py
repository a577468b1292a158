"""How cost grows: the run store, the search analysis, profiling and the Monitor against size.

Four curves, each printed with its growth rate k (the slope of log time against log size,
least squares: k ~ 0 flat, 1 linear, 2 quadratic) and its goal:

- ``store``: ``proftune runs list`` (newest 50, rendered; and ``--task T --kind train --json``),
  ``runs show ID`` and ``runs compare A B`` on stores of 100, 1,000 and 10,000 realistic runs
  (train runs with step curves, trials, profiles with per-layer results, ...), built by bulk
  insertion (``Store.add_runs``). The commands run in this process through the CLI app (typer
  parsing, the store query, rendering); a fresh ``proftune`` process adds the import of torch,
  a constant measured once beside them. Goal: < 1 s at 10,000 and k ~ 0 (indexed queries, no
  full-table reads).
- ``tune``: the analysis ``proftune tune`` runs after its trials (load the study from SQLite,
  trial records, Pareto front, Pearson/Spearman correlations, fANOVA and PED-ANOVA importance)
  on studies of 100 and 1,000 synthetic trials (the README's space, realistic user attributes;
  complete, infeasible, pruned and failed). Goal: < 10 s at 1,000.
- ``profile``: ``proftune.profile(mlp, inference=True)`` and the training profile of MLPs of
  10, 100 and 1,000 Linear+ReLU layers. Goal: linear in layers (k <= ~1.1: no quadratic
  bookkeeping).
- ``search``: ``proftune.search`` of a plain function (two floats, its defaults: TPE, repeats and
  neighbours at the end of the budget) for ``--trials`` trials (10,000) beside Optuna's own loop
  (``study.optimize``, TPE with the same seed) on the same kind of storage (a SQLite file each):
  the rate per block of a tenth of the trials (flat: the loop's cost per trial does not grow),
  the totals and their ratio, then ``proftune report --study`` of proftune's study. Goal: <= 1.5x
  Optuna's total, rate flat (last block >= 0.7 of the first), report < 10 s.
- ``monitor``: a user's training loop on the same MLPs with and without
  ``Monitor(every=50)`` (as ``profiler_overhead.py`` measures it); its overhead in percent of
  the loop, as layers grow. Goal: <= 2% at any depth.

Times are CPU seconds of this process (one thread; the machine's other load does not inflate
them) and the median of several repeats where a repeat is cheap; wall seconds are shown beside.

    python benchmarks/scale.py [--quick] [--part store,tune,profile,monitor,search] [--trials 10000]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

PARTS = ("store", "tune", "profile", "monitor", "search")


# -- measuring ----------------------------------------------------------------------------------
@dataclass
class Curve:
    """One measured quantity at several sizes."""

    name: str
    unit: str  # what a size counts ("runs", "trials", "layers")
    goal: str
    sizes: list[int] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    #: the goal's check on the measured curve: (met, why)
    check: Callable[[Curve], tuple[bool, str]] | None = None
    #: figures printed instead of seconds (overhead percentages); growth is not fitted on them
    values: list[str] | None = None

    def add(self, size: int, cpu: float, wall: float) -> None:
        self.sizes.append(size)
        self.cpu_s.append(cpu)
        self.wall_s.append(wall)

    @property
    def growth(self) -> float | None:
        return growth_exponent(self.sizes, self.cpu_s)


def growth_exponent(sizes: Sequence[float], times: Sequence[float]) -> float | None:
    """Least-squares slope of log(time) against log(size): the k of time ~ size^k."""
    pts = [(math.log(s), math.log(max(t, 1e-6))) for s, t in zip(sizes, times, strict=True) if s > 0]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def measure(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median CPU seconds and median wall seconds of ``repeats`` calls of ``fn``."""
    cpus, walls = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpus.append(time.process_time() - c0)
        walls.append(time.perf_counter() - w0)
    return statistics.median(cpus), statistics.median(walls)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Torch's and Optuna's warnings and the profiler's log lines off the table's way."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- store ---------------------------------------------------------------------------------------
TASKS = ("digits-cnn", "digits-mlp", "digits-transformer", "wine-mlp", "resnet18-synthetic", "proj/task.py")
ENV = {"python": "3.11.7", "platform": "Linux-6.1-x86_64-with-glibc2.36", "hostname": "gpu-node-3",
       "torch": "2.4.1+cu121", "cuda": "12.1", "cudnn": 90100, "cuda_available": True, "device": "cuda",
       "device_name": "NVIDIA A100-SXM4-80GB", "cpu": "AMD EPYC 7763", "cores": 64, "torch_threads": 32,
       "memory_bytes": 540_000_000_000, "git_commit": "3f9c2d1e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e",
       "packages": {"proftune": "0.1.0", "numpy": "1.26.4", "optuna": "4.0.0", "torchvision": "0.19.1"}}


def _train_curves(rng: random.Random, steps: int, epochs: int) -> dict[str, Any]:
    loss = 2.3
    step = []
    for i in range(steps):
        loss = max(0.02, loss * (1 - rng.uniform(0.0, 0.03)) + rng.gauss(0, 0.02))
        step.append({"step": i + 1, "epoch": i * epochs // max(steps, 1), "loss": loss, "lr": 1e-3,
                     "samples": 64})
    epoch = [{"epoch": e, "train_loss": 2.3 / (e + 1), "val_loss": 2.2 / (e + 1.1),
              "accuracy": 1 - 0.9 / (e + 1), "duration_s": rng.uniform(1, 30)} for e in range(epochs)]
    return {"step": step, "epoch": epoch}


def _profile_result(rng: random.Random, layers: int) -> dict[str, Any]:
    return {
        "schema_version": 1, "mode": "train", "batch_size": 64, "macs": 12_000_000, "flops": 24_000_000,
        "step": {"time_ms": rng.uniform(5, 50), "forward_ms": 3.0, "backward_ms": 6.0, "optimizer_ms": 1.0},
        "memory": {"params_bytes": 400_000, "peak_bytes": rng.randint(10**6, 10**9)},
        "layers": [{"name": f"features.{i}", "type": rng.choice(["Conv2d", "ReLU", "Linear", "BatchNorm2d"]),
                    "params": rng.randint(0, 10**5), "macs": rng.randint(0, 10**7), "forward_ms": rng.random(),
                    "backward_ms": rng.random(), "activation_bytes": rng.randint(0, 10**6),
                    "time_share": rng.random() / layers,
                    "stats": {"weight": {"mean": 0.0, "std": 0.05, "p1": -0.1, "p99": 0.1},
                              "activation": {"mean": 0.3, "zero_frac": 0.5}}}
                   for i in range(layers)],
    }


def realistic_runs(n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` runs as proftune writes them: half train runs (20-400 step curves), trials of
    studies, profiles with per-layer results, and the other kinds; 1% failed, a few running."""
    rng = random.Random(seed)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    runs: list[dict[str, Any]] = []
    for i in range(n):
        kind = rng.choices(("train", "trial", "profile", "tune", "compress", "recommend", "diagnose"),
                           weights=(45, 30, 10, 3, 4, 4, 4))[0]
        task = rng.choice(TASKS)
        began = start + dt.timedelta(minutes=7 * i)
        status = "failed" if rng.random() < 0.01 else ("running" if rng.random() < 0.002 else "finished")
        run: dict[str, Any] = {
            "kind": kind, "task": task, "status": status, "started_at": began.isoformat(timespec="milliseconds"),
            "host": "gpu-node-3", "pid": 10_000 + i, "env": ENV,
            "data_fingerprint": f"{rng.getrandbits(128):032x}",
            "config": {"params": {"lr": 10 ** rng.uniform(-4, -1), "batch_size": rng.choice([32, 64, 128]),
                                  "optimizer": rng.choice(["adamw", "sgd"]), "weight_decay": 0.0},
                       "epochs": rng.randint(1, 20), "seed": 0, "device": "cuda"},
            "metrics": {"accuracy": rng.uniform(0.5, 0.99), "val_loss": rng.uniform(0.05, 2.0)},
        }
        if status != "running":
            dur = rng.uniform(5, 3600)
            run["ended_at"] = (began + dt.timedelta(seconds=dur)).isoformat(timespec="milliseconds")
            run["duration_s"] = dur
        if status == "failed":
            run["error"] = "RuntimeError: CUDA out of memory\nTraceback (most recent call last):\n" + "  ...\n" * 40
        if kind == "train":
            run["curves"] = _train_curves(rng, rng.randint(20, 400), rng.randint(1, 10))
            run["result"] = {"steps": 200, "epochs": 5, "throughput": 3800.0, "stop_reason": None}
        elif kind == "trial":
            run["study"] = f"study-{i // 200}"
            run["curves"] = {"epoch": _train_curves(rng, 0, rng.randint(1, 5))["epoch"]}
            run["result"] = {"state": "complete", "reason": None, "trial": i % 200,
                             "constraints": {"step_time_ms<50": {"value": 12.0, "ok": True}}}
        elif kind == "profile":
            run["result"] = _profile_result(rng, rng.randint(8, 60))
            run["metrics"] = {"step_time_ms": 12.5, "peak_memory_bytes": 10**8, "throughput": 5000.0}
        runs.append(run)
    return runs


def build_store(url: str, n: int) -> None:
    from proftune.track import Store

    store = Store(url)
    runs = realistic_runs(n)
    for i in range(0, n, 1000):
        store.add_runs(runs[i:i + 1000])


def _cli(args: list[str]) -> Callable[[], None]:
    from typer.testing import CliRunner

    from proftune.cli import app

    runner = CliRunner()

    def go() -> None:
        res = runner.invoke(app, args, env={"COLUMNS": "200"})
        if res.exit_code != 0:  # an exception the command did not handle leaves no output: name it
            why = res.output[-2000:] or repr(res.exception)
            raise RuntimeError(f"proftune {' '.join(args)} exited {res.exit_code}: {why}") from res.exception

    return go


def _process_seconds(args: list[str]) -> tuple[float, float]:
    """CPU and wall seconds of one fresh ``proftune`` process (python -m proftune.cli)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "proftune.cli", *args], check=True, capture_output=True)
    wall = time.perf_counter() - w0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def bench_store(quick: bool, tmp: Path) -> list[Curve]:
    sizes = (100, 1000, 10000)
    repeats = 3 if quick else 7

    def under(limit: float) -> Callable[[Curve], tuple[bool, str]]:
        def check(c: Curve) -> tuple[bool, str]:
            k = c.growth or 0.0
            ok = c.cpu_s[-1] < limit and k < 0.3
            return ok, f"{c.cpu_s[-1]:.3f}s at {c.sizes[-1]:,}, k={k:.2f}"
        return check

    curves = {
        "list": Curve("runs list (newest 50, table)", "runs", "<1s at 10,000, k~0", check=under(1.0)),
        "filter": Curve("runs list --task T --kind train --json", "runs", "<1s at 10,000, k~0",
                        check=under(1.0)),
        "show": Curve("runs show ID (curves of 400 steps)", "runs", "<1s at 10,000, k~0", check=under(1.0)),
        "compare": Curve("runs compare A B", "runs", "<1s at 10,000, k~0", check=under(1.0)),
    }
    process = Curve("proftune runs list, fresh process", "runs", "(import of torch: constant)")
    for n in sizes:
        path = tmp / f"store-{n}.db"
        url = f"sqlite:///{path}"
        w0 = time.perf_counter()
        build_store(url, n)
        log(f"store of {n:,} runs built in {time.perf_counter() - w0:.1f}s ({path.stat().st_size / 1e6:.1f} MB)")
        a, b = n // 2, n // 2 + 1
        show_id = next(i + 1 for i, r in enumerate(realistic_runs(n)) if r["kind"] == "train" and i >= n // 3)
        cmds = {
            "list": ["runs", "list", "--db", url],
            "filter": ["runs", "list", "--task", "digits-cnn", "--kind", "train", "--json", "--db", url],
            "show": ["runs", "show", str(show_id), "--db", url],
            "compare": ["runs", "compare", str(a), str(b), "--db", url],
        }
        for key, args in cmds.items():
            fn = _cli(args)
            fn()  # warm: the first call imports the command's modules
            cpu, wall = measure(fn, repeats)
            curves[key].add(n, cpu, wall)
        if not quick and n in (sizes[0], sizes[-1]):
            cpu, wall = _process_seconds(["runs", "list", "--db", url])
            process.add(n, cpu, wall)
    out = list(curves.values())
    if process.sizes:
        out.append(process)
    return out


# -- tune analysis ---------------------------------------------------------------------------------
SPACE = {
    "params": {
        "lr": {"type": "float", "low": 1.0e-4, "high": 0.1, "log": True},
        "batch_size": {"type": "categorical", "choices": [32, 64, 128]},
        "width": {"type": "int", "low": 8, "high": 64, "step": 8},
        "dropout": {"type": "float", "low": 0.0, "high": 0.5},
        "optimizer": {"type": "categorical", "choices": ["adamw", "sgd"]},
        "momentum": {"type": "float", "low": 0.0, "high": 0.99, "when": {"optimizer": "sgd"}},
    },
}


def _search_internals() -> tuple[str, Callable[..., Any], Callable[..., Any]]:
    """``ATTR``, ``open_storage`` and ``trial_records``: what ``tune`` itself uses, wherever
    the search package keeps them."""
    try:
        from proftune.search._records import ATTR, trial_records  # type: ignore[import-not-found]
        from proftune.search._storage import open_storage  # type: ignore[import-not-found]
    except ImportError:
        from proftune.search._study import ATTR, open_storage, trial_records
    return ATTR, open_storage, trial_records


def build_study(url: str, name: str, n: int, *, objectives: int, seed: int = 0) -> None:
    """A study of ``n`` finished trials as ``proftune tune`` leaves it (user attribute
    ``proftune`` with the trial's record), added in bulk with ``create_trial``."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from proftune.search import load_space

    attr, open_storage, _ = _search_internals()
    space = load_space(SPACE)
    rng = random.Random(seed)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    directions = ["maximize", "minimize"][:objectives]
    study = optuna.create_study(study_name=name, storage=open_storage(url), directions=directions)
    trials = []
    for i in range(n):
        params: dict[str, Any] = {}
        dists: dict[str, Any] = {}
        for p in space.params:
            if not p.active(params):
                continue
            dist = p.distribution()
            if p.type == "categorical":
                value = rng.choice(list(p.choices))
            elif p.type == "int":
                value = rng.randrange(int(p.low or 0), int(p.high or 0) + 1, int(p.step or 1))
            elif p.log:
                value = 10 ** rng.uniform(math.log10(p.low or 1), math.log10(p.high or 1))
            else:
                value = rng.uniform(p.low or 0.0, p.high or 0.0)
            params[p.name], dists[p.name] = value, dist
        lr_term = -abs(math.log10(params["lr"]) + 2.5) * 0.08
        accuracy = min(0.99, 0.9 + lr_term + 0.002 * params["width"] / 8 - 0.05 * params["dropout"]
                       + rng.gauss(0, 0.01))
        n_params = 64 * params["width"] * 9 + params["width"] * 10
        step_ms = 2.0 + 0.05 * params["width"] * params["batch_size"] / 32 + rng.gauss(0, 0.2)
        metrics = {"accuracy": accuracy, "val_loss": 1 - accuracy, "step_time_ms": step_ms,
                   "peak_memory_bytes": 2_000_000 + 4000 * params["batch_size"] * params["width"],
                   "throughput": params["batch_size"] / step_ms * 1e3, "params": n_params,
                   "macs": n_params * 60, "grad_norm": rng.uniform(0.1, 3), "grad_var": rng.uniform(0, 1)}
        roll = rng.random()
        state_name = ("complete" if roll < 0.75 else "infeasible" if roll < 0.85
                      else "pruned" if roll < 0.95 else "failed")
        rec = {"params": params, "metrics": metrics, "state": state_name, "run_id": 1000 + i,
               "stage": None, "steps": 200, "train_s": rng.uniform(5, 60), "gate_s": 0.3,
               "constraints": {"step_time_ms<20": {"value": step_ms, "ok": state_name != "infeasible"}},
               "reason": None if state_name == "complete" else "step_time_ms=31.2 > 20",
               "duration_s": rng.uniform(5, 60), "anomalies": [],
               "curve": [{"epoch": e, "val_loss": 1.0 / (e + 1), "accuracy": accuracy * (e + 1) / 3}
                         for e in range(3)]}
        values = [accuracy, float(n_params)][:objectives]
        state = {"complete": TrialState.COMPLETE, "infeasible": TrialState.COMPLETE,
                 "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}[state_name]
        violation = 0.5 if state_name == "infeasible" else -0.2
        trials.append(create_trial(
            params=params, distributions=dists, state=state,
            values=values if state == TrialState.COMPLETE else None,
            intermediate_values={0: accuracy} if state == TrialState.PRUNED else None,
            user_attrs={attr: rec, **({f"{attr}_failed": True} if state_name == "failed" else {})},
            system_attrs={"constraints": [violation]} if state == TrialState.COMPLETE else None,
        ))
    study.add_trials(trials)


def analyse(url: str, name: str, objectives: int) -> dict[str, float]:
    """What ``proftune.search`` computes once the trials are done; CPU seconds per part."""
    import optuna

    from proftune.exceptions import ProblemCollector
    from proftune.search import load_space, parse_objective
    from proftune.search._analysis import correlations, importance, pareto_front

    _, open_storage, trial_records = _search_internals()

    problems = ProblemCollector()
    objs = [o for o in (parse_objective(t, problems) for t in ("accuracy:max", "params:min")[:objectives])
            if o is not None]
    space = load_space(SPACE)
    parts: dict[str, float] = {}
    c = time.process_time()
    loaded = optuna.load_study(study_name=name, storage=open_storage(url))
    records = trial_records(loaded)
    parts["load"] = time.process_time() - c
    c = time.process_time()
    pareto_front(records, objs)
    parts["pareto"] = time.process_time() - c
    c = time.process_time()
    correlations(records, space, objs)
    parts["correlations"] = time.process_time() - c
    c = time.process_time()
    importance(loaded, records, objs, seed=0)
    parts["importance"] = time.process_time() - c
    return parts


def bench_tune(quick: bool, tmp: Path) -> list[Curve]:
    sizes = (100, 1000)

    def under(limit: float) -> Callable[[Curve], tuple[bool, str]]:
        def check(c: Curve) -> tuple[bool, str]:
            return c.cpu_s[-1] < limit, f"{c.cpu_s[-1]:.2f}s at {c.sizes[-1]:,}"
        return check

    out: list[Curve] = []
    with quiet():  # the first analysis imports scipy and sklearn: not a cost that grows
        build_study(f"sqlite:///{tmp / 'warm.db'}", "s", 20, objectives=1)
        analyse(f"sqlite:///{tmp / 'warm.db'}", "s", 1)
    for objectives in (1, 2):
        label = "1 objective" if objectives == 1 else "2 objectives"
        total = Curve(f"tune analysis, {label} (total)", "trials", "<10s at 1,000", check=under(10.0))
        parts = {k: Curve(f"  {k}", "trials", "") for k in ("load", "pareto", "correlations", "importance")}
        for n in sizes:
            url = f"sqlite:///{tmp / f'study-{objectives}-{n}.db'}"
            w0 = time.perf_counter()
            with quiet():
                build_study(url, "s", n, objectives=objectives)
            log(f"study of {n:,} trials ({label}) built in {time.perf_counter() - w0:.1f}s")
            w0 = time.perf_counter()
            with quiet():
                got = analyse(url, "s", objectives)
            wall = time.perf_counter() - w0
            total.add(n, sum(got.values()), wall)
            for k, v in got.items():
                parts[k].add(n, v, float("nan"))
        out.append(total)
        out.extend(parts.values())
        if quick:
            break
    return out


# -- profile and monitor -----------------------------------------------------------------------------
WIDTH, BATCH = 64, 16


def mlp(layers: int) -> nn.Module:
    """``layers`` Linear(64, 64) + ReLU pairs: as many modules as possible per FLOP."""
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*mods)


def _linear_check(c: Curve) -> tuple[bool, str]:
    k = c.growth or 0.0
    per = [cpu / n * 1e3 for n, cpu in zip(c.sizes, c.cpu_s, strict=True)]
    return k <= 1.15, f"k={k:.2f}; {per[-1]:.1f} ms per layer at {c.sizes[-1]:,}"


def bench_profile(quick: bool) -> list[Curve]:
    import proftune

    sizes = (10, 100, 1000)
    x = torch.randn(BATCH, WIDTH)
    out = []
    for inference in (True, False):
        name = "profile --inference" if inference else "profile (training step)"
        curve = Curve(f"{name}, MLP", "layers", "linear in layers (k<=1.15)", check=_linear_check)
        with quiet():
            proftune.profile(mlp(2), example_input=x, inference=inference, device="cpu")  # warm
        for n in sizes:
            model = mlp(n)
            repeats = 1 if (quick or n >= 1000) else 3

            def go(model: nn.Module = model, inference: bool = inference) -> None:
                with quiet():
                    proftune.profile(model, example_input=x, inference=inference, device="cpu",
                                     steps=2, warmup=1)

            cpu, wall = measure(go, repeats)
            curve.add(n, cpu, wall)
            log(f"{name}: {n} layers {cpu:.2f} CPU s")
        out.append(curve)
    return out


def bench_monitor(quick: bool) -> list[Curve]:
    """A user's training loop on the same MLPs, plain and under ``Monitor(every=50)``, run and
    measured as ``profiler_overhead.py`` does (each step's CPU time; the figure is the excess of
    the steps around each sample over the untouched steps near them, less the same on the plain
    run, spread over the run): the overhead a long run pays, not an extrapolation."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import profiler_overhead as po

    sizes = (10, 100, 1000)
    every = 50
    steps = 300 if quick else 500
    plain = Curve("user loop, plain step", "layers", "")
    sampled = Curve(f"Monitor(every={every}) sampled step, in plain steps", "layers", "")
    over = Curve(f"Monitor(every={every}) overhead", "layers", f"<= {po.GOAL_OVERHEAD:.0%} (issue 27)")
    for n in sizes:
        w = po.build(f"mlp{n}")
        with quiet():
            po.run_once("monitor", w, 2 * every, every)  # warm
            figs = {kind: po.figures(po.run_once(kind, w, steps, every)[0], every) for kind in ("none", "monitor")}
        none, mon = figs["none"], figs["monitor"]
        per_sample = mon.excess_s / max(mon.samples, 1) - none.excess_s / max(none.samples, 1)
        plain.add(n, none.plain_s, float("nan"))
        sampled.add(n, 1 + per_sample / none.plain_s, float("nan"))
        over.add(n, per_sample * mon.samples / (steps * none.plain_s), float("nan"))
        log(f"monitor: {n} layers: plain step {none.plain_s * 1e3:.2f} ms, sampled step "
            f"{sampled.cpu_s[-1]:.2f} plain steps, overhead {over.cpu_s[-1]:+.2%}")
    sampled.values = [f"{v:.2f}x" for v in sampled.cpu_s]
    over.values = [f"{v:+.2%}" for v in over.cpu_s]

    def check(c: Curve) -> tuple[bool, str]:
        worst = max(c.cpu_s)
        return worst <= po.GOAL_OVERHEAD, f"worst {worst:+.2%}"

    over.check = check
    return [plain, sampled, over]


# -- a long search ---------------------------------------------------------------------------------
def _objective(stamps: list[float]) -> Callable[[dict[str, Any]], float]:
    def fn(p: dict[str, Any]) -> float:
        stamps.append(time.process_time())
        return (p["x"] - 1.0) ** 2 + (p["y"] + 2.0) ** 2
    return fn


def _rates(stamps: Sequence[float], blocks: int) -> list[float]:
    """Trials per CPU second in each of ``blocks`` equal blocks of the trials."""
    size = max(len(stamps) // blocks, 2)
    out = []
    for i in range(0, len(stamps) - size + 1, size):
        span = stamps[i + size - 1] - stamps[i]
        out.append((size - 1) / span if span > 0 else float("inf"))
    return out


def bench_search(trials: int, tmp: Path) -> list[Curve]:
    import optuna

    import proftune

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = {"params": {"x": {"type": "float", "low": -5.0, "high": 5.0},
                        "y": {"type": "float", "low": -5.0, "high": 5.0}}}
    blocks = 10
    ours: list[float] = []
    url = f"sqlite:///{tmp / 'search-proftune.db'}"
    log(f"search: proftune.search, {trials:,} trials ...")
    c0, w0 = time.process_time(), time.perf_counter()
    with quiet():
        proftune.search(_objective(ours), space, objectives=["value:min"], trials=trials, db=url,
                        study="long", seed=0, analyse=False)
    ours_cpu, ours_wall = time.process_time() - c0, time.perf_counter() - w0
    log(f"search: proftune {ours_cpu:.0f} CPU s, {ours_wall:.0f} wall s; Optuna's loop ...")
    theirs: list[float] = []
    c0, w0 = time.process_time(), time.perf_counter()
    study = optuna.create_study(storage=f"sqlite:///{tmp / 'search-optuna.db'}",
                                sampler=optuna.samplers.TPESampler(seed=0))
    fn = _objective(theirs)
    study.optimize(lambda t: fn({"x": t.suggest_float("x", -5.0, 5.0), "y": t.suggest_float("y", -5.0, 5.0)}),
                   n_trials=trials)
    optuna_cpu, optuna_wall = time.process_time() - c0, time.perf_counter() - w0
    log(f"search: Optuna {optuna_cpu:.0f} CPU s, {optuna_wall:.0f} wall s; report --study ...")
    report = Curve("proftune report --study (HTML)", "trials", "<10s", check=lambda c: (
        c.cpu_s[-1] < 10.0, f"{c.cpu_s[-1]:.1f} CPU s, {c.wall_s[-1]:.1f} wall s"))
    with quiet():
        cpu, wall = measure(_cli(["report", "--study", "long", "--db", url, "--out", str(tmp / "long.html")]), 1)
    report.add(trials, cpu, wall)

    def flat(c: Curve) -> tuple[bool, str]:
        assert c.values is not None
        first, last = c.cpu_s[0], c.cpu_s[-1]
        return last >= 0.7 * first, f"first block {first:.1f}/s, last {last:.1f}/s"

    curves = []
    for name, stamps, total_cpu, total_wall in (("proftune.search", ours, ours_cpu, ours_wall),
                                                ("optuna study.optimize", theirs, optuna_cpu, optuna_wall)):
        rates = _rates(stamps, blocks)
        size = max(len(stamps) // blocks, 2)
        c = Curve(f"{name}: trials per CPU s, per block", "trials in", "rate flat (last >= 0.7 first)",
                  check=flat if name.startswith("proftune") else None)
        for i, r in enumerate(rates):
            c.add((i + 1) * size, r, float("nan"))
        c.values = [f"{r:.1f}/s" for r in rates]
        curves.append(c)
        log(f"search: {name}: {len(stamps):,} trials in {total_cpu:.1f} CPU s ({total_wall:.1f} wall s): "
            + ", ".join(c.values))
    total = Curve(f"total, {trials:,} trials: proftune / Optuna", "trials", "<= 1.5x Optuna's loop",
                  check=lambda c: (c.cpu_s[-1] <= 1.5, f"{ours_cpu:.1f} / {optuna_cpu:.1f} CPU s = "
                                   f"{c.cpu_s[-1]:.2f}x; wall {ours_wall:.1f} / {optuna_wall:.1f} s"))
    total.add(trials, ours_cpu / optuna_cpu, float("nan"))
    total.values = [f"{ours_cpu / optuna_cpu:.2f}x"]
    return [*curves, total, report]


# -- the table ------------------------------------------------------------------------------------------
def _fmt_s(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v * 1e3:.1f}ms" if v < 1 else f"{v:.2f}s"


def print_table(curves: Sequence[Curve]) -> bool:
    """Print every curve; return whether every goal was met."""
    all_ok = True
    groups: dict[str, list[Curve]] = {}
    for c in curves:
        groups.setdefault(c.unit, []).append(c)
    for unit, cs in groups.items():
        sizes = sorted({s for c in cs for s in c.sizes})
        head = f"{'curve (CPU s; wall s)':<46}" + "".join(f"{f'{s:,} {unit}':>22}" for s in sizes)
        print()
        print(head + f"{'growth k':>10}  goal / result")
        print("-" * (len(head) + 40))
        for c in cs:
            cells = []
            for s in sizes:
                if s not in c.sizes:
                    cells.append(f"{'':>22}")
                    continue
                i = c.sizes.index(s)
                if c.values is not None:
                    cells.append(f"{c.values[i]:>22}")
                elif math.isnan(c.wall_s[i]):
                    cells.append(f"{_fmt_s(c.cpu_s[i]):>22}")
                else:
                    cells.append(f"{_fmt_s(c.cpu_s[i]) + '; ' + _fmt_s(c.wall_s[i]):>22}")
            k = c.growth if c.values is None else None
            ks = f"{k:10.2f}" if k is not None else f"{'':>10}"
            verdict = ""
            if c.check is not None:
                ok, why = c.check(c)
                all_ok &= ok
                verdict = f"{c.goal}: {'MET' if ok else 'NOT MET'} ({why})"
            elif c.goal:
                verdict = c.goal
            print(f"{c.name:<46}" + "".join(cells) + ks + "  " + verdict)
    return all_ok


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats and steps (a few minutes)")
    ap.add_argument("--part", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    ap.add_argument("--trials", type=int, default=10_000, help="trials of the search part (10,000)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"--part {','.join(bad)} is unknown; valid: {', '.join(PARTS)}")
    torch.set_num_threads(1)
    started = time.perf_counter()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, 1 thread, load average "
          f"{os.getloadavg()[0]:.1f}, {'quick' if args.quick else 'full'} run", flush=True)
    curves: list[Curve] = []
    with tempfile.TemporaryDirectory(prefix="proftune-scale-") as d:
        tmp = Path(d)
        if "store" in parts:
            curves += bench_store(args.quick, tmp)
        if "tune" in parts:
            curves += bench_tune(args.quick, tmp)
        if "profile" in parts:
            curves += bench_profile(args.quick)
        if "monitor" in parts:
            curves += bench_monitor(args.quick)
        if "search" in parts:
            curves += bench_search(args.trials, tmp)
    ok = print_table(curves)
    print(f"\n{'every goal met' if ok else 'some goals NOT met'}; "
          f"total {time.perf_counter() - started:.0f}s wall, load average now {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
