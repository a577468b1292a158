"""The built-in stages of the optimize loop, each a registered :class:`BaseStage`:
baseline -> health -> compute -> layer_value -> search -> final -> compress.

Every stage calls the public API of the subpackage that owns the work, and reads what the
stages before it measured from their records in ``state.json`` (``loop.state.record(...)``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import time
from collections.abc import Sequence
from typing import Any, cast

import torch

from .._jsonsafe import finite_float, json_dumps
from .._optimizers import DEFAULT_LR, DEFAULT_OPTIMIZER
from .._paths import replacing, write_text
from .._units import format_bytes, format_ms
from ..compress import compress as run_compress
from ..compress import load_model
from ..diagnose import diagnose
from ..exceptions import ConfigError, RunFailedError
from ..profile import Profile, size_bytes
from ..profile import profile as run_profile
from ..recommend import BatchSizeEvidence, recommend
from ..train import evaluate_model, fit, seed_everything
from . import _stage_measures as measures
from ._budget import Deadline
from ._budget_plan import FULL_TRIALS_FOR_NO_PRUNER, MIN_COMPRESS_S
from ._computed import ComputedValues
from ._context import StageContext
from ._decide import lead_in_search, pooled_seed_std, prior_seed_std, sampling_std, winners_curse
from ._final import (
    Arm,
    FinalOutcome,
    FinalPlan,
    races_on_resplits,
    run_final,
)
from ._health_gate import searched_params, stopping_findings, tuned
from ._layer_value import LayerFinding, keep_layers, layer_values
from ._lr_check import check_computed_lr, short_check_seconds
from ._numbers import method_name
from ._records import (
    BaselineOutputs,
    CompressOutputs,
    ComputeOutputs,
    FinalOutputs,
    HealthOutputs,
    LayerValueOutputs,
    SearchStageOutputs,
    TrainedRun,
)
from ._reuse import MODELS_DIR, baseline_first, cut_short, kept_runs, search_first, search_proposals, short_finalist
from ._search import StageSettings, TrialLog, run_search_stage, standing, trial_json
from ._search_plan import build_plan, task_param_defaults
from ._search_records import defaults_outside_race
from ._stages import BaseStage, StageResult, register_stage

log = logging.getLogger(__name__)

#: Trainings of the defaults the budget holds for the no-tricks run to train as long (else it is timed).
NO_TRICKS_AT_LEAST = 24
#: Steps the no-tricks run is timed over where it is only timed (at most two epochs).
NO_TRICKS_TIMED_STEPS = 12
#: The share of the budget within which the baseline trains the defaults' own epochs (else cut).
BASELINE_WHOLE = 0.4
#: Each of the computed lr's two short runs takes at most this share of the whole budget.
CHECK_BUDGET_SHARE = 0.05


@register_stage
class Baseline(BaseStage):
    name = "baseline"
    share = 0.1
    record = BaselineOutputs
    compares = "no-tricks run -> the task's defaults (one seed, with the health checks)"

    def on_end(self, loop: StageContext) -> None:
        plan = loop.planner.budget_plan()  # as soon as one training is timed
        loop.say("plan", {"text": plan.describe(), "plan": plan.to_dict()})

    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        """The task's defaults (trained with the health checks) and a no-tricks run beside it."""
        epochs = loop.task.default_epochs
        # the untrained model's metric (the defaults' seed): where the defaults' curve starts
        seed_everything(loop.cfg.seed)
        untrained = loop.task.build_model(dict(loop.defaults)).to(loop.dev)
        start = finite_float(evaluate_model(loop.task, untrained, loop.dev, loop.defaults_record.batch_size or 32)
                             .get(loop.v.metric))
        del untrained
        capture = measures.ModelCapture(loop.v.metric)
        # the defaults' own epochs to the end where they fit in BASELINE_WHOLE of the budget: this
        # training is their first race seed and their search measurement, so cutting it at the
        # stage's share would only mean training it again (on a loaded machine, the race's time)
        # the health checks' confirmations (an LR range test, warm-up and decay probes: up to three
        # trainings' time on a small task) only refine a learning-rate finding, and where the search
        # tunes the rate the compute stage measures it anyway and the loop goes on: they run only
        # where an error the search does not tune would stop the loop (a NaN that the range test
        # may show to be the rate's), on a second training
        limit = max(share * 0.55, BASELINE_WHOLE * loop.v.budget_s)
        confirm = "lr" not in searched_params(loop.cfg.space)
        diag = diagnose(loop.task, loop.defaults_record, epochs=epochs, device=loop.dev, seed=loop.cfg.seed,
                        callbacks=[Deadline(limit), capture], store=loop.store, lr_test=confirm, probes=confirm)
        if not confirm and stopping_findings(diag.findings, searched=searched_params(loop.cfg.space)):
            log.info("the defaults' training has an error the search does not tune: trained again with the "
                     "health checks' confirmations (range test, probes)")
            diag = diagnose(loop.task, loop.defaults_record, epochs=epochs, device=loop.dev, seed=loop.cfg.seed,
                            callbacks=[Deadline(limit)], store=loop.store)
        if capture.model is not None:
            with replacing(loop.out / "baseline_model.pt") as tmp:  # a signal leaves no half a file
                torch.save(capture.model.state_dict(), tmp)
        defaults_metric = finite_float(diag.metrics.get(loop.v.metric))
        known = task_param_defaults(loop.task)
        plain = {"optimizer": DEFAULT_OPTIMIZER, "lr": DEFAULT_LR, "weight_decay": 0.0,
                 "batch_size": loop.defaults_record.batch_size or 32,
                 **{k: 0.0 for k in known if "dropout" in k}}
        # as many epochs as the defaults got, so that the spread compares like with like, within
        # what is left of the stage's share (a slow model's no-tricks run is cut, and says so);
        # where the budget holds only a few trainings, a whole one is a share the search and the
        # race need: it is then timed over a couple of epochs only (its metric is not compared)
        trainings = loop.v.budget_s / max(diag.duration_s, 1e-3)
        whole = trainings >= NO_TRICKS_AT_LEAST
        # (timed only: a few steps time an epoch; a whole second of it was an eighth of 8 trainings of 1 s)
        plain_res = fit(loop.task, plain, epochs=max(1, diag.epochs if whole else min(diag.epochs, 2)),
                        max_steps=None if whole else NO_TRICKS_TIMED_STEPS, device=loop.dev, seed=loop.cfg.seed,
                        callbacks=[Deadline(max(1.0 if whole else 0.25, end - time.monotonic()))])
        plain_metric = finite_float(plain_res.metrics.get(loop.v.metric)) if whole else None
        # seconds per epoch of the plain loop (the health checks slow the defaults' run)
        epoch_s = plain_res.duration_s / max(plain_res.steps, 1) * max(
            plain_res.steps / max(plain_res.epochs, 1), measures.steps_per_epoch(loop.task, loop.defaults_record))
        spread = (abs(defaults_metric - plain_metric)
                  if defaults_metric is not None and plain_metric is not None else None)
        return StageResult(BaselineOutputs(
            defaults=TrainedRun(params=dict(loop.defaults), metrics=diag.metrics, epochs=diag.epochs, steps=diag.steps,
                                duration_s=diag.duration_s, run_id=diag.run_id, stop_reason=diag.stop_reason),
            no_tricks=TrainedRun(params=plain, metrics=plain_res.metrics if whole else {}, epochs=plain_res.epochs,
                                 duration_s=plain_res.duration_s,
                                 stop_reason=plain_res.stop_reason if whole else (
                                     f"timed over {plain_res.epochs} epoch(s) only: the budget holds "
                                     f"~{trainings:.0f} trainings of the defaults, too few to spend one here")),
            spread=spread, epoch_s=epoch_s, held_out=loop.holdout, findings=list(diag.findings),
            model="baseline_model.pt" if capture.model is not None else None,
            start_metric=start, curve=list(capture.curve),
        ), before=plain_metric, after=defaults_metric)


