"""One trial: gate, train through ``fit``, record a Run, classify faults (the Optuna objective)."""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from .._usercode import failed_in
from ..task import Task
from ..track import Store
from ..train import Callback, FitState, TrainParams, fit
from ._constraints import constraint_table
from ._gate import ProfileGate, free_memory, is_oom
from ._objective import ObjectiveTask
from ._pruners import NoiseAwareHalvingPruner, pruner_name
from ._records import ATTR, TrialFigures, TrialResult, slots_before
from ._samplers import describe_sampler
from ._settings import SearchSettings

__all__ = ["WORST", "Surplus", "TrialFailed", "TrialRunner"]

#: What an infeasible trial reports as its objective when the objective was not measured:
#: finite (NSGA-II's crowding distance subtracts values), and never a best.
WORST = 1e300


class _PruningCallback(Callback):
    """Reports each epoch's objective metric to the trial; stops the fit loop when pruned."""

    def __init__(self, trial: optuna.Trial, metric: str | None, pruner: str) -> None:
        self.trial, self.metric, self.pruner = trial, metric, pruner
        self.pruned_reason: str | None = None
        # a trial without a study (Ray's trials are Optuna FixedTrials) reports every epoch
        study = getattr(trial, "study", None)
        self.rungs = rung_epochs(study.pruner) if study is not None else None

    def on_epoch_end(self, state: FitState) -> None:
        if self.metric is None:
            return
        value = state.metrics.get(self.metric)
        if value is None:
            return
        if not math.isfinite(value):
            state.record_anomaly("nonfinite_metric", metric=self.metric, value=str(value))
            self.pruned_reason = f"{self.metric}={value} at epoch {state.epoch}"
            state.request_stop(self.pruned_reason)
            return
        if self.pruner == "none":
            return  # nothing reads the reports: save a database write per epoch
        if self.rungs is not None and not self.rungs(state.epoch):
            return  # successive halving reads a trial's value at its rungs only: a write and a read less
        self.trial.report(float(value), step=state.epoch)
        if self.trial.should_prune():
            self.pruned_reason = (f"pruned by the {self.pruner} pruner at epoch {state.epoch} "
                                  f"({self.metric}={value:.4g})")
            state.request_stop(self.pruned_reason)


def rung_epochs(pruner: optuna.pruners.BasePruner) -> Callable[[int], bool] | None:
    """Whether an epoch is one of ``pruner``'s rungs, where it is a successive-halving pruner (ASHA)
    with a known first rung: it reads a trial's reported value at a rung only (the first report at
    or after ``min_resource * reduction_factor ** (rate + k)``), so a report at any other epoch, a
    database write and a read of the trial (20-30 ms on SQLite), changes nothing; None: report
    every epoch (median, Hyperband's brackets, the user's own pruner)."""
    if isinstance(pruner, NoiseAwareHalvingPruner):  # its rungs are the halving's
        pruner = pruner.halving
    if type(pruner) is not optuna.pruners.SuccessiveHalvingPruner:
        return None
    first = getattr(pruner, "_min_resource", None)
    factor = getattr(pruner, "_reduction_factor", None)
    rate = getattr(pruner, "_min_early_stopping_rate", None)
    if not isinstance(first, int) or not isinstance(factor, int) or not isinstance(rate, int) or factor < 2:
        return None
    start, k = int(first * factor**rate), int(factor)

    def at(epoch: int) -> bool:
        step = start
        while step < epoch:
            step *= k
        return step == epoch

    return at


class TrialFailed(Exception):
    """User code raised: the trial is failed (traceback stored) and the study goes on."""


class Surplus(Exception):
    """Workers raced for the last trial of the budget; this one is dropped before it runs."""


#: Models of this many of a runner's best trials are kept (``keep_models``): the search's best by
#: its mean over repeats is then among them even where another trial scored higher once.
KEEP_MODELS = 3


