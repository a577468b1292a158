"""``proftune.optimize``: the closed loop in one resumable call.

baseline -> health -> compute -> layer_value -> search -> final -> compress, each stage a Run
(kind ``optimize``, linked to the run's parent ``optimize`` Run) fed by the measured outputs of
the stages before it. Every stage calls the public API of the subpackage that owns the work.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._device import resolve_device
from .._holdout import with_test_split
from .._jsonsafe import finite_float, json_dumps, json_safe
from .._paths import replacing, write_text
from .._units import format_bytes
from ..compress import Candidate, load_model
from ..compress import compress as run_compress
from ..diagnose import diagnose
from ..exceptions import ConfigError, RunFailedError
from ..profile import Profile, size_bytes, task_latencies
from ..profile import profile as run_profile
from ..recommend import recommend
from ..task import Task, load_task
from ..track import Store, data_fingerprint, environment, redact_url
from ..train import Callback, FitState, evaluate_model, fit, validate_params
from ._budget import OPTIMIZE_STAGES, Budget, Deadline
from ._changes import ParamChange, param_changes
from ._config import OptimizeConfig, Validated, default_study, validate
from ._decide import ALPHA, pooled_seed_std, prior_seed_std
from ._final import (
    MAX_CANDIDATES,
    MAX_ROUNDS,
    RESERVED_CANDIDATES,
    RUN_OVERHEAD_S,
    Arm,
    FinalOutcome,
    FinalPlan,
    run_final,
)
from ._layer_value import LayerFinding, keep_layers, layer_values
from ._output import load_line, write_html, write_outputs, write_summary
from ._plan import BudgetPlan, paired_seeds_needed, plan_budget
from ._records import (
    BaselineOutputs,
    CompressOutputs,
    ComputeOutputs,
    FinalOutputs,
    HealthOutputs,
    LayerValueOutputs,
    ModelFigures,
    SearchStageOutputs,
    StageOutputs,
    TrainedRun,
)
from ._result import (
    CompressedModel,
    FinalSummary,
    OptimizeResult,
    SplitComparisons,
    SplitSummaries,
    StageRow,
    VsBaseline,
)
from ._search import StageSettings, TrialLog, run_search_stage
from ._space import build_plan, task_param_defaults
from ._state import OptimizeState, own_run
from ._story import fmt_ms, method_name, tell

log = logging.getLogger(__name__)

__all__ = ["OptimizeResult", "optimize"]

Progress = Callable[[str, dict[str, Any]], None]
#: Below this many seconds the compress stage is skipped (imports + one pruned and one INT8
#: candidate measured as saved take ~20-30 s on 2 shared cores).
MIN_COMPRESS_S = 15.0
#: What the search keeps back for the compress stage (measured: 25-50 s for one structured ratio
#: and INT8 on digits-cnn on 2 shared cores, imports included).
COMPRESS_RESERVE_S = 40.0
#: The search prunes by successive halving when its time holds fewer full trials than this.
FULL_TRIALS_FOR_NO_PRUNER = 15.0
#: Trials run at the task's own epochs when the search's time holds at least this many of them.
FULL_TRIALS_AT_LEAST = 6.0


@dataclass
class _StageResult:
    outputs: StageOutputs
    before: float | None = None
    after: float | None = None
    status: str = "finished"


class _Capture(Callback):
    """Keeps the fit loop's model at the end (diagnose returns findings, not the model)."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None

    def on_fit_end(self, state: FitState) -> None:
        self.model = state.model