@register_stage
class Health(BaseStage):
    name = "health"
    share = 0.04
    record = HealthOutputs

    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        """Stop on an error-severity finding of the baseline's training; profile its step."""
        findings = loop.state.record(BaselineOutputs).findings
        errors = [f for f in findings if f.severity == "error"]
        warnings = [f for f in findings if f.severity == "warning"]
        # an error the search itself tunes (the lr too high or too low, a batch too small for batch
        # norm) is what the loop is for: it goes on, the race judges against the defaults as they are
        stopping = stopping_findings(findings, searched=searched_params(loop.cfg.space))
        searched = [f for f in errors if f not in stopping]
        for f in searched:
            log.warning("the defaults' training: %s (%s); the loop goes on: the search tunes %s, and the defaults "
                        "stay the bar", f.cause, f.summary, tuned(f))
        if stopping and not loop.cfg.ignore_findings:
            lines = [f"the baseline's training has {len(stopping)} error finding(s) the search does not tune; the loop "
                     "stops before any search (pass --ignore-findings to go on anyway):"]
            for f in stopping:
                lines.append(f"  [{f.severity}] {f.cause}: {f.summary}")
                lines.append(f"    evidence: {f.to_dict()['evidence']}")
                lines.append(f"    fix: {f.fix}")
            raise RunFailedError("\n".join(lines))
        step_s = measures.step_s(loop.planner.epoch_s(), loop.task, loop.defaults_record)
        prof = run_profile(loop.task, params=dict(loop.defaults), device=loop.dev, seed=loop.cfg.seed,
                           store=loop.store, steps=measures.profile_steps(share, step_s))
        prof.save(loop.out / "profile.json")
        return StageResult(HealthOutputs(
            errors=errors, warnings=warnings, ignored=bool(stopping), searched=[f.cause for f in searched],
            profile="profile.json",
            step_time_ms=prof.step.time_ms, peak_memory_bytes=prof.memory.peak_bytes,
            params=prof.params.total, macs=prof.macs, throughput=prof.step.throughput,
        ))