class TrialRunner:
    """The Optuna objective: gate, train through ``fit``, record a Run, classify faults."""

    def __init__(self, settings: SearchSettings, task: Task, store: Store) -> None:
        self.s, self.task, self.store = settings, task, store
        self.gate = ProfileGate(settings.constraints,
                                needed=[o.metric for o in settings.objectives if o.is_profile],
                                steps=settings.gate_steps, warmup=settings.gate_warmup,
                                device=settings.device, seed=settings.seed)
        first = settings.objectives[0]
        self.report_metric = None if (first.is_profile or len(settings.objectives) > 1) else first.metric
        self.stage: str | None = None
        #: Callbacks added to every trial's fit loop (a backend's reporting, PBT's restore).
        self.extra_callbacks: list[Callback] = []
        self.only: list[str] | None = None
        self.preset: Mapping[str, object] = {}
        #: (number, trial Run id) of the trial run last (what a lost database connection lost).
        self.current: tuple[int, int] | None = None
        #: (objective value signed to be maximised, trial number) of each trial whose model is kept.
        self.kept: list[tuple[float, int]] = []
        self._model: Any = None  # the last trial's trained model, while its end is decided

    def __call__(self, trial: optuna.Trial) -> Sequence[float] | float:
        started = time.perf_counter()
        if slots_before(trial) >= self.s.trials:
            # another worker took the last slot between our check and this trial's creation
            trial.set_user_attr(f"{ATTR}_surplus", True)
            raise Surplus(f"trial {trial.number}: the study already has {self.s.trials} trials")
        params = self.s.space.suggest(trial, only=self.only, preset=self.preset)
        #: a repeat of a configuration evaluated ``repeat`` times before: a new seed
        repeat = int(trial.user_attrs.get(f"{ATTR}_repeat", 0) or 0)
        config = {**self.s.space.fixed, **params}
        run_id = self.store.start_run(
            "trial", self.s.task_name, config={"params": config, "trial": trial.number,
                                               "epochs": self.s.epochs, "seed": self.s.seed},
            env=self.s.env, data_fingerprint=self.s.data_fingerprint,
            parent_id=self.s.tune_run_id, study=self.s.study)
        self.current = (trial.number, run_id)
        rec = TrialFigures(params=config, stage=self.stage, run_id=run_id,
                           sampler=("neighbour" if trial.user_attrs.get(f"{ATTR}_neighbour")
                                    else describe_sampler(trial.study.sampler)),
                           repeat=repeat, seed=self.s.seed + repeat)
        try:
            return self._run(trial, config, rec)
        except optuna.TrialPruned:
            self._finish(trial, rec, "pruned", started)
            raise
        except TrialFailed:
            self._finish(trial, rec, "failed", started)
            raise
        finally:
            self._model = None
            free_memory()

    def _run(self, trial: optuna.Trial, config: Mapping[str, object], rec: TrialFigures) -> Sequence[float] | float:
        started = time.perf_counter()
        rule = self.s.space.forbidden(config)
        if rule is not None:
            trial.set_constraint("forbid", 1.0)
            rec.reason = f"forbidden by rule: {rule.describe()}"
            return self._infeasible(trial, rec, started, gated=True)
        try:
            if isinstance(self.task, ObjectiveTask):  # a plain objective: one call, no training, no gate
                cb = self._call_objective(trial, config, rec)
            else:
                # merged with the task's defaults and validated once: the gate and fit take it as it is
                given = TrainParams.of(self.task, config)
                if self.gate.active and not self._gate(trial, given, rec):
                    return self._infeasible(trial, rec, started, gated=True)
                cb = self._train(trial, given, rec)
        except Exception as exc:
            if is_oom(exc):
                trial.set_constraint("oom", 1.0)
                rec.reason = f"out of memory: {str(exc).splitlines()[0][:300]}"
                return self._infeasible(trial, rec, started)
            where = failed_in(exc)  # the task's line, in the table and the all-failed message
            rec.reason = f"{type(exc).__name__}: {exc}" + (f"; {where}" if where else "")
            rec.traceback = traceback.format_exc()[-8000:]
            raise TrialFailed(rec.reason) from exc
        nan = [a for a in rec.anomalies if a.get("kind") in ("nan_loss", "nonfinite_metric")]
        if nan:
            rec.reason = f"non-finite values: {nan[0]}"
            raise optuna.TrialPruned(rec.reason)
        if cb.pruned_reason is not None:
            rec.reason = cb.pruned_reason
            raise optuna.TrialPruned(rec.reason)
        reasons = self._post_constraints(trial, rec)
        values = self._objective_values(rec)
        if reasons:
            rec.reason = "; ".join(reasons)
        else:
            self._keep_model(trial.number, values)
        self._finish(trial, rec, "infeasible" if reasons else "complete", started)
        return values[0] if len(values) == 1 else values

    def _keep_model(self, number: int, values: Sequence[float]) -> None:
        """Save the model of a complete trial of one objective among the ``KEEP_MODELS`` best this
        runner ran so far (``keep_models``; a model that leaves them is deleted): a caller that would
        train the search's best again at the same seed can take this training instead."""
        model, self._model = self._model, None
        if self.s.keep_models is None or model is None or len(values) != 1 or not math.isfinite(values[0]):
            return
        sign = 1.0 if self.s.objectives[0].direction == "maximize" else -1.0
        kept = sorted([*self.kept, (sign * values[0], number)], reverse=True)
        if (sign * values[0], number) not in kept[:KEEP_MODELS]:
            return
        import torch

        folder = Path(self.s.keep_models)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), folder / f"trial-{number}.pt")
        for _, gone in kept[KEEP_MODELS:]:
            (folder / f"trial-{gone}.pt").unlink(missing_ok=True)
        self.kept = kept[:KEEP_MODELS]

    def _gate(self, trial: optuna.Trial, given: TrainParams, rec: TrialFigures) -> bool:
        """Profile ``given`` and check the hard constraints; False: infeasible, not trained."""
        g = self.gate.check(self.task, given)
        rec.gate_s = g.duration_s
        rec.metrics.update(g.metrics)
        for key, v in g.violations.items():
            trial.set_constraint(key, v)
        rec.constraints = constraint_table(self.gate.constraints, rec.metrics)
        if not g.feasible:
            rec.reason = "; ".join(g.reasons)
        return g.feasible

    def _call_objective(self, trial: optuna.Trial, config: Mapping[str, object], rec: TrialFigures) -> _PruningCallback:
        """A plain objective's one call with the trial's params as they are (its params are its own)."""
        assert isinstance(self.task, ObjectiveTask)
        t0 = time.perf_counter()
        cb = _PruningCallback(trial, self.report_metric, pruner_name(self.s.pruner))
        try:
            if self.task.reports_progress:  # a script: its metric as it runs, for the pruner
                call: Any = self.task.call
                rec.metrics.update(call(config, seed=rec.seed,
                                        report=lambda step, value: self._report(cb, step, value)))
            else:
                rec.metrics.update(self.task.call(config, seed=rec.seed))
        finally:
            rec.train_s = time.perf_counter() - t0
            output = getattr(self.task, "output", None)
            if callable(output):
                rec.output = output()
        return cb

    def _train(self, trial: optuna.Trial, given: TrainParams, rec: TrialFigures) -> _PruningCallback:
        t0 = time.perf_counter()
        cb = _PruningCallback(trial, self.report_metric, pruner_name(self.s.pruner))
        try:
            result = fit(self.task, given, epochs=self.s.epochs, max_steps=self.s.max_steps,
                         device=self.s.device, seed=rec.seed, callbacks=[cb, *self.extra_callbacks])
        finally:
            rec.train_s = time.perf_counter() - t0
        rec.steps = result.steps
        self._model = result.model if self.s.keep_models is not None else None
        rec.anomalies = result.anomalies
        rec.metrics.update(result.metrics)
        rec.curve = [{k: v for k, v in e.items() if isinstance(v, (int, float))}
                        for e in result.curves.get("epoch", [])]
        return cb

    def _report(self, cb: _PruningCallback, step: int, value: float) -> bool:
        """An objective's intermediate value to the pruner (as the fit loop's epochs are); True: stop."""
        if cb.metric is None:
            return False
        if not math.isfinite(value):
            cb.pruned_reason = f"{cb.metric}={value} at step {step}"
            return True
        if cb.pruner == "none":
            return False
        cb.trial.report(float(value), step=step)
        if cb.trial.should_prune():
            cb.pruned_reason = f"pruned by the {cb.pruner} pruner at step {step} ({cb.metric}={value:.4g})"
            return True
        return False

    def _post_constraints(self, trial: optuna.Trial, rec: TrialFigures) -> list[str]:
        """Constraints on task metrics, known only after training: the reasons of those broken."""
        reasons = []
        for c in (c for c in self.s.constraints if not c.is_profile):
            value = rec.metrics.get(c.metric)
            if value is None:
                rec.reason = f"the task's metrics have no {c.metric!r} for constraint {c.text!r}"
                raise TrialFailed(rec.reason)
            v = c.violation(float(value))
            trial.set_constraint(c.key, v)
            if v > 0:
                reasons.append(c.reason(float(value)))
        rec.constraints = constraint_table(self.s.constraints, rec.metrics)
        return reasons

    def _objective_values(self, rec: TrialFigures) -> list[float]:
        values = []
        for o in self.s.objectives:
            if o.metric not in rec.metrics:
                rec.reason = (f"objective metric {o.metric!r} was not measured; task metrics: "
                              f"{', '.join(sorted(rec.metrics))}")
                raise TrialFailed(rec.reason)
            values.append(float(rec.metrics[o.metric]))
        if not all(math.isfinite(v) for v in values):
            rec.anomalies.append({"kind": "nonfinite_objective", "values": [str(v) for v in values]})
            rec.reason = f"objective is not finite: {values}"
            raise optuna.TrialPruned(rec.reason)
        return values

    def _infeasible(self, trial: optuna.Trial, rec: TrialFigures, started: float, *,
                    gated: bool = False) -> Sequence[float] | float:
        """End ``trial`` as infeasible; ``gated``: before any training (not counted in ``trials``)."""
        if gated:  # read by the slot count, which does not parse the record
            trial.set_user_attr(f"{ATTR}_gated", True)
        values = []
        for o in self.s.objectives:
            measured = rec.metrics.get(o.metric)
            if measured is not None and math.isfinite(float(measured)):
                values.append(float(measured))
            else:
                values.append(-WORST if o.direction == "maximize" else WORST)
        self._finish(trial, rec, "infeasible", started)
        return values[0] if len(values) == 1 else values

    def _finish(self, trial: optuna.Trial, rec: TrialFigures, state: str, started: float) -> None:
        rec.state = state
        rec.duration_s = time.perf_counter() - started
        output, rec.output = rec.output, None  # a script's last lines: its Run keeps them, not the study
        try:
            trial.set_user_attr(ATTR, rec.to_dict())
            if state == "failed":  # read by the slot count, which does not parse the record
                trial.set_user_attr(f"{ATTR}_failed", True)
        finally:  # the Run ends with the training even where the study refused the record
            self._finish_run(trial.number, rec, state, output)

    def _finish_run(self, number: int, rec: TrialFigures, state: str, output: Any) -> None:
        status = "failed" if state == "failed" else "finished"
        if rec.run_id is None:  # a Ray worker's: the driver finishes the Run
            return
        with contextlib.suppress(Exception):
            self.store.finish_run(
                rec.run_id, status=status,
                error=rec.traceback or (rec.reason if status == "failed" else None),
                metrics=rec.metrics, anomalies=rec.anomalies,
                curves={"epoch": rec.curve if rec.curve is not None else []},
                **({"artifacts": {"output": output}} if output else {}),
                result=TrialResult.build(trial=number, state=state, reason=rec.reason,
                                         constraints=rec.constraints, steps=rec.steps,
                                         train_s=rec.train_s, gate_s=rec.gate_s).to_dict())