class _Loop:
    """One optimize run: its task, options, Store, state file and clock."""

    def __init__(self, task: Task, v: Validated, store: Store, progress: Progress | None, *,
                 spec: str | None = None) -> None:
        self.v, self.cfg, self.store = v, v.cfg, store
        self.name = task.name or type(task).__name__
        #: How ``load_task`` finds the task again (the spec given, a file's path made absolute).
        self.spec = _absolute_spec(spec) if spec else self.name
        self.dev = resolve_device(self.cfg.device)
        self.say: Progress = progress or (lambda _event, _data: None)
        self.out = v.out
        self.out.mkdir(parents=True, exist_ok=True)
        identity = {"task": self.name, "study": self.cfg.study or default_study(self.name),
                    "objective": v.objective, "budget_s": v.budget_s}
        self.state = OptimizeState.load_or_new(self.out, identity)
        self.study: str = self.state.data["study"]
        self.budget = Budget(v.budget_s, spent_s=float(self.state.data.get("spent_s", 0.0)),
                             skip=("compress",) if self.cfg.goal == "none" else ())
        self.defaults = validate_params(dict(task.default_params))
        # selection reads val_data; the figures a user reads come from data nothing selected on
        self.user_task = task
        self.task, self.holdout = with_test_split(task, batch_size=int(self.defaults.get("batch_size", 32)))
        if self.holdout.note:
            log.warning("%s", self.holdout.note)
        self.run_id = self._parent_run()

    # -- records ------------------------------------------------------------------------------
    def _parent_run(self) -> int:
        stored = self.state.data.get("run_id")
        if stored is not None:
            self.store.update_run(int(stored), status="running", ended_at=None)
            return int(stored)
        config = {"stage": None, "budget_s": self.v.budget_s, "objective": self.v.objective,
                  "params": self.defaults, "out": str(self.out), "study": self.study,
                  "held_out": self.holdout.to_dict(),
                  "options": {k: redact_url(v) if k == "db" and v else v
                              for k, v in vars(self.cfg).items() if k != "extra"}}
        run_id = self.store.start_run("optimize", self.name, config=config, env=environment(self.dev),
                                      data_fingerprint=data_fingerprint(self.task, self.defaults),
                                      study=self.study)
        self.state.data["run_id"] = run_id
        self.state.save()
        return run_id

    def stage(self, name: str, fn: Callable[[float, float], _StageResult]) -> None:
        """Run stage ``name`` (unless it finished before) as a Run linked to the optimize run."""
        if self.state.finished(name):
            missing = self.state.missing_files(name, self.out)
            if not missing:
                self.say("stage_reused", {"stage": name})
                return
            # resume trusts files, not a flag: a finished stage whose outputs are gone runs again
            log.warning("stage %s finished before but its file(s) %s are missing: running it again",
                        name, ", ".join(missing))
            self.say("stage_rerun", {"stage": name, "missing": missing})
        share = self.budget.stage_s(name)
        self.say("stage_start", {"stage": name, "share_s": share})
        started = time.monotonic()
        run_id = self.store.start_run("optimize", self.name, config={
            "stage": name, "optimize_run": self.run_id, "share_s": share, "study": self.study},
            parent_id=self.run_id, study=self.study)
        try:
            res = fn(share, started + share)
        except BaseException as exc:
            self.store.finish_run(run_id, status="failed", error=f"{type(exc).__name__}: {exc}")
            self.state.stages[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                                       "run_id": run_id, "share_s": share,
                                       "duration_s": time.monotonic() - started}
            self.state.save()
            raise
        duration = time.monotonic() - started
        metrics = {k: x for k, x in (("before", res.before), ("after", res.after)) if x is not None}
        outputs = res.outputs.to_dict()
        self.store.finish_run(run_id, status="finished", result=json_safe(outputs),
                              metrics={f"{self.v.metric}_{k}": x for k, x in metrics.items()})
        self.state.stages[name] = {"status": res.status, "duration_s": duration, "share_s": share,
                                   "run_id": run_id, "outputs": outputs,
                                   "metric_before": res.before, "metric_after": res.after}
        self.state.data["spent_s"] = self.budget.elapsed_s
        self.state.save()
        self.say("stage_end", {"stage": name, "duration_s": duration, "status": res.status,
                               "before": res.before, "after": res.after})
        if name == "baseline":  # the plan, as soon as one training's time is measured
            self.say("plan", {"text": self._budget_plan().describe()})

    # -- stages -------------------------------------------------------------------------------
    def baseline(self, share: float, end: float) -> _StageResult:
        """The task's defaults (trained with the health checks) and a no-tricks run beside it."""
        epochs = self.task.default_epochs
        capture = _Capture()
        diag = diagnose(self.task, self.defaults, epochs=epochs, device=self.dev, seed=self.cfg.seed,
                        callbacks=[Deadline(share * 0.55), capture], store=self.store)
        if capture.model is not None:
            with replacing(self.out / "baseline_model.pt") as tmp:  # a signal leaves no half a file
                torch.save(capture.model.state_dict(), tmp)
        defaults_metric = finite_float(diag.metrics.get(self.v.metric))
        known = task_param_defaults(self.task)
        plain = {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.0,
                 "batch_size": int(self.defaults.get("batch_size", 32)),
                 **{k: 0.0 for k in known if "dropout" in k}}
        # as many epochs as the defaults got, so that the spread compares like with like, within
        # what is left of the stage's share (a slow model's no-tricks run is cut, and says so)
        plain_res = fit(self.task, plain, epochs=max(1, diag.epochs), device=self.dev, seed=self.cfg.seed,
                        callbacks=[Deadline(max(1.0, end - time.monotonic()))])
        plain_metric = finite_float(plain_res.metrics.get(self.v.metric))
        # seconds per epoch of the plain loop (the health checks slow the defaults' run)
        epoch_s = plain_res.duration_s / max(plain_res.steps, 1) * max(
            plain_res.steps / max(plain_res.epochs, 1), _steps_per_epoch(self.task, self.defaults))
        spread = (abs(defaults_metric - plain_metric)
                  if defaults_metric is not None and plain_metric is not None else None)
        return _StageResult(BaselineOutputs(
            defaults=TrainedRun(params=self.defaults, metrics=diag.metrics, epochs=diag.epochs, steps=diag.steps,
                                duration_s=diag.duration_s, run_id=diag.run_id, stop_reason=diag.stop_reason),
            no_tricks=TrainedRun(params=plain, metrics=plain_res.metrics, epochs=plain_res.epochs,
                                 duration_s=plain_res.duration_s, stop_reason=plain_res.stop_reason),
            spread=spread, epoch_s=epoch_s, held_out=self.holdout, findings=list(diag.findings),
            model="baseline_model.pt" if capture.model is not None else None,
        ), before=plain_metric, after=defaults_metric)

    def health(self, share: float, end: float) -> _StageResult:
        """Stop on an error-severity finding of the baseline's training; profile its step."""
        findings = self.state.record(BaselineOutputs).findings
        errors = [f for f in findings if f.severity == "error"]
        warnings = [f for f in findings if f.severity == "warning"]
        if errors and not self.cfg.ignore_findings:
            lines = [f"the baseline's training has {len(errors)} error finding(s); the loop stops before "
                     "any search (pass --ignore-findings to go on anyway):"]
            for f in errors:
                lines.append(f"  [{f.severity}] {f.cause}: {f.summary}")
                lines.append(f"    evidence: {f.to_dict()['evidence']}")
                lines.append(f"    fix: {f.fix}")
            raise RunFailedError("\n".join(lines))
        prof = run_profile(self.task, params=self.defaults, device=self.dev, seed=self.cfg.seed,
                           store=self.store)
        prof.save(self.out / "profile.json")
        return _StageResult(HealthOutputs(
            errors=errors, warnings=warnings, ignored=bool(errors), profile="profile.json",
            step_time_ms=prof.step.time_ms, peak_memory_bytes=prof.memory.peak_bytes,
            params=prof.params.total, macs=prof.macs, throughput=prof.step.throughput,
        ))

    def compute(self, share: float, end: float) -> _StageResult:
        """Batch size, LR (range test, scaled), accumulation, precision, data loading: recommend().

        The range test and the noise scale get as many steps as the share holds at the profiled
        step time (a slow model gets fewer, never more than the defaults of recommend)."""
        prof = Profile.load(self.out / "profile.json")
        step_s = max((prof.step.time_ms or 1.0) / 1e3, 1e-4)
        steps = share / step_s  # training steps the share holds at the profiled step time
        lr_steps = int(min(100, max(10, 0.45 * steps)))  # the LR matters most: at least 10 steps
        noise_steps = int(min(30, 0.2 * steps / 4))
        noise_steps = noise_steps if noise_steps >= 3 else 0  # too few to estimate: not measured
        optimizer_s = min(4.0, 0.25 * share) if 0.25 * steps >= 20 else 0.0  # each optimizer ~10 steps
        recs = recommend(self.task, self.defaults, profile=prof, memory_budget=self.v.memory_bytes,
                         device=self.dev, seed=self.cfg.seed, lr_steps=lr_steps,
                         noise_steps=noise_steps, optimizer_budget_s=optimizer_s,
                         embedding_budget_s=min(120.0, 0.3 * share), store=self.store)
        values = {r.name: r.value for r in recs}
        computed: dict[str, Any] = {}
        if isinstance(values.get("batch_size"), int):
            computed["batch_size"] = values["batch_size"]
        if finite_float(values.get("lr")) is not None:
            computed["lr"] = float(values["lr"])
        if isinstance(values.get("grad_accumulation"), int):
            computed["grad_accumulation"] = values["grad_accumulation"]
        if values.get("precision") in ("fp32", "bf16", "fp16"):
            computed["precision"] = values["precision"]
        opt = recs.get("optimizer") if "optimizer" in values else None
        chosen = (opt.evidence.get("params") or {}) if opt is not None else {}
        if (opt is not None and opt.value in ("adamw", "adam", "sgd") and opt.value != self.defaults.get("optimizer", "adamw")
                and chosen.get("lr")):
            # measured better than the task's optimizer: the search tries both, each at its own rate
            computed["optimizer_alternative"] = {k: chosen[k] for k in ("optimizer", "lr", "momentum") if k in chosen}
        max_batch = recs.get("batch_size").evidence.get("max_batch_size")
        return _StageResult(ComputeOutputs(
            computed=computed, max_batch_size=max_batch, run_id=recs.run_id,
            steps={"lr_range_test": lr_steps, "noise_scale": noise_steps, "optimizer_budget_s": optimizer_s,
                   "step_ms": prof.step.time_ms, "share_steps": steps},
            recommendations=[{"name": r.name, "value": r.value, "reason": r.reason,
                              "confidence": r.confidence, "effect": r.effect} for r in recs],
        ))

    def layer_value(self, share: float, end: float) -> _StageResult:
        """Each layer's cost (time, params, MACs) beside its measured contribution (mean ablation)."""
        prof = Profile.load(self.out / "profile.json")
        model = self.task.build_model(dict(self.defaults))
        model.load_state_dict(torch.load(self.out / "baseline_model.pt", weights_only=True))
        base, values, notes = layer_values(
            self.task, model, metric=self.v.metric, higher_is_better=self.v.maximize, profile=prof,
            device=self.dev, batch_size=int(self.defaults.get("batch_size", 32)), deadline=end)
        named = [LayerFinding(layer=x.name, finding=x.finding, action=x.action) for x in values if x.finding]
        return _StageResult(LayerValueOutputs(metric=base, layers=list(values), findings=named,
                                              keep=list(keep_layers(values)), notes=list(notes)))

    def _epoch_s(self) -> float:
        return max(float(self.state.record(BaselineOutputs).epoch_s or 1.0), 1e-3)

    def _race_seeds(self) -> int:
        """Paired seeds the race plans for: enough to detect, at the decision's confidence, the
        gain the search measured given the seeds' spread (``--seeds`` at least; before the
        search, ``--seeds``)."""
        low = int(self.cfg.seeds)
        if not self.state.finished("search"):
            return low
        srch = self.state.record(SearchStageOutputs)
        if srch.best is None or srch.defaults is None:
            return low
        gain = abs(srch.best.mean - srch.defaults.mean)
        std = prior_seed_std(srch.seed_std, metric=self.v.metric, val_samples=self.holdout.val_samples,
                             level=finite_float(srch.defaults.mean))
        from ._final import _resolution

        return paired_seeds_needed(seed_std=std, gain=gain, resolution=_resolution(self.v.metric, self.holdout.val_samples),
                                   alpha=ALPHA, low=low, high=max(low, MAX_ROUNDS))

    def _budget_plan(self, *, search_done: bool = False) -> BudgetPlan:
        """What the seconds left hold at the task's own protocol (made again from measured times
        before each stage that depends on it)."""
        full = self.task.default_epochs
        # the stages before the search that have not run yet take their shares from what is left
        pending = [s for s in ("health", "compute", "layer_value") if not self.state.finished(s)]
        after = self._compress_reserve() + sum(self.budget.stage_s(s) for s in pending)
        seeds, finalists = self._race_seeds(), 1 if search_done else RESERVED_CANDIDATES

        def plan(trial_epochs: int) -> BudgetPlan:
            return plan_budget(full_epochs=full, epoch_s=self._epoch_s(), run_overhead_s=RUN_OVERHEAD_S,
                               left_s=self.budget.left_s, spent_s=self.budget.elapsed_s,
                               budget_s=self.v.budget_s, after_s=after, seeds=seeds, finalists=finalists,
                               trial_epochs=trial_epochs, search_done=search_done)

        return plan(self._trial_epochs(plan(full).search_s))

    def _trial_epochs(self, seconds: float) -> int:
        """Epochs of every search trial and of the race's candidates: the task's own (the
        protocol the defaults are judged by), unless the search's time cannot hold about six
        trials of them."""
        full = self.task.default_epochs
        if seconds >= FULL_TRIALS_AT_LEAST * full * self._epoch_s():
            return full
        return max(1, min(full, int(seconds / (FULL_TRIALS_AT_LEAST * self._epoch_s()))))

    def _compress_reserve(self) -> float:
        """Seconds kept for compression: a fifth of the budget, within what one sweep needs."""
        if self.cfg.goal == "none":
            return 0.0
        return min(COMPRESS_RESERVE_S, max(MIN_COMPRESS_S, 0.2 * self.v.budget_s))

    def search(self, share: float, end: float) -> _StageResult:
        """Search what the compute stage could not decide: warm start, TPE, successive halving.

        The search gets every second the stages after it do not need (their reserves: the final
        race at ``--seeds`` seeds, one compression sweep), not only its share."""
        comp = self.state.record(ComputeOutputs)
        plan = build_plan(self.task, comp.computed, user_space=self.cfg.space,
                          max_batch=comp.max_batch_size, samples=_samples(self.task, self.defaults))
        compress_min = self._compress_reserve()
        budget_plan = self._budget_plan()
        self.say("plan", {"text": budget_plan.describe()})
        epochs = budget_plan.trial_epochs
        epoch_s = self._epoch_s()
        race_s = budget_plan.race_s if budget_plan.race_fits else 0.0

        def reserve(trial_s: float) -> float:
            return race_s + compress_min

        # (the budget already excludes what an earlier, killed process spent: the clock resumes)
        seconds = max(1.0, self.budget.left_s - reserve(0.0))
        # successive halving only where full trials are dear (below ~15 in the time there is): it
        # favours fast starters, which small or noisy data punishes (measured: benchmarks/optimize.py)
        full_trials = seconds / (epochs * epoch_s)
        settings = StageSettings(
            objective=self.v.objective, metric=self.v.metric, maximize=self.v.maximize,
            constraints=tuple(self.cfg.constraints), epochs=epochs, study=self.study, seed=self.cfg.seed,
            device=str(self.dev), max_trials=self.cfg.max_trials, patience=self.cfg.patience,
            min_delta=self.cfg.min_delta, flag_min=self.cfg.flag_min, defaults=self.defaults,
            pruner="asha" if full_trials < FULL_TRIALS_FOR_NO_PRUNER else "none",
            trial_s_estimate=epochs * epoch_s,
            alternative=dict(comp.computed.get("optimizer_alternative") or {}))
        spent = float(self.state.data.get("search_spent_s", 0.0))
        t0 = time.monotonic()

        def on_chunk(info: dict[str, Any]) -> None:
            self.state.data["search_spent_s"] = spent + time.monotonic() - t0
            self.state.data["spent_s"] = self.budget.elapsed_s
            self.state.save()
            self.say("search_chunk", info)

        outcome = run_search_stage(self.task, plan, settings, store=self.store, seconds=seconds,
                                   on_chunk=on_chunk, must_end=self.budget.end, reserve=reserve)
        for flag in outcome.flags:
            self.say("yellow_flag", flag.to_dict())
        best = outcome.best
        counts: dict[str, int] = {}
        for r in outcome.trials:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        write_text(self.out / "search_trials.json", json_dumps(outcome.trials, indent=1))
        return _StageResult(SearchStageOutputs(
            study=self.study, plan=plan.to_dict(), epochs_per_trial=epochs,
            pruner=settings.pruner if epochs >= 3 else "none", full_trials_in_share=full_trials,
            best=best, top=outcome.groups[:5], defaults=outcome.defaults,
            flags=list(outcome.flags), stop_reason=outcome.stop_reason,
            early=outcome.early, arms=outcome.arms, counts=counts,
            trials=len(outcome.trials), search_calls=outcome.search_calls,
            history=[list(h) for h in outcome.history], trials_file="search_trials.json", budget_plan=budget_plan,
            duration_s=outcome.duration_s, seconds=seconds,
            seed_std=pooled_seed_std((g.std, g.n) for g in [*outcome.groups, *filter(None, [outcome.defaults])]),
            # every trial as the report draws it (its arm, state and why it ended)
            trials_log=[TrialLog(number=r["number"], state=r["state"], value=r["value"], arm=r["arm"],
                                 reason=r["reason"], duration_s=r["duration_s"]) for r in outcome.trials],
        ), before=finite_float(outcome.defaults.mean if outcome.defaults else None),
            after=best.mean if best else None)

    def final(self, share: float, end: float) -> _StageResult:
        """The defaults and the search's best, same seeds, same protocol; keep the defaults unless
        a configuration beats them beyond noise; held-out figures for both."""
        srch = self.state.record(SearchStageOutputs)
        # every arm trains at the task's own protocol: the defaults as the user runs them, and the
        # search's finalists promoted from the trials' fidelity to it (never a shortened copy)
        epochs = self.task.default_epochs
        base_epoch_s = self._epoch_s()
        budget_plan = self._budget_plan(search_done=True)
        race_notes: list[str] = []
        fixed = srch.fixed()
        defaults_key = _params_key(self.defaults)
        trial_epochs = int(srch.epochs_per_trial or epochs)
        proposals: list[Arm] = []
        for g in srch.top:  # the groups the search measured, best first
            params = validate_params({**self.defaults, **fixed, **g.params})
            if _params_key(params) == defaults_key or len(proposals) >= MAX_CANDIDATES:
                continue
            proposals.append(Arm(
                name=f"search #{len(proposals) + 1}", params=params,
                source=(f"search trials {g.trials} ({', '.join(sorted(set(g.arms)))}"
                        + (f", at {trial_epochs} of {epochs} epochs" if trial_epochs < epochs else "") + ")"),
                search_mean=g.mean, search_std=g.std, search_n=g.n,
                epoch_s=max(g.trial_s / max(trial_epochs, 1), base_epoch_s * 0.25), epochs=epochs))
        candidates = proposals
        # the search's best at the trials' shorter protocol races too: adopted only as a time
        # gain, where it reaches the defaults' metric at their own protocol
        shorter = (dataclasses.replace(proposals[0], name=f"{proposals[0].name} at {trial_epochs} epochs",
                               epochs=trial_epochs) if proposals and trial_epochs < epochs else None)
        if not budget_plan.race_fits and proposals:
            shorter = None
            candidates = []  # the race would compare at a protocol neither the user nor the result uses
            race_notes.append(budget_plan.describe())
        d_group = srch.defaults
        hard_end = self.budget.end - min(self._compress_reserve(), MIN_COMPRESS_S)
        defaults = Arm(name="defaults", params=dict(self.defaults), source="the task's defaults",
                       search_mean=d_group.mean if d_group is not None and trial_epochs == epochs else None,
                       search_std=d_group.std if d_group is not None else None,
                       search_n=d_group.n if d_group is not None else 0, epoch_s=base_epoch_s, epochs=epochs)
        plan = FinalPlan(metric=self.v.metric, maximize=self.v.maximize, epochs=epochs,
                         seeds=max(int(self.cfg.seeds), budget_plan.seeds), seed=self.cfg.seed, device=str(self.dev),
                         val_samples=self.holdout.val_samples,
                         prior_std=prior_seed_std(srch.seed_std, metric=self.v.metric,
                                                  val_samples=self.holdout.val_samples,
                                                  level=finite_float(d_group.mean if d_group else None)),
                         protocol=f"the task's own protocol ({epochs} epochs) for every arm")
        outcome = run_final(self.task, defaults, candidates, plan, store=self.store,
                            end=self.budget.end - self._compress_reserve(), hard_end=hard_end,
                            cap_end=self.budget.end, folder=self.out, say=self.say, notes=race_notes,
                            shorter=shorter)
        chosen = outcome.arm(outcome.chosen)
        params, evidence = self._evidence(chosen, outcome)
        model = self.task.build_model(dict(params))
        model.load_state_dict(torch.load(self.out / "model.pt", weights_only=True))
        latency, size = _latency_ms(self.task, model), size_bytes(self.out / "model.pt")
        val, test = chosen.summary("val"), chosen.summary("test")
        picked = outcome.model_run()
        return _StageResult(FinalOutputs(
            params=params, evidence=evidence, epochs=chosen.epochs or epochs,
            default_epochs=self.task.default_epochs, race=outcome,
            proposals=[] if candidates else [a.params for a in proposals],
            decision=outcome.decision, chosen=outcome.chosen,
            metric=dataclasses.replace(val, values=[r.val for r in chosen.runs]),
            test=dataclasses.replace(test, values=[r.test for r in chosen.runs]),
            model="model.pt", model_seed=outcome.model_seed, latency_ms=latency, size_bytes=size,
            model_val=picked.val if picked else None, model_test=picked.test if picked else None,
            load=(f"model = proftune.load_task({self.spec!r}).build_model(params); "
                  "model.load_state_dict(torch.load('model.pt', weights_only=True))"),
        ), before=finite_float(outcome.arm("defaults").summary("val").mean), after=val.mean)

    def _evidence(self, chosen: Arm, outcome: FinalOutcome) -> tuple[dict[str, Any], dict[str, str]]:
        """The result's params, and for each where its value came from."""
        comp = self.state.record(ComputeOutputs).computed
        params = dict(chosen.params)
        evidence: dict[str, str] = {}
        why = (outcome.comparison.describe() if outcome.comparison is not None
               else "no configuration reached the final race")
        for k, val in params.items():
            default = self.defaults.get(k)
            if outcome.kept_defaults:
                evidence[k] = f"task default (kept: {why})"
            elif k in comp and _same(comp[k], val):
                evidence[k] = "computed (compute stage: recommend)"
            elif k == "optimizer" and val == (comp.get("optimizer_alternative") or {}).get("optimizer"):
                evidence[k] = (f"computed (the optimizer row measured {val} better than "
                               f"{self.defaults.get('optimizer', 'adamw')} at equal time; the race confirmed it)")
            elif k in self.defaults and _same(default, val):
                evidence[k] = "task default"
            else:
                std = f" +- {chosen.search_std:.4g}" if chosen.search_std is not None else ""
                mean = f"{chosen.search_mean:.4g}" if chosen.search_mean is not None else "-"
                evidence[k] = (f"searched (study {self.study}, {chosen.source}: {self.v.metric} {mean}{std} "
                               f"over {chosen.search_n} trial(s); final: {why})")
        return params, evidence

    def compress(self, share: float, end: float) -> _StageResult:
        """The final model toward ``--goal`` within ``--max-accuracy-drop`` (proftune.compress)."""
        if self.cfg.goal == "none":
            return _StageResult(CompressOutputs(skipped="--goal none"), status="skipped")
        params = dict(self.state.record(FinalOutputs).params)
        model = self.task.build_model(dict(params))
        model.load_state_dict(torch.load(self.out / "model.pt", weights_only=True))
        names = {n for n, _ in model.named_modules()}
        keep = [n for n in self.state.record(LayerValueOutputs).keep if n in names]
        if share < MIN_COMPRESS_S:
            return _StageResult(CompressOutputs(skipped=f"{share:.1f} s left for compression, below the "
                                                        f"{MIN_COMPRESS_S:.0f} s one pruning + INT8 sweep needs "
                                                        "here; give a larger --budget"), status="skipped")
        # the sweep grows with the time there is: per-layer sensitivity and a second ratio
        # only when the share holds them (measured: ~45 s for one ratio with sensitivity on 2 cores)
        roomy = share >= 90
        ratios = (0.3, 0.5) if roomy else (0.5,)
        out_file = self.out / "model_compressed.pt"
        try:
            report = run_compress(
                self.task, params=params, model=model, store=self.store,
                callbacks=[Deadline(max(1.0, (end - time.monotonic()) / (2 * len(ratios))))],
                ratios=ratios, ignore_layers=tuple(keep), max_accuracy_drop=self.cfg.max_accuracy_drop,
                metric=self.v.metric, goal=self.cfg.goal, out=str(out_file), force=True,
                finetune_epochs=1, seed=self.cfg.seed, device=str(self.dev), sensitivity=roomy,
                # building stops at 60% of the share: measuring, saving and the held-out check follow
                time_limit_s=max(1.0, 0.6 * (end - time.monotonic())),
                latency_rounds=5 if roomy else 3, layer_times=roomy)
        except (ConfigError, RunFailedError, RuntimeError, TypeError, ValueError, AttributeError) as exc:
            # a model these methods cannot cut or convert keeps the uncompressed result, which
            # the stages before already hold; the run goes on to its outputs
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            log.info("compression failed: %s", why)
            out_file.unlink(missing_ok=True)
            return _StageResult(CompressOutputs(skipped=f"compression failed ({why})",
                                                verdict=f"kept the uncompressed model: compression failed ({why})"),
                                status="skipped")
        chosen_c = report.selected
        test_metric = None
        if chosen_c is not None and report.output:
            try:
                small = load_model(report.output, task=self.task, params=params)
                test_metric = finite_float(evaluate_model(self.task, small, torch.device("cpu"),
                                                     int(params.get("batch_size", 32)), split="test")
                                      .get(self.v.metric))
            except (ConfigError, RuntimeError, TypeError, ValueError) as exc:
                log.info("the compressed model could not be evaluated on the held-out data: %s", exc)
        elif out_file.exists():
            out_file.unlink()  # a file from an earlier sweep is not this run's result
        base = _figures(report.baseline, method=False)
        sel = _figures(chosen_c, test_metric=test_metric, format=True) if chosen_c is not None else None
        goal_key = "latency_ms" if self.cfg.goal == "latency" else "size_bytes"
        kept = "kept the uncompressed model: "
        notes = [n[len(kept):] if n.startswith(kept) else n for n in report.notes or ["no candidate qualified"]]
        verdict = (f"{kept}{'; '.join(notes)}"
                   if sel is None else
                   f"{method_name(sel)} beats the uncompressed model on {self.cfg.goal}: "
                   + (f"{fmt_ms(sel.latency_ms)} vs {fmt_ms(base.latency_ms)} at batch 1"
                      if goal_key == "latency_ms" else
                      f"{format_bytes(sel.size_bytes)} vs {format_bytes(base.size_bytes)}"))
        return _StageResult(CompressOutputs(
            run_id=report.run_id, plan=list(report.plan), notes=list(report.notes), verdict=verdict,
            ignored_layers=keep, ratios=list(ratios), baseline=base, selected=sel,
            candidates=[_figures(c, within_budget=True) for c in report.candidates],
            output="model_compressed.pt" if sel is not None and report.output else None, load=report.load_line,
        ), before=finite_float(base.metric), after=finite_float(sel.metric) if sel is not None else None)

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> OptimizeResult:
        fns: dict[str, Callable[[float, float], _StageResult]] = {
            "baseline": self.baseline, "health": self.health, "compute": self.compute,
            "layer_value": self.layer_value, "search": self.search, "final": self.final,
            "compress": self.compress}
        try:
            for name in OPTIMIZE_STAGES:
                self.stage(name, fns[name])
        except BaseException as exc:
            self.store.finish_run(self.run_id, status="failed", error=f"{type(exc).__name__}: {exc}",
                                  result=json_safe({"stages": self.state.stages}))
            raise
        result = self._result()
        result = dataclasses.replace(result, files=write_outputs(result, self.state, self.out, task=self.task))
        self.store.finish_run(self.run_id, status="finished", result=json_safe(result.to_dict()),
                              metrics={f"final_{self.v.metric}": result.final.mean or float("nan")},
                              artifacts=result.files)
        html = write_html(self.run_id, self.out, self.store)  # reads the finished run
        if html is not None:
            result = dataclasses.replace(result, files={**result.files, "report": html})
            self.store.update_run(self.run_id, artifacts=result.files)
        write_summary(result, self.out)
        return result

    def _stop_reason(self) -> str:
        """Why the run ended when it did, in one sentence."""
        srch = self.state.record(SearchStageOutputs)
        race = self.state.record(FinalOutputs).race
        seeds = len(race.seeds) if race else 0
        used = self.budget.elapsed_s
        if srch.early:
            return (f"the search ended early ({srch.stop_reason}); the time left went to the final "
                    f"race ({seeds} paired seed(s) per configuration) and compression; {used:.0f} s of "
                    f"{self.v.budget_s:.0f} s used")
        if used < 0.8 * self.v.budget_s:
            return (f"every stage finished its work in {used:.0f} s of {self.v.budget_s:.0f} s "
                    f"(search: {srch.stop_reason}; final race: {seeds} seed(s), at most "
                    f"{race.plan.seeds if race else None} asked)")
        return f"the budget is spent: {used:.0f} s of {self.v.budget_s:.0f} s (search: {srch.stop_reason})"

    def _changes(self, arm: Arm) -> list[ParamChange]:
        """``arm``'s params against the defaults in effect, each with where its value came from."""
        comp = self.state.record(ComputeOutputs)
        std = f" ± {arm.search_std:.3g}" if arm.search_std is not None else ""
        searched = (f"{arm.source}: {self.v.metric} {arm.search_mean:.3g}{std} over {arm.search_n} trial(s)"
                    if arm.search_mean is not None else arm.source)
        rows = param_changes(arm.params, task_defaults=self.defaults, read_defaults=task_param_defaults(self.task),
                             computed=comp.computed, reasons=comp.reasons(),
                             fixed=self.state.record(SearchStageOutputs).fixed(), searched=searched)
        default_epochs = self.task.default_epochs
        runs = {r.epochs for r in arm.runs if not r.cut}
        epochs = arm.epochs or (runs.pop() if len(runs) == 1 else None)
        if epochs is not None and epochs != default_epochs:  # the race trains the search's arms as they were measured
            rows.append(ParamChange(param="epochs", default=default_epochs, default_from="task", value=epochs,
                                    changed=True, source="computed",
                                    why="the epochs this arm trained"))
        return rows

    def _result(self) -> OptimizeResult:
        st = self.state
        fin = st.record(FinalOutputs)
        race = fin.race
        if race is None:
            raise RunFailedError("the final stage left no race in state.json; run the same command to redo it")
        d_val, d_test = race.arm("defaults").summary("val"), race.arm("defaults").summary("test")
        stages = []
        for name in OPTIMIZE_STAGES:
            rec = st.stages.get(name, {})  # state.json's entry of the stage
            after = rec.get("metric_after")
            gain = None
            if after is not None and d_val.mean is not None and name in ("search", "final", "compress"):
                gain = (after - d_val.mean) if self.v.maximize else (d_val.mean - after)
            stages.append(StageRow(name=name, status=rec.get("status"), duration_s=rec.get("duration_s"),
                                   share_s=rec.get("share_s"), run_id=rec.get("run_id"),
                                   metric_before=rec.get("metric_before"), metric_after=after,
                                   compares=STAGE_COMPARES.get(name), gain_vs_baseline=gain,
                                   outputs=_compact(name, rec.get("outputs") or {})))
        comp = st.record(CompressOutputs)
        sel, cb = comp.selected, comp.baseline
        chosen = race.arm(race.chosen)
        final = FinalSummary(
            params=fin.params, evidence=fin.evidence, decision=race.decision, metrics={self.v.metric: fin.metric},
            mean=fin.metric.mean, std=fin.metric.std, test=fin.test, seeds=race.seeds, epochs=fin.epochs,
            default_epochs=fin.default_epochs, model_seed=race.model_seed, model_val=fin.model_val,
            model_test=fin.model_test, model=str(self.out / "model.pt"), load=fin.load,
            # the uncompressed model as compress measured it beside its candidates, where it ran
            latency_ms=cb.latency_ms if cb is not None and cb.latency_ms is not None else fin.latency_ms,
            latency_batch_ms=cb.latency_batch_ms if cb is not None else None,
            batch_size=cb.batch_size if cb is not None else None,
            # one figure of the model's size wherever it is shown: compress's, where it ran
            size_bytes=cb.size_bytes if cb is not None and cb.size_bytes else fin.size_bytes,
            compressed=(CompressedModel(**{**sel.to_dict(), "model": str(self.out / "model_compressed.pt"),
                                           "load": comp.load}) if sel is not None else None),
            changes=self._changes(chosen))
        base = st.record(BaselineOutputs)
        cmp_val = race.comparison
        speedups: dict[str, float | None] = {}
        for key, name in (("latency_ms", "latency_speedup"), ("latency_batch_ms", "latency_batch_speedup"),
                          ("size_bytes", "size_ratio")):
            old, new = (getattr(cb, key), getattr(sel, key)) if cb is not None and sel is not None else (None, None)
            speedups[name] = old / new if old and new else None
        vs = VsBaseline(
            metric=self.v.metric, decision=race.decision, defaults_params=self.defaults,
            summary=_decision_line(race, self.v.metric), defaults=SplitSummaries(val=d_val, test=d_test),
            final=SplitSummaries(val=chosen.summary("val"), test=chosen.summary("test")),
            baseline=d_val.mean, baseline_test=d_test.mean, final_mean=fin.metric.mean, final_std=fin.metric.std,
            final_test_mean=fin.test.mean, final_test_std=fin.test.std, leader=race.leader,
            leader_vs_defaults=SplitComparisons(val=cmp_val, test=race.comparison_test),
            beyond_noise=bool(cmp_val and cmp_val.beyond_noise), search_gap=race.search_gap(),
            race_note=race.note, held_out=self.holdout, held_out_source=self.holdout.describe(),
            no_tricks=finite_float(base.metric("no_tricks", self.v.metric)),
            baseline_run=finite_float(base.metric("defaults", self.v.metric)),
            gain=(_signed(fin.metric.mean - d_val.mean, self.v.maximize)
                  if fin.metric.mean is not None and d_val.mean is not None else None),
            gain_test=(_signed(fin.test.mean - d_test.mean, self.v.maximize)
                       if fin.test.mean is not None and d_test.mean is not None else None),
            # what the search proposed, though it was not adopted
            leader_changes=(self._changes(race.arm(race.leader))
                            if race.leader is not None and race.leader != race.chosen else
                            self._changes(Arm(name="search #1", params=dict(fin.proposals[0]),
                                              source="the search's best (not raced: the budget could not "
                                                     "hold a race at the task's own protocol)",
                                              epochs=self.task.default_epochs))
                            if fin.proposals else []),
            compression=comp.verdict or comp.skipped,
            compressed_metric=sel.metric if sel is not None else None,
            compressed_test_metric=sel.test_metric if sel is not None else None, **speedups)
        result = OptimizeResult(
            task=self.name, study=self.study, run_id=self.run_id, out=str(self.out),
            objective=self.v.objective, budget_s=self.v.budget_s, elapsed_s=self.budget.elapsed_s,
            stages=stages, final=final, vs_baseline=vs, flags=st.record(SearchStageOutputs).flags,
            warnings=st.record(HealthOutputs).warnings,
            layer_findings=st.record(LayerValueOutputs).findings,
            stop_reason=self._stop_reason(), spec=self.spec)
        # a line that runs from any folder: the params from config.yaml, the weights by absolute path
        result = dataclasses.replace(result, final=dataclasses.replace(final, load=load_line(result)))
        return dataclasses.replace(result, story=tell(result))


