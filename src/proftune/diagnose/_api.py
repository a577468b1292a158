"""Public entry points: ``diagnose`` (train with the health checks, report findings) and ``bandit``
(allocate runs across configurations); both recorded in the Store."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._device import resolve_device
from .._jsonsafe import finite_float
from .._threads import fit_key, work_threads
from .._train_params import as_train_params
from .._with_options import with_options
from ..exceptions import ConfigError, ProblemCollector
from ..metrics import default_objective, resolve_direction, split_objective
from ..task import Task, load_task
from ..track import Store, open_store, tracked_run
from ..train import LOOP_PARAMS, Callback, TrainParams, fit, validate_params
from ._bandit import POLICIES, Arm, Bandit, bandit_key, regret_curve
from ._health import HealthCheck
from ._lrtest import lr_range_test
from ._probes import decay_probe, nan_probe, warmup_probe
from ._records import ArmResult, BanditPull, BanditResult, DiagnoseResult

__all__ = [
    "BanditConfig",
    "DiagnoseConfig",
    "bandit",
    "check_arms",
    "diagnose",
    "known_params",
    "load_configs",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiagnoseConfig:
    """How :func:`diagnose` trains and probes (every field also a keyword of the call).

    ``epochs``/``max_steps``: the training (default: the task's epochs); ``batch_size`` overrides
    the params'; ``lr_test``: confirm an LR finding with a short range test; ``probes``: confirm a
    schedule finding with a warm-up or decay run; ``every``: steps between health samples;
    ``record``: a ``diagnose`` Run in the store.
    """

    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    device: str | torch.device = "auto"
    seed: int = 0
    lr_test: bool = True
    probes: bool = True
    every: int = 10
    record: bool = True


def diagnose(
    task: Task | str,
    params: TrainParams | Mapping[str, Any] | None = None,
    config: DiagnoseConfig | None = None,
    *,
    callbacks: Sequence[Callback] = (),
    store: Store | str | None = None,
    db: str | None = None,
    **options: Any,
) -> DiagnoseResult:
    """Train ``task`` with the health checks and return its findings, most likely cause first.

    Training runs through :func:`proftune.train.fit` with a :class:`HealthCheck`; when the loss
    curve points at the learning rate, a short LR range test confirms or refutes it, and when it
    points at the schedule (an early spike at the full rate, a noisy floor at a constant one),
    a short warm-up or decay run does (``probes``). The final model is evaluated on the training
    data once, for the train/validation gap. Recorded as a ``diagnose`` run (unless
    ``record=False``) with the findings in its result.
    """
    c = with_options(DiagnoseConfig, config, options, caller="diagnose")
    epochs, max_steps, seed = c.epochs, c.max_steps, c.seed
    task_obj = load_task(task)
    given = as_train_params(task_obj, params, batch_size=c.batch_size)  # a TrainParams as it was made
    if epochs is None and max_steps is None:
        epochs = task_obj.default_epochs
    dev = resolve_device(c.device)
    check = HealthCheck(every=c.every)

    def body() -> DiagnoseResult:
        with work_threads(fit_key(task_obj, dev.type)):  # probes and evaluations outside the fit loop
            return checked()

    def checked() -> DiagnoseResult:
        result = fit(task_obj, given, epochs=epochs, max_steps=max_steps, device=dev, seed=seed,
                     callbacks=[check, *callbacks])
        _measure_train_metrics(task_obj, result, check, dev)
        if c.probes and check.wants_nan_probe:  # first: a NaN the rate does not drive asks no range test
            nf = check.history.nonfinite
            assert nf is not None
            check.history.nan_probe = nan_probe(task_obj, given, lr=check.history.lrs()[0],
                                                nan_step=int(nf["step"]), device=dev, seed=seed)
        if c.lr_test and check.wants_lr_test:
            check.add_lr_test(lr_range_test(task_obj, given, device=dev, seed=seed))
        if c.probes:
            _run_probes(task_obj, given, result, check, dev, seed)
        return DiagnoseResult(
            run_id=None, task=task_obj.name or type(task_obj).__name__, findings=check.findings,
            metrics=result.metrics, steps=result.steps, epochs=result.epochs,
            stop_reason=result.stop_reason, duration_s=result.duration_s, params=result.params,
            lr_test=check.lr_test,
        )

    if not c.record:
        return body()
    run_config = {"params": given.params, "epochs": epochs, "max_steps": max_steps, "seed": seed,
                  "device": str(dev), "lr_test": c.lr_test, "probes": c.probes, "every": c.every}
    with tracked_run("diagnose", task_obj, config=run_config, device=dev, store=store, db=db) as run:
        report = dataclasses.replace(body(), run_id=run.id)
        run.set(metrics={**report.metrics, "findings": float(len(report.findings))},
                result=report.to_dict(),
                curves={"step": [{"step": r["step"], "loss": r["loss"], "grad_norm": r["grad_norm"],
                                  "lr": r["lr"]} for r in check.steps],
                        "epoch": check.epochs})
    return report


def _measure_train_metrics(task: Task, result: Any, check: HealthCheck, device: torch.device) -> None:
    """The task's metrics of the final model on its training data (one pass, no grad)."""
    from .._device import DeviceIterable

    if check.history.nonfinite is not None:
        return
    model = result.model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            data = DeviceIterable(task.train_data(int(result.params.get("batch_size", 32)), result.params), device)
            check.history.train_metrics = {k: float(v) for k, v in task.evaluate(model, data).items()}
    except Exception:  # noqa: BLE001, RUF100  (a task's evaluate may not take its train batches; the gap is then unknown)
        _log.debug("evaluating the final model on the training data failed", exc_info=True)
    finally:
        model.train(was_training)


def _run_probes(task: Task, given: TrainParams, result: Any, check: HealthCheck, device: torch.device,
                seed: int) -> None:
    """The warm-up and decay probes the run asks for (each a few dozen steps of the fit loop)."""
    h = check.history
    lrs = h.lrs()
    if not lrs:
        return
    if check.wants_warmup_probe:
        from .checks._schedule import warmup_steps

        warm = warmup_steps(h)
        h.warmup_probe = warmup_probe(task, given, lr=lrs[0], steps=3 * warm, warmup=warm,
                                      device=device, seed=seed)
    if check.wants_decay_probe:
        h.decay_probe = decay_probe(task, given, result.model, result.optimizer, lr=lrs[-1],
                                    steps=min(100, max(20, len(lrs) // 4)), device=device, seed=seed)


# -- bandit -------------------------------------------------------------------------------------


class _ParamProbe(dict[str, Any]):
    """A params dict that notes every key the task reads (to tell a typo from a real param)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().setdefault(key, default)


def known_params(task: Task) -> set[str]:
    """Params that mean something for ``task``: the loop's, its defaults, and those it reads
    while building its model, data and optimizer."""
    probe = _ParamProbe(task.default_params)
    try:
        model = task.build_model(probe)
        task.configure_optimizer(model, probe)
        task.train_data(int(task.default_params.get("batch_size", 32)), probe)
    except Exception:  # noqa: BLE001, RUF100  (user code may reject the probe; the params read so far count)
        _log.debug("probing the params of %s stopped early", type(task).__name__, exc_info=True)
    return set(LOOP_PARAMS) | set(task.default_params) | {k for k in probe.read if isinstance(k, str)}


def load_configs(path: str | Path, task: Task) -> list[Arm]:
    """Read a YAML file of configurations and check every param against ``task``.

    Accepted forms: a list of param mappings (each may carry ``name``), ``{configs: [...]}`` or
    ``{name: {params}}``. One error lists every problem (unknown params name the valid ones).
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"configs={str(p)!r} does not exist or is not a file.")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"configs={str(p)!r} is not valid YAML: {exc}") from exc
    if isinstance(data, dict) and "configs" in data:
        data = data["configs"]
    entries: list[tuple[str | None, Any]]
    if isinstance(data, dict):
        entries = [(str(k), v) for k, v in data.items()]
    elif isinstance(data, list):
        entries = [(None, v) for v in data]
    else:
        raise ConfigError(f"configs={str(p)!r} must hold a list of configurations (param mappings), "
                          f"but holds {type(data).__name__}.")
    problems = ProblemCollector()
    arms: list[Arm] = []
    for i, (name, entry) in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            problems.add(f"config {i} must be a mapping of params, but got {entry!r}.")
            continue
        entry = dict(entry)
        if name is None:
            name = str(entry.pop("name", f"config-{i}"))
        params = entry.pop("params", None)
        params = dict(params) if isinstance(params, dict) else entry
        arms.append(Arm(name, params))
    if len(entries) < 2:
        problems.add(f"configs={str(p)!r} needs at least 2 configurations, but has {len(entries)}.")
    return check_arms(arms, task, problems=problems, header=f"configs={str(p)!r} is not well-formed, "
                      "found the following errors:")


def check_arms(arms: Sequence[Arm], task: Task, *, problems: ProblemCollector | None = None,
               header: str | None = None) -> list[Arm]:
    """Validate each configuration's params for ``task`` (unknown names, loop-param values,
    unique names); one error lists every problem. Returns the arms with normalised params."""
    problems = problems or ProblemCollector()
    known = known_params(task)
    out: list[Arm] = []
    for i, arm in enumerate(arms, start=1):
        label = f"config {i} ({arm.name!r})"
        for key in arm.params:
            if key not in known:
                problems.add(f"{label}: param {key!r} is unknown to task {task.name or type(task).__name__}; "
                             f"valid: {', '.join(sorted(known))}.")
        params = dict(arm.params)
        try:
            params = validate_params(params)
        except ConfigError as exc:
            for msg in exc.problems:
                problems.add(f"{label}: {msg}")
        out.append(Arm(arm.name, params))
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        problems.add(f"configuration names must be unique, but got {names}.")
    problems.raise_if_any(header=header)
    return out


@dataclass(frozen=True)
class BanditConfig:
    """How :func:`bandit` allocates its rounds (every field also a keyword of the call).

    ``policy``: thompson or ucb; ``metric`` and ``mode`` (max, min, auto): the reward; ``epochs``/
    ``max_steps``: each pull's training; ``name``: the bandit's key in the store (default: the
    task and a hash of the configs).
    """

    policy: str = "thompson"
    metric: str | None = None
    mode: str = "auto"
    epochs: int | None = None
    max_steps: int | None = None
    name: str | None = None
    device: str | torch.device = "auto"
    seed: int = 0


def bandit(
    task: Task | str,
    configs: Sequence[Arm] | str | Path,
    config: BanditConfig | None = None,
    *,
    rounds: int,
    store: Store | str | None = None,
    db: str | None = None,
    **options: Any,
) -> BanditResult:
    """Allocate ``rounds`` training runs of ``task`` across ``configs`` with a bandit ``policy``.

    Each round trains the chosen configuration (a child ``train`` run) and feeds its ``metric``
    (default: accuracy if the task reports it, else val_loss) to the bandit; ``mode`` max or min
    (auto: the metric registry's direction, or the task's ``metric_directions``). State lives in the
    Store, so the same configs (or ``name``) continue across processes. The regret curve is against
    the estimated means at the end.
    """
    c = with_options(BanditConfig, config, options, caller="bandit")
    policy, metric, mode, epochs, max_steps, name, seed = (c.policy, c.metric, c.mode, c.epochs, c.max_steps,
                                                           c.name, c.seed)
    task_obj = load_task(task)
    _check_bandit_args(rounds=rounds, policy=policy, mode=mode)
    if metric is not None:  # the direction must be known before any run is spent
        resolve_direction(metric, mode, task=task_obj)
    arms = (load_configs(configs, task_obj) if isinstance(configs, (str, Path))
            else check_arms(list(configs), task_obj))
    st = open_store(store, db=db)
    dev = resolve_device(c.device)
    key = name or bandit_key(arms, prefix=f"{task_obj.name or type(task_obj).__name__}:")
    engine = Bandit(arms, policy=policy, name=key, store=st, seed=seed + _prior_pulls(st, key))
    run_config = {"configs": [{"name": a.name, "params": a.params} for a in arms], "rounds": rounds,
                  "policy": policy, "metric": metric, "mode": mode, "epochs": epochs, "bandit": key,
                  "seed": seed}
    pulls: list[BanditPull] = []
    chosen_metric, sign = metric, 1.0
    # each arm's params over the task's defaults, validated once here, not again at every pull
    trained = {a.name: TrainParams.of(task_obj, a.params) for a in arms}
    with tracked_run("bandit", task_obj, config=run_config, device=dev, store=st, study=key) as run:
        for _ in range(rounds):
            arm = engine.select()
            params = trained[arm.name]
            pull_seed = seed + engine.t
            with tracked_run("train", task_obj, config={"params": params.params, "epochs": epochs, "seed": pull_seed,
                                                        "bandit": key, "arm": arm.name},
                             device=dev, store=st, parent_id=run.id, study=key) as child:
                result = fit(task_obj, params, epochs=epochs, max_steps=max_steps, device=dev, seed=pull_seed)
                child.set(metrics=result.metrics, curves=result.curves, anomalies=result.anomalies)
            if chosen_metric is None:
                chosen_metric = split_objective(default_objective(result.metrics))[0]
                if chosen_metric not in result.metrics:  # a task of its own metrics only
                    chosen_metric = next(iter(result.metrics), None)
                if chosen_metric is None:
                    raise ConfigError(f"task {key} reports no metric to reward; pass metric=.")
            if chosen_metric not in result.metrics:
                raise ConfigError(f"metric={chosen_metric!r} is not reported by the task; "
                                  f"valid: {', '.join(sorted(result.metrics))}.")
            use_mode = resolve_direction(chosen_metric, mode, task=task_obj)
            sign = -1.0 if use_mode == "min" else 1.0
            value = float(result.metrics[chosen_metric])
            # a diverged run (NaN metric) gets the worst reward there is
            reward = sign * value if math.isfinite(value) else -1e9
            engine.update(arm, reward, run_id=child.id)
            pulls.append(BanditPull(round=engine.t, arm=arm.name, value=value, run_id=child.id))
        means = {a: s.mean for a, s in engine.stats.items() if s.pulls}
        regret = regret_curve(engine.history, means)
        uniform = [(t + 1) * (max(means.values()) - sum(means.values()) / len(means)) for t in range(len(regret))]
        arms_out = [ArmResult(arm=s.name, pulls=s.pulls, mean=sign * s.mean if s.pulls else None,
                              std=finite_float(s.std), params=next(a.params for a in arms if a.name == s.name))
                    for s in engine.stats.values()]
        report = BanditResult(run_id=run.id, name=key, policy=policy, metric=str(chosen_metric),
                              mode="min" if sign < 0 else "max", pulls=pulls, arms=arms_out,
                              best=engine.best(), regret=regret, total_pulls=engine.t,
                              uniform_regret=uniform)
        run.set(metrics={"total_pulls": float(engine.t), "final_regret": regret[-1] if regret else 0.0},
                result=report.to_dict(),
                curves={"regret": regret, "uniform_regret": uniform})
    return report


def _check_bandit_args(*, rounds: int, policy: str, mode: str) -> None:
    """One ConfigError listing every bad argument of :func:`bandit`."""
    problems = ProblemCollector()
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        problems.add(f"rounds must be an integer >= 1, but got {rounds=}.")
    if policy not in POLICIES:
        problems.add(f"policy={policy!r} is unknown; valid: {', '.join(POLICIES)}.")
    if mode not in ("auto", "max", "min"):
        problems.add(f"mode={mode!r} is unknown; valid: auto, max, min.")
    problems.raise_if_any()


def _prior_pulls(store: Store, key: str) -> int:
    from ._bandit import BanditPulls

    return len(BanditPulls(store).history(key))