@register_stage
class Compute(BaseStage):
    name = "compute"
    share = 0.06
    record = ComputeOutputs

    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        """Batch size, LR (range test, scaled), accumulation, precision, data loading: recommend().
        The range test and the noise scale get the steps the share holds at the step time (none below
        ``COMPUTE_MIN_STEPS``; never more than the defaults of recommend)."""
        prof = Profile.load(loop.out / "profile.json")
        wall_s = measures.step_s(loop.planner.epoch_s(), loop.task, loop.defaults_record)  # as a training pays it
        step_s = max((prof.step.time_ms or 1.0) / 1e3, wall_s)  # where the profile's phases say less
        steps = share / step_s  # training steps the share holds at that step time
        if (too_few := measures.too_few_steps(share, step_s)) is not None:
            return StageResult(ComputeOutputs(steps={"step_ms": step_s * 1e3, "share_steps": steps},
                                              not_measured=too_few), status="skipped")
        lr_steps = int(min(100, max(10, 0.45 * steps)))  # the LR matters most: at least 10 steps
        # the ladder runs only where the sweep saw no fall: ~9 rates, each as long as the share holds
        ladder_steps = int(min(100, 0.45 * steps / 9))
        ladder_steps = ladder_steps if ladder_steps >= 20 else 0  # fewer cannot leave a plateau
        noise_steps = int(min(30, 0.2 * steps / 4))
        noise_steps = noise_steps if noise_steps >= 3 else 0  # too few to estimate: not measured
        optimizer_s = min(4.0, 0.25 * share) if 0.25 * steps >= 20 else 0.0  # each optimizer ~10 steps
        recs = recommend(loop.task, dict(loop.defaults), profile=prof, memory_budget=loop.v.memory_bytes,
                         device=loop.dev, seed=loop.cfg.seed, lr_steps=lr_steps, ladder_steps=ladder_steps,
                         noise_steps=noise_steps, optimizer_budget_s=optimizer_s,
                         embedding_budget_s=min(120.0, 0.3 * share), store=loop.store,
                         precision_check=0.1 * steps >= 160,  # the timed rounds and two short trainings
                         measure_threads=False)  # the baseline's training measured them (a slow model: seconds)
        computed = ComputedValues.from_recommendations(
            recs, own_optimizer=str(loop.defaults.get("optimizer", "adamw")))
        # the computed lr is a hypothesis: a few seconds of it against the defaults' before the
        # search centres on it (a rate read off a loss that only came back to chance trains nothing)
        # never longer than one whole training of the defaults (then the check is two whole ones),
        # nor than a small share of the whole budget (at 8 trainings two of 1 s took a quarter of it)
        check_s = min(short_check_seconds(share), max(0.05, loop.planner.budget_plan().full_s),
                      max(0.05, CHECK_BUDGET_SHARE * loop.v.budget_s))
        base = loop.state.record(BaselineOutputs)  # the defaults' own curve: their side of the check
        lr_check = check_computed_lr(loop.task, loop.defaults_record, computed, metric=loop.v.metric,
                                     maximize=loop.v.maximize, seconds=check_s,
                                     device=loop.dev, seed=loop.cfg.seed, val_samples=loop.holdout.val_samples,
                                     defaults_curve=base.curve, epoch_s=base.epoch_s,
                                     epoch_steps=measures.steps_per_epoch(loop.task, loop.defaults_record))
        if lr_check is not None and not lr_check.used:
            computed = dataclasses.replace(computed, lr=None)
        max_batch = BatchSizeEvidence.of(recs.get("batch_size")).max_batch_size
        return StageResult(ComputeOutputs(
            computed=computed, max_batch_size=max_batch, run_id=recs.run_id, lr_check=lr_check,
            steps={"lr_range_test": lr_steps, "lr_ladder": ladder_steps, "noise_scale": noise_steps,
                   "optimizer_budget_s": optimizer_s, "step_ms": step_s * 1e3, "share_steps": steps},
            recommendations=[{"name": r.name, "value": r.value, "reason": r.reason,
                              "confidence": r.confidence, "effect": r.effect} for r in recs],
        ))