#: What each stage's "before -> after" means (the table says it per row).
STAGE_COMPARES = {
    "baseline": "no-tricks run -> the task's defaults (one seed, with the health checks)",
    "search": "the defaults -> the best configuration, as the search trials measured them",
    "final": "the defaults -> the result, mean over the paired seeds (validation data)",
    "compress": "the uncompressed result -> the compressed model",
}


def _check_same_store(v: Validated, store: Store) -> None:
    """A ``state.json`` to continue must belong to this store: its optimize run is there, of the
    same task and study. Refused before anything is written (a resume would else write the
    outputs of another store's run)."""
    stored = v.stored or {}
    run_id = stored.get("run_id")
    if run_id is None:
        return
    why = None
    try:
        run = store.get_run(int(run_id))
    except (ConfigError, TypeError, ValueError):
        why = f"its optimize run {run_id!r} is not in {store.shown_url}"
    else:
        if run.kind != "optimize" or run.task != stored.get("task") or run.study != stored.get("study"):
            why = (f"run {run_id} of {store.shown_url} is a {run.kind} run of task {run.task!r}, study "
                   f"{run.study!r}, not this folder's optimize run of task {stored.get('task')!r}")
    if why is not None:
        raise ConfigError(f"out={str(v.out)!r}: its state.json belongs to another store ({why}); resume "
                          "with the db= it was recorded in, or choose another out=.")


