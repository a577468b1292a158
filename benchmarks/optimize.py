"""``proftune optimize`` beside the defaults and plain Optuna, at one wall-clock budget per arm,
judged on held-out data that no arm selected on.

Tasks: the headroom tasks of ``benchmarks/headroom_tasks.py`` (small data, noisy labels, a small
transformer on a synthetic sequence task, a breast-cancer MLP with its own ``evaluate()``), each
with its own test split; and the built-in digits-cnn, wine-mlp and digits-mlp with harmful
defaults (SGD lr 1.0), which have no test split: every arm then selects on the same part of the
validation data and is judged on the rest (``proftune``'s fixed held-out split).

Arms, each at the same budget ``B`` in the same process, one torch thread each:
- defaults: the task's defaults, trained once (seed = repetition);
- optuna: Optuna's TPE with its current defaults (multivariate, constant liar) over a wide space
  (lr 1e-5..0.3 log, batch 8..256, weight decay 1e-6..0.3 log, dropout 0..0.5, the width param
  x0.5..x2) with a plain PyTorch training loop at the task's epochs; the best trial's model;
- optuna+pruner: the same with a MedianPruner on the validation metric per epoch;
- ours: ``proftune.optimize(task, budget=B, goal="latency")``; ``ours@B/2`` at half the budget.

Printed per task: held-out accuracy median and IQR over the repetitions for each arm, the
model's latency at batch 1 and at the task's batch and its size, the ratios ours/Optuna, and
the goal: ours >= the defaults on every repetition (within one held-out sample), and >= Optuna's
median on a headroom task at <= 50% of its time (ours@B/2 against Optuna at B).

    python benchmarks/optimize.py --budget 60 [--reps 5] [--tasks small-digits noisy-digits ...]

The few-trainings regime (issue 39; the default when ``--budget`` is not given): one full training
of the task's defaults is measured first (``T`` s), then every arm gets budgets of ``k * T`` for
``k`` in ``--budgets`` (2, 4 and 8 full trainings), on one ``--task``:
- defaults: the task's defaults at their own protocol (its epochs), one training per repetition;
- optuna+hyperband: Optuna's TPE with its ``HyperbandPruner`` (its own multi-fidelity: resource =
  epochs, max resource = the task's own epochs, so a completed trial is a full training) over
  the wide space above, plain PyTorch loop, the same wall clock (a trial still running at the
  budget's end is stopped and counts as pruned); the best completed trial's model, or the best
  pruned one where none completed (said so);
- ours: ``proftune.optimize(task, budget=k*T, goal="none")``: its model at its own protocol.
Every result is judged on the held-out data against the defaults: mean +- std and median [IQR]
over ``--reps`` repetitions (seeds), the ratios, and how often each handed back less than the
defaults (below the same repetition's defaults by more than one held-out sample, and below the
defaults' mean by more than twice their seeds' spread). Then one more repetition of every arm at
the same budgets in seconds beside ``--hog`` busy-loop processes that the script starts and stops
(a machine under load: the budget is the user's, the machine is slower).

    python benchmarks/optimize.py [--task digits-cnn] [--reps 5] [--budgets 2 4 8] [--hog 1]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

import proftune
from proftune._holdout import with_test_split
from proftune.examples._digits import DigitsMLP
from proftune.optimize import FinalOutputs
from proftune.train import evaluate_model, fit, seed_everything

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headroom_tasks import HEADROOM

BUILTIN = ("digits-cnn", "wine-mlp", "harmful")


class HarmfulDefaults(DigitsMLP):
    """digits-mlp whose defaults are harmful: SGD momentum 0.9 at lr 1.0 (10x the tuned 0.1)."""

    name = "digits-mlp-lr10x"
    default_params: ClassVar[dict[str, Any]] = {"optimizer": "sgd", "momentum": 0.9, "lr": 1.0,
                                                "batch_size": 64}


def _task(name: str) -> proftune.Task:
    if name in HEADROOM:
        return HEADROOM[name]()
    return HarmfulDefaults() if name == "harmful" else proftune.load_task(name)


def _arch_param(task: proftune.Task) -> tuple[str, int] | None:
    probe: dict[str, Any] = {}

    class Probe(dict[str, Any]):
        def get(self, key: Any, default: Any = None) -> Any:
            probe.setdefault(key, default)
            return super().get(key, default)

    task.build_model(Probe(task.default_params))
    for key in ("width", "hidden", "d_model"):
        if isinstance(probe.get(key), int):
            return key, int(probe[key])
    return None


# -- measuring a model ------------------------------------------------------------------------
@torch.no_grad()
def latency_ms(model: nn.Module, x: Any, rounds: int = 30) -> float:
    """Median forward time in ms, eval mode, after warm-up."""
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


def test_accuracy(task: proftune.Task, model: nn.Module, bs: int) -> float:
    return float(evaluate_model(task, model, torch.device("cpu"), bs, split="test")["accuracy"])


def measure(task: proftune.Task, model: nn.Module, bs: int) -> dict[str, float]:
    x = next(iter(task.val_data(bs)))[0]
    return {"lat1": latency_ms(model, x[:1]), "latb": latency_ms(model, x[:bs]), "size": float(size_bytes(model))}


# -- the arms -----------------------------------------------------------------------------------
def plain_fit(task: proftune.Task, params: dict[str, Any], epochs: int, seed: int,
              report: Callable[[int, float], bool] | None = None) -> tuple[nn.Module, float]:
    """A plain PyTorch loop: the task's batches, loss, optimizer and schedule (its own
    ``configure_optimizer`` and ``configure_scheduler``, as a user's loop calls them); validation
    after each epoch. ``report(epoch, value)`` returning True stops it (a pruner)."""
    seed_everything(seed)
    model = task.build_model(params)
    opt = task.configure_optimizer(model, params)
    sched = task.configure_scheduler(opt, params, epochs=epochs, max_steps=None)
    value = float("nan")
    for epoch in range(epochs):
        model.train()
        for batch in task.train_data(int(params["batch_size"]), params):
            opt.zero_grad(set_to_none=True)
            loss = task.loss(model, batch)
            if not torch.isfinite(loss):
                return model, float("nan")
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
        value = float(evaluate_model(task, model, torch.device("cpu"), int(params["batch_size"]))["accuracy"])
        if report is not None and report(epoch, value):
            break
    return model, value


def optuna_arm(task: proftune.Task, budget: float, seed: int, *, pruner: bool) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    arch = _arch_param(task)
    base = dict(task.default_params)
    started = time.perf_counter()
    best: dict[str, Any] = {"value": -1.0, "model": None, "params": None}

    def objective(trial: optuna.Trial) -> float:
        params = _space(trial, base, arch)

        def report(epoch: int, value: float) -> bool:
            if not pruner:
                return False
            trial.report(value, epoch)
            return trial.should_prune()

        model, value = plain_fit(task, params, task.default_epochs, seed, report)
        if not math.isfinite(value):
            return 0.0
        if value > best["value"]:
            best.update(value=value, model=model, params=params)
        return value

    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction="maximize", sampler=sampler,
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
                                if pruner else optuna.pruners.NopPruner())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(objective, timeout=budget, catch=(RuntimeError, ValueError))
    model, params = best["model"], best["params"]
    if model is None:  # no trial finished with a finite loss: the user has nothing new
        return {"test": float("nan"), "val": None, "trials": len(study.trials),
                "wall": time.perf_counter() - started, "from": "nothing"}
    bs = int(params["batch_size"])
    return {"test": test_accuracy(task, model, bs), "val": best["value"], "trials": len(study.trials),
            "wall": time.perf_counter() - started, "params": _searched(params), **measure(task, model, bs)}


def defaults_arm(task: proftune.Task, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    res = fit(task, dict(task.default_params), seed=seed, device="cpu")
    bs = int(res.params["batch_size"])
    return {"test": test_accuracy(task, res.model, bs), "val": res.metrics.get("accuracy"),
            "wall": time.perf_counter() - started, **measure(task, res.model, bs)}


def ours_arm(task: proftune.Task, budget: float, seed: int, tmp: Path, *, judge: proftune.Task,
             goal: str = "latency") -> dict[str, Any]:
    """``task`` as the user has it (optimize finds its test split, or holds one out); ``judge``:
    the same task with the split every arm is judged on."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = proftune.optimize(task, budget=budget, out=str(tmp / f"out-{task.name}-{budget:.0f}-{seed}"),
                                db=f"sqlite:///{tmp / 'ours.db'}", goal=goal, seeds=3, seed=seed,
                                device="cpu", ignore_findings=isinstance(task, HarmfulDefaults))
    wall = time.perf_counter() - t0
    params = res.final.params
    bs = int(params.get("batch_size", 32))
    model = task.build_model(params)
    model.load_state_dict(torch.load(Path(res.out) / "model.pt", weights_only=True))
    vs = res.vs_baseline
    state = json.loads((Path(res.out) / "state.json").read_text())  # the result's rows are compacted
    race = FinalOutputs.from_dict(state["stages"]["final"]["outputs"]).race
    picked = race.model_run() if race is not None else None
    out: dict[str, Any] = {"cut": picked is None or picked.cut, "test": test_accuracy(judge, model, bs),
                           "val": res.final.mean, "wall": wall,
                           "decision": vs.decision, "gain_test": vs.gain_test, "beyond_noise": vs.beyond_noise,
                           "gap": vs.search_gap.gap if vs.search_gap else None,
                           "stop": res.stop_reason, "epochs": res.final.epochs,
                           "race_note": vs.race_note, "params": params, "out": str(res.out),
                           **measure(task, model, bs)}
    comp = res.final.compressed
    if comp is not None and comp.model:
        from proftune.compress import load_model

        small = load_model(comp.model, task=task, params=params)
        m = measure(task, small, bs)
        m["size"] = float(Path(comp.model).stat().st_size)  # a saved INT8 state dict hides packed weights
        out.update({"lat1": m["lat1"], "latb": m["latb"], "size": m["size"],
                    "compressed": comp.method, "test_compressed": test_accuracy(judge, small, bs)})
    return out