@register_stage
class LayerValue(BaseStage):
    name = "layer_value"
    share = 0.02
    record = LayerValueOutputs

    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        """Each layer's cost (time, params, MACs) beside its measured contribution (mean ablation)."""
        prof = Profile.load(loop.out / "profile.json")
        model = loop.task.build_model(dict(loop.defaults))
        model.load_state_dict(torch.load(loop.out / "baseline_model.pt", weights_only=True))
        base, values, notes = layer_values(
            loop.task, model, metric=loop.v.metric, higher_is_better=loop.v.maximize, profile=prof,
            device=loop.dev, batch_size=loop.defaults_record.batch_size or 32, deadline=end)
        named = [LayerFinding(layer=x.name, finding=x.finding, action=x.action) for x in values if x.finding]
        return StageResult(LayerValueOutputs(metric=base, layers=list(values), findings=named,
                                              keep=list(keep_layers(values)), notes=list(notes)))


@register_stage
class Search(BaseStage):
    name = "search"
    share = 0.42
    record = SearchStageOutputs
    compares = "the defaults -> the best configuration, as the search trials measured them"

    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        """Search what the compute stage could not decide: warm start, TPE, successive halving.

        The search gets every second the stages after it do not need (their reserves: the final
        race at ``--seeds`` seeds, one compression sweep), not only its share."""
        comp = loop.state.record(ComputeOutputs)
        budget_plan = loop.planner.budget_plan()
        plan = build_plan(loop.task, comp.computed, user_space=loop.cfg.space, max_batch=comp.max_batch_size,
                          samples=measures.train_samples(loop.task, loop.defaults_record),
                          roomy=budget_plan.full_trainings >= FULL_TRIALS_FOR_NO_PRUNER)
        compress_min = loop.planner.compress_reserve()
        loop.say("plan", {"text": budget_plan.describe(), "plan": budget_plan.to_dict()})
        epochs = budget_plan.trial_epochs
        epoch_s = loop.planner.epoch_s()
        race_s = budget_plan.race_s if budget_plan.race_fits else 0.0
        # trials at the task's own epochs: the race's first pair is the baseline's and the search's best's
        reuse = epochs >= loop.task.default_epochs and loop.planner.baseline_reusable()
        done = (1 if loop.planner.baseline_reusable() else 0) + (1 if reuse else 0)
        if not budget_plan.race_fits and loop.budget.left_s >= 2.5 * budget_plan.full_s:
            # no full race fits, but the time holds the search's best trained once at the defaults'
            # protocol after the search: the final stage races it against their baseline training
            race_s = 1.1 * budget_plan.full_s * (2 - done)

        def reserve(rows: Sequence[Any]) -> float:
            """The race's seconds as the trials stand: more paired seeds where the defaults and the
            leader spread widely against their gap (a rate too high makes the defaults' seeds differ
            by tens of points), within half the search's own time."""
            if not race_s:
                return compress_min
            d, best, pooled = standing(rows, plan, settings)
            if d is not None and best is not None and (best.mean - d.mean) * (1 if loop.v.maximize else -1) <= \
                    winners_curse(loop.v.metric, loop.holdout.val_samples, d.mean, len(rows)):
                return late_pair + compress_min  # none ahead of the defaults beyond the curse of the draws: no race
            full_s, race_now = budget_plan.full_s, race_s
            if d is None or best is None or d.n < 2:  # the defaults' spread not measured yet: as planned
                return race_now + compress_min
            gain = (best.mean - d.mean) * (1.0 if loop.v.maximize else -1.0)
            if gain <= (d.std or 0.0) / math.sqrt(d.n):  # no gain beyond one standard error of theirs to confirm
                return race_now + compress_min
            seeds = loop.planner.race_seeds_for(d, best, pooled, compared=len(rows))
            need = 1.1 * max(0, 2 * seeds - done) * full_s
            return min(max(race_now, need), race_now + 0.5 * seconds) + compress_min

        # (the budget already excludes what an earlier, killed process spent: the clock resumes)
        # the search runs on while nothing leads the defaults (`reserve` bounds it as trials stand), one pair's
        # time kept for a late leader: a race kept for no leader left a third of 8 trainings unspent
        late_pair = min(race_s, 1.1 * budget_plan.full_s * max(0, 2 - done))
        seconds = max(1.0, loop.budget.left_s - late_pair - compress_min)
        # successive halving only where full trials are dear (below ~15 in the time there is): it
        # favours fast starters, which small or noisy data punishes (measured: benchmarks/optimize.py)
        full_trials = max(1.0, loop.budget.left_s - race_s - compress_min) / (epochs * epoch_s)
        # no rung before the defaults' own curve separated from its start: a rung that cannot rank
        # prunes slow starters by noise (None: it never separated, so nothing is pruned by epoch)
        rank_at = loop.planner.rank_epoch()
        settings = StageSettings(
            objective=loop.v.objective, metric=loop.v.metric, maximize=loop.v.maximize,
            constraints=tuple(loop.cfg.constraints), epochs=epochs, study=loop.study, seed=loop.cfg.seed,
            device=str(loop.dev), max_trials=loop.cfg.max_trials, patience=loop.cfg.patience,
            min_delta=loop.cfg.min_delta, flag_min=loop.cfg.flag_min, defaults=loop.defaults,
            defaults_measured=self._defaults_measured(loop, epochs),
            pruner="asha" if full_trials < FULL_TRIALS_FOR_NO_PRUNER and rank_at is not None else "none",
            first_rung=rank_at or 1,
            # a trial within one validation figure's noise of a rung's cut goes on: the cut cannot rank it
            prune_margin=sampling_std(loop.v.metric, loop.holdout.val_samples, self._defaults_level(loop)) or 0.0,
            trial_s_estimate=epochs * epoch_s,
            alternative=comp.computed.optimizer_alternative,
            # the leading trials' models where the race's first seed is the baseline's (short_finalist)
            on_trial=loop.cfg.on_trial,
            keep_models=str(loop.out / MODELS_DIR) if loop.planner.baseline_reusable() else None)
        spent = float(loop.state.data.get("search_spent_s", 0.0))
        t0 = time.monotonic()

        def on_chunk(finished: int, flags: int) -> None:
            loop.state.data["search_spent_s"] = spent + time.monotonic() - t0
            loop.state.data["spent_s"] = loop.budget.elapsed_s
            loop.state.save()
            loop.say("search_chunk", {"finished": finished, "flags": flags})

        outcome = run_search_stage(loop.task, plan, settings, store=loop.store, seconds=seconds,
                                   on_chunk=on_chunk, must_end=loop.budget.end, reserve=reserve)
        for flag in outcome.flags:
            loop.say("yellow_flag", flag.to_dict())
        best = outcome.best
        counts: dict[str, int] = {}
        for r in outcome.trials:
            counts[r.state] = counts.get(r.state, 0) + 1
        write_text(loop.out / "search_trials.json", json_dumps([trial_json(t) for t in outcome.trials], indent=1))
        return StageResult(SearchStageOutputs(
            study=loop.study, plan=plan.to_dict(), epochs_per_trial=epochs,
            pruner=settings.pruner if epochs >= 3 else "none", full_trials_in_share=full_trials,
            best=best, top=outcome.groups[:5], defaults=outcome.defaults,
            flags=list(outcome.flags), stop_reason=outcome.stop_reason,
            early=outcome.early, arms=outcome.arms, counts=counts,
            trials=len(outcome.trials), search_calls=outcome.search_calls,
            history=[list(h) for h in outcome.history], trials_file="search_trials.json", budget_plan=budget_plan,
            duration_s=outcome.duration_s, seconds=seconds,
            seed_std=pooled_seed_std((g.std, g.n) for g in [*outcome.groups, *filter(None, [outcome.defaults])]),
            # every trial as the report draws it (its arm, state and why it ended)
            trials_log=[TrialLog.of(t) for t in outcome.trials],
            kept=(kept_runs(outcome.trials, out=loop.out, seed=int(loop.cfg.seed), epochs=epochs,
                            metric=loop.v.metric) if loop.planner.baseline_reusable() else []),
        ), before=finite_float(outcome.defaults.mean if outcome.defaults else None),
            after=best.mean if best else None)


    @staticmethod
    def _defaults_level(loop: StageContext) -> float | None:  # the baseline's metric (None: not measured)
        return finite_float(loop.state.record(BaselineOutputs).defaults.metrics.get(loop.v.metric))

    @staticmethod
    def _defaults_measured(loop: StageContext, epochs: int) -> float | None:
        """The baseline's metric of the defaults where the trials run their own epochs (and the
        baseline ran them to the end): the search does not train them again."""
        if epochs < loop.task.default_epochs or not loop.planner.baseline_reusable():
            return None
        return Search._defaults_level(loop)