def _decision_line(race: FinalOutcome, metric: str) -> str:
    cmp = race.comparison
    if cmp is None:
        return "kept the defaults: no searched configuration reached the final race"
    if race.kept_defaults:
        return f"no configuration beat the defaults beyond noise; kept them ({cmp.describe()})"
    if race.shorter:
        return (f"{race.chosen} reaches the defaults' {metric} at a shorter protocol: the same result in "
                f"less training time ({cmp.metric} difference {cmp.gain:+.4g}, lower bound {cmp.lower:+.4g} "
                f"over {len(cmp.seeds)} paired seeds)")
    return f"{race.chosen} beats the defaults beyond noise ({cmp.describe()})"


def _signed(diff: float, maximize: bool) -> float:
    return diff if maximize else -diff


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return bool(a == b)


def _params_key(params: dict[str, Any]) -> str:
    return repr(sorted((k, round(float(v), 12) if isinstance(v, float) else v) for k, v in params.items()))


def _compact(name: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """A stage's outputs for ``--json`` and the table: the decisions, not every measurement."""
    drop = {"search": ("history", "plan", "top", "trials_log"), "layer_value": ("layers",),
            "compute": ("recommendations",), "final": ("evidence", "race")}
    return {k: v for k, v in outputs.items() if k not in drop.get(name, ())}


def _figures(c: Candidate, *, method: bool = True, format: bool = False, within_budget: bool = False,
             test_metric: float | None = None) -> ModelFigures:
    """A compress candidate as the stage keeps it: its figures (``method=False``: the
    uncompressed model), with its file format, budget verdict or held-out metric where asked."""
    return ModelFigures(method=c.method if method else None, ratio=c.ratio if method else None, metric=c.metric,
                        metric_drop=c.metric_drop if method else None, test_metric=test_metric,
                        latency_ms=c.latency_ms, latency_batch_ms=c.latency_batch_ms, size_bytes=c.size_bytes,
                        params=c.params, macs=c.macs, batch_size=c.batch_size, format=c.format if format else None,
                        within_budget=c.within_budget if within_budget else None)


def _steps_per_epoch(task: Task, params: dict[str, Any]) -> int:
    data = task.train_data(int(params.get("batch_size", 32)), params)
    n = getattr(data, "__len__", None)
    return int(n()) if callable(n) else 1


def _samples(task: Task, params: dict[str, Any]) -> int | None:
    """Training samples per epoch (an upper bound: batches x batch size), when the data has a length."""
    bs = int(params.get("batch_size", 32))
    data = task.train_data(bs, params)
    n = getattr(data, "__len__", None)
    return int(n()) * bs if callable(n) else None


def _latency_ms(task: Task, model: nn.Module) -> float | None:
    """``latency_ms`` of the model on CPU (its one producer, :func:`proftune.profile.task_latencies`);
    None when the task's loss does not feed the model inputs that can be sliced to one sample."""
    try:
        return task_latencies(task, model.cpu(), (1,), device=torch.device("cpu"), rounds=5)[1].ms
    except (ConfigError, RuntimeError, TypeError, ValueError) as exc:
        log.info("no latency for the final model: %s", exc)
        return None


def optimize(task: Task | str, budget: str | float = "20m", *, config: OptimizeConfig | None = None,
             store: Store | None = None, progress: Progress | None = None, **options: Any) -> OptimizeResult:
    """Run the closed loop on ``task`` within ``budget`` (``"5m"``, ``90``, ...) and return its result.

    ``options`` set :class:`OptimizeConfig` fields (``memory_budget``, ``constraints``,
    ``objective``, ``space``, ``max_accuracy_drop``, ``goal``, ``seeds``, ``out``, ``study``,
    ``resume``, ``ignore_findings``, ``device``, ``db``, ``seed``). The same call again with
    ``resume=True`` (or the same ``study``) continues from the last finished stage.
    ``progress(event, data)`` is called at each stage's start and end, after search chunks and
    after each final run.
    """
    task_obj = load_task(task)
    v = validate(task_obj, config, {"budget": budget, **options})
    st = store or Store(v.cfg.db)
    _check_same_store(v, st)
    with own_run(v.out, st, (v.stored or {}).get("study") or v.cfg.study):
        return _Loop(task_obj, v, st, progress, spec=task if isinstance(task, str) else None).run()


def _absolute_spec(spec: str) -> str:
    """``spec`` with a relative task file made absolute (built-in names, modules unchanged)."""
    head, sep, tail = spec.rpartition(":") if ":" in spec else (spec, "", "")
    path_part, cls = (head, f":{tail}") if sep and tail.isidentifier() else (spec, "")
    if path_part.endswith(".py") and Path(path_part).exists():
        return f"{Path(path_part).resolve()}{cls}"
    return spec