def _space(trial: Any, base: dict[str, Any], arch: tuple[str, int] | None) -> dict[str, Any]:
    """The wide space every Optuna arm searches (the task's other defaults kept)."""
    params = {**base,
              "lr": trial.suggest_float("lr", 1e-5, 0.3, log=True),
              "batch_size": trial.suggest_categorical("batch_size", [8, 16, 32, 64, 128, 256]),
              "weight_decay": trial.suggest_float("weight_decay", 1e-6, 0.3, log=True),
              "dropout": trial.suggest_float("dropout", 0.0, 0.5)}
    if arch is not None:
        params[arch[0]] = trial.suggest_int(arch[0], max(4, arch[1] // 2), arch[1] * 2, log=True)
    return params


def _searched(params: dict[str, Any]) -> dict[str, Any]:
    """The values ``_space`` searches, of a trial's params."""
    return {k: v for k, v in params.items()
            if k in ("lr", "batch_size", "weight_decay", "dropout", "width", "hidden", "d_model")}


def hyperband_arm(task: proftune.Task, budget: float, seed: int) -> dict[str, Any]:
    """Optuna TPE with its HyperbandPruner (resource: epochs; max resource: the task's own
    epochs), stopped at ``budget`` s of wall clock: a trial running at the end is cut (pruned)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    arch = _arch_param(task)
    base = dict(task.default_params)
    full = int(task.default_epochs)
    started = time.perf_counter()
    end = started + budget
    best: dict[str, Any] = {"value": -1.0, "model": None, "params": None}
    fallback: dict[str, Any] = {"value": -1.0, "model": None, "params": None}

    def objective(trial: optuna.Trial) -> float:
        params = _space(trial, base, arch)
        state = {"pruned": False}

        def report(epoch: int, value: float) -> bool:
            trial.report(value, epoch + 1)
            if time.perf_counter() > end or trial.should_prune():
                state["pruned"] = True
            return state["pruned"]

        model, value = plain_fit(task, params, full, seed + 1000 * trial.number, report)
        if not math.isfinite(value):
            return 0.0
        keep = fallback if state["pruned"] else best
        if value > keep["value"]:
            keep.update(value=value, model=model, params=params)
        if state["pruned"]:
            raise optuna.TrialPruned()
        return value

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.HyperbandPruner(min_resource=1, max_resource=full))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(objective, timeout=budget, catch=(RuntimeError, ValueError))
    wall = time.perf_counter() - started
    states = [t.state for t in study.trials]
    complete = sum(s == optuna.trial.TrialState.COMPLETE for s in states)
    pick = best if best["model"] is not None else fallback
    if pick["model"] is None:  # not one epoch fitted in the budget: the user has nothing new
        return {"test": float("nan"), "val": None, "trials": len(states), "complete": 0, "wall": wall,
                "from": "nothing"}
    bs = int(pick["params"]["batch_size"])
    return {"test": test_accuracy(task, pick["model"], bs), "val": pick["value"], "trials": len(states),
            "complete": complete, "wall": wall,
            "params": _searched(pick["params"]),
            "from": "completed" if pick is best else "pruned only"}


class _Hog:
    """``n`` busy-loop processes, started on enter and stopped (by their own ids) on exit."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []  # type: ignore[var-annotated]

    def __enter__(self) -> _Hog:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.procs = [ctx.Process(target=_spin, daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(timeout=10)


def _spin() -> None:
    x = 0
    while True:
        x += 1


def _mean_std(xs: list[float]) -> str:
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return "nan"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.4f} +- {sd:.4f}"


def _fmean(xs: list[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.fmean(xs) if xs else float("nan")


def fullruns_main(args: argparse.Namespace) -> None:
    """The few-trainings regime: budgets of ``k`` full trainings of the defaults (issue 39)."""
    raw = _task(args.task)
    task, info = with_test_split(raw)
    slack = 1.0 / info.test_samples if info.test_samples else 0.0
    fit(task, dict(task.default_params), max_steps=1)  # warm-up outside every clock
    t0 = time.perf_counter()
    fit(task, dict(task.default_params), seed=0, device="cpu")
    full_s = time.perf_counter() - t0
    budgets = [(k, k * full_s) for k in args.budgets]
    total = (args.reps + (1 if args.hog else 0)) * (2 * sum(b for _, b in budgets) + full_s)
    print(f"== {raw.name}: one full training of the defaults ({task.default_epochs} epochs) took {full_s:.1f} s; "
          f"budgets {', '.join(f'{k:g}x = {b:.0f} s' for k, b in budgets)}; {args.reps} repetitions"
          f"{f' + 1 beside {args.hog} CPU hog(s)' if args.hog else ''}; about {total / 60:.0f} min. "
          f"held out: {info.describe()}", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="proftune-bench-opt-") as tmpdir:
        tmp = Path(tmpdir)
        reps: list[tuple[int, bool]] = [(r, False) for r in range(args.reps)]
        if args.hog:
            reps.append((args.reps, True))
        for rep, hog in reps:
            ctx: Any = _Hog(args.hog) if hog else _NoHog()
            with ctx:
                label = f"rep {rep}{' hog' if hog else ''}"
                d = defaults_arm(task, rep)
                rows.setdefault(f"defaults{'/hog' if hog else ''}", []).append(d)
                print(f"   {label} defaults            test {d['test']:.4f} {d['wall']:6.1f} s", flush=True)
                for k, b in budgets:
                    key = f"{k:g}x{'/hog' if hog else ''}"
                    o = ours_arm(raw, b, rep, tmp, judge=task, goal="none")
                    h = hyperband_arm(task, b, rep)
                    o["ref"] = h["ref"] = d["test"]
                    rows.setdefault(f"ours {key}", []).append(o)
                    rows.setdefault(f"hb {key}", []).append(h)
                    print(f"   {label} {k:g}x ({b:.0f} s) ours test {o['test']:.4f} {o['wall']:5.1f} s "
                          f"({o['decision']}, {o['epochs']} epochs{', CUT' if o['cut'] else ''}) | "
                          f"optuna+hyperband test {h['test']:.4f} "
                          f"{h['wall']:5.1f} s ({h['complete']}/{h['trials']} trials completed, {h['from']})",
                          flush=True)
    _fullruns_table(raw.name, rows, budgets, slack, hog=bool(args.hog))


class _NoHog:
    def __enter__(self) -> _NoHog:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _fullruns_table(name: str, rows: dict[str, list[dict[str, Any]]], budgets: list[tuple[float, float]],
                    slack: float, *, hog: bool) -> None:
    for suffix in ("", "/hog") if hog else ("",):
        if f"defaults{suffix}" not in rows:
            continue
        dflt = [r["test"] for r in rows[f"defaults{suffix}"]]
        dm = _fmean(dflt)
        dsd = statistics.stdev(dflt) if len(dflt) > 1 else 0.0
        n = len(dflt)
        print(f"\n{name}{' beside a CPU hog' if suffix else ''}: held-out accuracy, mean +- std / median "
              f"[IQR] over {n} repetition(s); defaults at their own protocol {_mean_std(dflt)} / {_med_iqr(dflt)}")
        print(f"{'budget':>12} {'ours':>18} {'optuna+hyperband':>18} {'ours/dflt':>9} {'hb/dflt':>8} "
              f"{'ours/hb':>8} {'ours<dflt':>9} {'hb<dflt':>8} {'wall s ours/hb':>14}  ours' decisions")
        for k, b in budgets:
            key = f"{k:g}x{suffix}"
            ours, hb = rows[f"ours {key}"], rows[f"hb {key}"]
            o, h = [r["test"] for r in ours], [r["test"] for r in hb]
            om, hm = _fmean(o), _fmean(h)

            def below(rs: list[dict[str, Any]], bar: float = dm - max(slack, 2 * dsd)) -> str:
                paired = sum(not (r["test"] >= r["ref"] - slack) for r in rs)  # nan counts as below
                return f"{paired}/{sum(not (r['test'] >= bar) for r in rs)}"

            decisions = ", ".join(f"{d} {sum(r['decision'] == d for r in ours)}"
                                  for d in sorted({r["decision"] for r in ours}))
            print(f"{f'{k:g}x {b:.0f} s':>12} {_mean_std(o):>18} {_mean_std(h):>18} {om / dm:9.4f} {hm / dm:8.4f} "
                  f"{om / hm:8.4f} {below(ours):>9} {below(hb):>8} "
                  f"{_q([r['wall'] for r in ours], .5):7.1f}/{_q([r['wall'] for r in hb], .5):<6.1f}  {decisions}")
        print(f"  x<dflt: repetitions below the same repetition's defaults by more than one held-out sample "
              f"({slack:.4f}) / below the defaults' mean by more than max(one sample, 2 std) "
              f"({max(slack, 2 * dsd):.4f})")
        worse_o = any(not (r["test"] >= r["ref"] - slack) for k, _ in budgets for r in rows[f"ours {k:g}x{suffix}"])
        worse_h = any(not (r["test"] >= r["ref"] - slack) for k, _ in budgets for r in rows[f"hb {k:g}x{suffix}"])
        print(f"  ever handed back less than the defaults (paired, beyond one sample): ours "
              f"{'YES' if worse_o else 'no'}, optuna+hyperband {'YES' if worse_h else 'no'}")


# -- the table ----------------------------------------------------------------------------------
def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _med_iqr(xs: list[float]) -> str:
    return f"{_q(xs, 0.5):.4f} [{_q(xs, 0.25):.4f}, {_q(xs, 0.75):.4f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per arm: the fixed-seconds benchmark over --tasks and --arms")
    parser.add_argument("--reps", type=int, default=5,
                        help="repetitions (seeds) per task (0 with --hog: only the repetition beside the hog)")
    parser.add_argument("--tasks", nargs="+", default=[*HEADROOM, *BUILTIN])
    parser.add_argument("--arms", nargs="+", default=["defaults", "optuna", "optuna+pruner", "ours", "ours@B/2"])
    parser.add_argument("--task", default="digits-cnn",
                        help="the few-trainings benchmark's task (a built-in or headroom name, or 'harmful')")
    parser.add_argument("--budgets", nargs="+", type=float, default=[2.0, 4.0, 8.0],
                        help="budgets in full trainings of the task's defaults (measured first)")
    parser.add_argument("--hog", type=int, default=1,
                        help="busy-loop processes beside one more repetition (0: none)")
    args = parser.parse_args()
    if args.reps < 0 or args.hog < 0 or args.reps + args.hog == 0 or any(k <= 0 for k in args.budgets):
        parser.error(f"--reps must be >= 0 (got {args.reps}), --hog >= 0 (got {args.hog}), not both 0, and every "
                     f"--budgets > 0 (got {args.budgets}); --reps 0 --hog 1 runs only the repetition beside the hog")
    torch.set_num_threads(1)
    import optuna  # noqa: F401  (imported before any clock starts, as a user's session would have it)

    if args.budget is None:
        fullruns_main(args)
        return

    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="proftune-bench-opt-") as tmpdir:
        tmp = Path(tmpdir)
        for name in args.tasks:
            raw = _task(name)
            task, info = with_test_split(raw)
            headroom = name in HEADROOM
            print(f"== {raw.name}: {args.budget:.0f} s per arm, {args.reps} repetitions; held out: "
                  f"{info.describe()}", flush=True)
            fit(task, dict(task.default_params), max_steps=1)  # warm-up outside every clock
            per: dict[str, list[dict[str, Any]]] = {a: [] for a in args.arms}
            for rep in range(args.reps):
                for arm in args.arms:
                    if arm == "defaults":
                        r = defaults_arm(task, rep)
                    elif arm.startswith("optuna"):
                        r = optuna_arm(task, args.budget, rep, pruner=arm.endswith("pruner"))
                    else:
                        b = args.budget / 2 if arm.endswith("/2") else args.budget
                        # ours gets the task itself: it finds the test split (or holds one out) on its own
                        r = ours_arm(raw, b, rep, tmp, judge=task)
                    per[arm].append(r)
                    extra = f" ({r['trials']} trials)" if "trials" in r else ""
                    if "decision" in r:
                        extra = f" ({r['decision']}, {r['stop'][:90]})"
                    print(f"   rep {rep} {arm:14} test {r['test']:.4f} val {r['val'] or float('nan'):.4f} "
                          f"{r['wall']:6.1f} s{extra}", flush=True)
            results[name] = per
            _table(name, per, headroom=headroom, test_n=info.test_samples)


def _table(name: str, per: dict[str, list[dict[str, Any]]], *, headroom: bool, test_n: int | None) -> None:
    print(f"\n{name}: held-out accuracy, median [IQR] over {len(next(iter(per.values())))} repetitions")
    print(f"{'arm':14} {'test acc':>26} {'lat b1 ms':>9} {'lat bT ms':>9} {'size KiB':>9} {'wall s':>7}")
    for arm, rs in per.items():
        if not rs:
            continue
        print(f"{arm:14} {_med_iqr([r['test'] for r in rs]):>26} {_q([r['lat1'] for r in rs], .5):9.3f} "
              f"{_q([r['latb'] for r in rs], .5):9.3f} {_q([r['size'] for r in rs], .5) / 1024:9.1f} "
              f"{_q([r['wall'] for r in rs], .5):7.1f}")
    ours, opt, dflt = per.get("ours") or [], per.get("optuna") or [], per.get("defaults") or []
    half = per.get("ours@B/2") or []
    if ours and opt:
        o, a = _q([r["test"] for r in ours], .5), _q([r["test"] for r in opt], .5)
        print(f"ratio ours/optuna: test acc {o / a:.4f} (difference {o - a:+.4f}); latency b1 "
              f"{_q([r['lat1'] for r in ours], .5) / _q([r['lat1'] for r in opt], .5):.2f}x")
    if ours and dflt:
        slack = 1.0 / test_n if test_n else 0.0
        never_worse = all(r["test"] >= d["test"] - slack for r, d in zip(ours, dflt, strict=False))
        print(f"goal ours >= defaults on every repetition (within one held-out sample, {slack:.4f}): "
              f"{'MET' if never_worse else 'NOT MET'}")
    if headroom and half and opt:
        h, a = _q([r["test"] for r in half], .5), _q([r["test"] for r in opt], .5)
        print(f"goal ours@B/2 >= optuna@B median on a headroom task: {h:.4f} vs {a:.4f}: "
              f"{'MET' if h >= a else 'NOT MET'}")


if __name__ == "__main__":
    main()