@register_stage
class Final(BaseStage):
    name = "final"
    share = 0.16
    record = FinalOutputs
    compares = "the defaults -> the result, mean over the paired seeds (validation data)"

    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        """The defaults and the search's best, same seeds, same protocol; keep the defaults unless
        a configuration beats them beyond noise; held-out figures for both."""
        srch = loop.state.record(SearchStageOutputs)
        # every arm trains at the task's own protocol: the defaults as the user runs them, and the
        # search's finalists promoted from the trials' fidelity to it (never a shortened copy)
        epochs = loop.task.default_epochs
        base_epoch_s = loop.planner.epoch_s()
        budget_plan = loop.planner.budget_plan(search_done=True)
        race_notes: list[str] = []
        trial_epochs = int(srch.epochs_per_trial or epochs)
        candidates = proposals = search_proposals(loop, srch, trial_epochs, base_epoch_s)
        # the search's best at the trials' shorter protocol races too: adopted only as a time
        # gain, where it reaches the defaults' metric at their own protocol
        shorter = (dataclasses.replace(proposals[0], name=f"{proposals[0].name} at {trial_epochs} epochs",
                               epochs=trial_epochs) if proposals and trial_epochs < epochs else None)
        if budget_plan.race_fits and budget_plan.seeds <= 2 and proposals:
            # one or two paired seeds re-rank nothing (one seed per trial is how the search ranked
            # them), and every further finalist splits the race's error rate and its time: the
            # search's best alone races the defaults, over the seeds the time holds
            shorter = None
            candidates = proposals[:1]
        hard_end = loop.budget.end - min(loop.planner.compress_reserve(), MIN_COMPRESS_S)
        if not budget_plan.race_fits and proposals:
            # no full race fits: the search's best alone races the defaults, as many paired seeds as
            # the time holds; only a gain far beyond the known seeds' noise replaces them (where no
            # training of it fits, its own at the trials' epochs races: short_finalist)
            shorter = None
            candidates = proposals[:1]
            race_notes.append(budget_plan.describe())
            if (short := short_finalist(loop, proposals[0], trial_epochs, hard_end)) is not None:
                candidates = [short]
                race_notes.append(f"no time for the search's best at {epochs} epochs: its own training at "
                                  f"{trial_epochs} (the baseline's seed) races the defaults, beyond noise and "
                                  f"the best-of-{srch.trials} selection")
        d_group = srch.defaults
        defaults = Arm(name="defaults", params=dict(loop.defaults), source="the task's defaults",
                       search_mean=d_group.mean if d_group is not None and trial_epochs == epochs else None,
                       search_std=d_group.std if d_group is not None else None,
                       search_n=d_group.n if d_group is not None else 0, epoch_s=base_epoch_s, epochs=epochs,
                       train=loop.defaults_record)
        plan = FinalPlan(metric=loop.v.metric, maximize=loop.v.maximize, epochs=epochs,
                         seeds=(budget_plan.seeds if budget_plan.race_fits
                                else max(int(loop.cfg.seeds), budget_plan.seeds)),
                         seed=loop.cfg.seed, device=str(loop.dev),
                         val_samples=loop.holdout.val_samples,
                         prior_std=prior_seed_std(srch.seed_std, metric=loop.v.metric,
                                                  val_samples=loop.holdout.val_samples,
                                                  level=finite_float(d_group.mean if d_group else None)),
                         protocol=f"the task's own protocol ({epochs} epochs) for every arm",
                         resplit=races_on_resplits(loop.task, loop.holdout.val_samples, race_notes),
                         compared=srch.trials)
        first = baseline_first(loop)

        def race(arms: list[Arm], short_arm: Arm | None) -> FinalOutcome:
            return run_final(loop.task, defaults, arms, plan, store=loop.store,
                             end=loop.budget.end - loop.planner.compress_reserve(), hard_end=hard_end,
                             cap_end=loop.budget.end, folder=loop.out, say=loop.say, notes=race_notes,
                             shorter=short_arm, first=first,
                             first_more=search_first(loop, arms[0], seed=first[0].seed) if arms and first else None,
                             defaults_more=defaults_outside_race(d_group, trial_epochs == epochs),
                             search_lead=lead_in_search(proposals[0].search_mean if proposals else None,
                                                        d_group.mean if d_group is not None else None,
                                                        loop.v.maximize))
        outcome = race(candidates, shorter)
        if (short := cut_short(loop, outcome, candidates[0] if candidates else None, trial_epochs)) is not None:
            race_notes.append(f"every run of {candidates[0].name} at {epochs} epochs was cut by the clock: its own "
                              f"training at {trial_epochs} (the baseline's seed) races the defaults in its place")
            outcome = race([short], None)
        shutil.rmtree(loop.out / MODELS_DIR, ignore_errors=True)  # the race copied what it took
        chosen = outcome.arm(outcome.chosen)
        params, evidence = self._evidence(loop, chosen, outcome)
        model = loop.task.build_model(dict(params))
        model.load_state_dict(torch.load(loop.out / "model.pt", weights_only=True))
        latency, size = measures.model_latency_ms(loop.task, model, loop.dev), size_bytes(loop.out / "model.pt")
        val, test = chosen.summary("val"), chosen.summary("test")
        picked = outcome.model_run()
        return StageResult(FinalOutputs(
            params=params, evidence=evidence, epochs=chosen.epochs or epochs,
            default_epochs=loop.task.default_epochs, race=outcome,
            # the search's best not adopted where no full race could judge them: proposals
            proposals=([a.params for a in proposals] if not budget_plan.race_fits and outcome.decision == "defaults"
                       else [] if candidates else [a.params for a in proposals]),
            decision=outcome.decision, chosen=outcome.chosen,
            metric=dataclasses.replace(val, values=[r.val for r in chosen.runs]),
            # no run of it judged on data nothing selected on: the estimate corrected for the winner's curse
            test=dataclasses.replace(test, values=[r.test for r in chosen.runs],
                                     mean=outcome.estimate.chosen if outcome.estimate is not None else test.mean),
            model="model.pt", model_seed=outcome.model_seed, latency_ms=latency, latency_device=str(loop.dev),
            size_bytes=size,
            model_val=picked.val if picked else None, model_test=picked.test if picked else None,
            load=(f"model = proftune.load_task({loop.spec!r}).build_model(params); "
                  "model.load_state_dict(torch.load('model.pt', weights_only=True))"),
        ), before=finite_float(outcome.arm("defaults").summary("val").mean), after=val.mean)

    def _evidence(self, loop: StageContext, chosen: Arm,
                  outcome: FinalOutcome) -> tuple[dict[str, object], dict[str, str]]:
        """The result's params, and for each where its value came from."""
        computed = loop.state.record(ComputeOutputs).computed
        comp, alt = computed.params(), computed.optimizer_alternative
        params = dict(chosen.params)
        evidence: dict[str, str] = {}
        why = (outcome.comparison.describe() if outcome.comparison is not None
               else "no configuration reached the final race")
        for k, val in params.items():
            default = loop.defaults.get(k)
            if outcome.kept_defaults:
                evidence[k] = f"task default (kept: {why})"
            elif k in comp and measures.same_value(comp[k], val):
                evidence[k] = "computed (compute stage: recommend)"
            elif k == "optimizer" and alt is not None and val == alt.optimizer:
                evidence[k] = (f"computed (the optimizer row measured {val} better than "
                               f"{loop.defaults.get('optimizer', 'adamw')} at equal time; the race confirmed it)")
            elif k in loop.defaults and measures.same_value(default, val):
                evidence[k] = "task default"
            else:
                std = f" +- {chosen.search_std:.4g}" if chosen.search_std is not None else ""
                mean = f"{chosen.search_mean:.4g}" if chosen.search_mean is not None else "-"
                evidence[k] = (f"searched (study {loop.study}, {chosen.source}: {loop.v.metric} {mean}{std} "
                               f"over {chosen.search_n} trial(s); final: {why})")
        return params, evidence


@register_stage
class Compress(BaseStage):
    name = "compress"
    share = 0.2
    record = CompressOutputs
    compares = "the uncompressed result -> the compressed model"

    def skipped(self, loop: StageContext) -> bool:
        return loop.cfg.goal == "none"

    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        """The final model toward ``--goal`` within ``--max-accuracy-drop`` (proftune.compress)."""
        if loop.cfg.goal == "none":
            return StageResult(CompressOutputs(skipped="--goal none"), status="skipped")
        params = dict(loop.state.record(FinalOutputs).params)
        model = loop.task.build_model(dict(params))
        model.load_state_dict(torch.load(loop.out / "model.pt", weights_only=True))
        names = {n for n, _ in model.named_modules()}
        keep = [n for n in loop.state.record(LayerValueOutputs).keep if n in names]
        if share < MIN_COMPRESS_S:
            return StageResult(CompressOutputs(skipped=f"{share:.1f} s left for compression, below the "
                                                        f"{MIN_COMPRESS_S:.0f} s one pruning + INT8 sweep needs "
                                                        "here; give a larger --budget"), status="skipped")
        # the sweep grows with the time there is: per-layer sensitivity and a second ratio
        # only when the share holds them (measured: ~45 s for one ratio with sensitivity on 2 cores)
        roomy = share >= 90
        ratios = (0.3, 0.5) if roomy else (0.5,)
        out_file = loop.out / "model_compressed.pt"
        try:
            report = run_compress(
                loop.task, params=params, model=model, store=loop.store,
                callbacks=[Deadline(max(1.0, (end - time.monotonic()) / (2 * len(ratios))))],
                ratios=ratios, ignore_layers=tuple(keep), max_accuracy_drop=loop.cfg.max_accuracy_drop,
                metric=loop.v.metric, goal=loop.cfg.goal, out=str(out_file), force=True,
                finetune_epochs=1, seed=loop.cfg.seed, device=str(loop.dev), sensitivity=roomy,
                # building stops at 60% of the share: measuring, saving and the held-out check follow
                time_limit_s=max(1.0, 0.6 * (end - time.monotonic())),
                latency_rounds=5 if roomy else 3, layer_times=roomy)
        except (ConfigError, RunFailedError, RuntimeError, TypeError, ValueError, AttributeError) as exc:
            # a model these methods cannot cut or convert keeps the uncompressed result, which
            # the stages before already hold; the run goes on to its outputs
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            log.info("compression failed: %s", why)
            out_file.unlink(missing_ok=True)
            return StageResult(CompressOutputs(skipped=f"compression failed ({why})",
                                                verdict=f"kept the uncompressed model: compression failed ({why})"),
                                status="skipped")
        chosen_c = report.selected
        test_metric = None
        if chosen_c is not None and report.output:
            try:
                small = load_model(report.output, task=loop.task, params=params)
                if loop.task.test_data(1) is not None:  # else no data nothing selected on
                    bs = int(cast(int, params.get("batch_size", 32)))  # validated in the race
                    test_metric = finite_float(evaluate_model(loop.task, small, torch.device("cpu"), bs, split="test")
                                               .get(loop.v.metric))
            except (ConfigError, RuntimeError, TypeError, ValueError) as exc:
                log.info("the compressed model could not be evaluated on the held-out data: %s", exc)
        elif out_file.exists():
            out_file.unlink()  # a file from an earlier sweep is not this run's result
        base = measures.figures_of(report.baseline, method=False)
        sel = measures.figures_of(chosen_c, test_metric=test_metric, format=True) if chosen_c is not None else None
        goal_key = "latency_ms" if loop.cfg.goal == "latency" else "size_bytes"
        kept = "kept the uncompressed model: "
        notes = [n[len(kept):] if n.startswith(kept) else n for n in report.notes or ["no candidate qualified"]]
        verdict = (f"{kept}{'; '.join(notes)}"
                   if sel is None else
                   f"{method_name(sel)} beats the uncompressed model on {loop.cfg.goal}: "
                   + (f"{format_ms(sel.latency_ms)} vs {format_ms(base.latency_ms)} at batch 1"
                      if goal_key == "latency_ms" else
                      f"{format_bytes(sel.size_bytes)} vs {format_bytes(base.size_bytes)}"))
        return StageResult(CompressOutputs(
            run_id=report.run_id, plan=list(report.plan), notes=list(report.notes), verdict=verdict,
            ignored_layers=keep, ratios=list(ratios), baseline=base, selected=sel,
            candidates=[measures.figures_of(c, within_budget=True) for c in report.candidates],
            output="model_compressed.pt" if sel is not None and report.output else None, load=report.load_line,
        ), before=finite_float(base.metric), after=finite_float(sel.metric) if sel is not None else None)
