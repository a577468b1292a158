"""The final stage: the defaults and the search's best configurations, trained under the search's
protocol with the same seeds (paired), judged on validation data, reported on held-out data.

The defaults are the bar: a configuration replaces them only when it is better beyond the
seeds' noise (:func:`~proftune.optimize._decide.compare_paired`); otherwise the result is the
defaults, and the outcome says so with the numbers.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from .._api import run_train
from .._holdout import RESPLIT_BELOW
from .._jsonsafe import finite_float
from .._paths import replacing
from ..task import Task
from ..track import Store
from ..train import TrainParams, evaluate_model
from ._budget import Deadline
from ._budget_plan import MAX_ROUNDS, RUN_OVERHEAD_S
from ._decide import (
    ALPHA,
    Comparison,
    ahead_within_noise,
    compare_paired,
    compare_race,
    metric_resolution,
    sampling_std,
)
from ._final_records import (
    SCHEMA_VERSION,
    Arm,
    ArmRun,
    FinalOutcome,
    FinalPlan,
    HeldOutEstimate,
    SearchGap,
    SeedSummary,
)
from ._search_lead import lead_of, lead_verdict

__all__ = ["RESPLIT_BELOW", "SCHEMA_VERSION", "Arm", "ArmRun", "FinalOutcome", "FinalPlan", "HeldOutEstimate",
           "SearchGap", "SeedSummary", "held_out_estimate", "metric_resolution", "races_on_resplits",
           "representative", "run_final", "sampling_std"]

#: At most this many of the search's configurations race the defaults in the final stage (fewer
#: when the time left does not hold ``--seeds`` runs of each): one seed per search trial makes
#: its ranking noisy, so the race re-ranks the best few on paired seeds.
MAX_CANDIDATES = 4


def _epochs(arm: Arm, plan: FinalPlan) -> int:
    return int(arm.epochs or plan.epochs)


def _train(task: Task, arm: Arm, *, plan: FinalPlan, seed: int, limit_s: float, store: Store,
           folder: Path) -> ArmRun:
    deadline = Deadline(limit_s)
    epochs = _epochs(arm, plan)
    params = arm.train if arm.train is not None else TrainParams.of(task, arm.params)  # validated once
    rep = run_train(task, params, epochs=epochs, device=plan.device, seed=seed,
                    callbacks=[deadline], store=store)
    res = rep.result
    assert res is not None  # run_train's record keeps what fit returned
    model = res.model
    test_metrics: dict[str, float] = {}
    if task.test_data(1) is not None:
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
        test_metrics = evaluate_model(task, model, dev, int(res.params.get("batch_size", 32)), split="test")
    with replacing(folder / f"{_slug(arm.name)}-{seed}.pt") as tmp:
        torch.save(model.cpu().state_dict(), tmp)
    cut = deadline.hit and res.epochs < epochs

    def value(metrics: dict[str, float]) -> float | None:
        return finite_float(metrics.get(plan.metric))

    return ArmRun(seed=seed, run_id=rep.run_id, val=value(res.metrics), test=value(test_metrics),
                  epochs=res.epochs, duration_s=res.duration_s, cut=cut,
                  val_metrics=dict(res.metrics), test_metrics=test_metrics)


def _limit(arm: Arm, plan: FinalPlan, *, until: float, stop_at: float, left: int) -> float:
    """Seconds one run may take: up to 3x its estimate or its part of the time to ``until``
    (``left`` runs share it), never past ``stop_at``."""
    now = time.monotonic()
    return min(max(3.0 * _epochs(arm, plan) * max(arm.epoch_s, 1e-3) + 2.0, (until - now) / max(1, left)),
               max(1.0, stop_at - now))


def _overrun(arm: Arm, plan: FinalPlan, cap: float) -> list[str]:
    """The note of a reference training that ran past the budget's end (``cap``), if it did."""
    over = time.monotonic() - cap
    if over <= 0.5:
        return []
    return [f"the defaults' own training ({_epochs(arm, plan)} epochs) ran {over:.0f} s past the budget's end: "
            "a model stopped before their own epochs would be less than the user had"]


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


def _with_run(arm: Arm, run: ArmRun) -> Arm:
    return replace(arm, runs=(*arm.runs, run))


def representative(runs: Sequence[ArmRun], *, sampling_std: float | None = None,
                   maximize: bool = True) -> tuple[ArmRun | None, str]:
    """The run handed back for the decision, and how it was chosen (a note; empty for one run).

    The decision is the arm (its mean over the paired seeds); the model handed back is its seed best
    on validation. A seed's validation figure is its model's quality plus the validation set's draw:
    the best is expected above the median on any data by its gain shrunk toward the mean, never
    below it, so it is the better model to hand back, and its own figure is not the arm's (the
    winner's curse is in the figure, not in the choice). Measured on the headroom tasks (30 seeds
    of one configuration each, ``benchmarks/seed_pick.py``): validation and test correlate 0.34-0.87
    across seeds, and the best of 10 on validation was 0.000 to 0.041 above the median of 10 on
    test, never below.
    The note gives the expected figure: the best's gain over the mean shrunk by the share of the
    seeds' variance beyond one validation figure's ``sampling_std`` (a ratio metric's binomial
    noise; unknown for a loss or a custom metric: the note says its figure is optimistic).
    Ties: the lower seed."""
    ran = [r for r in runs if r.val is not None and not r.cut] or [r for r in runs if not r.cut] or list(runs)
    if not ran:
        return None, ""
    vals = [r.val for r in ran if r.val is not None]
    if not vals:
        return min(ran, key=lambda r: r.seed), ""
    sign = 1.0 if maximize else -1.0
    best = max(ran, key=lambda r: (sign * r.val if r.val is not None else -math.inf, -r.seed))
    if len(vals) < 2:
        return best, ""
    assert best.val is not None
    mean = statistics.fmean(vals)
    head = f"the best of its {len(vals)} seeds on validation ({best.val:.4g}; their mean {mean:.4g})"
    if sampling_std is None or sampling_std <= 0 or len(vals) < 3:
        return best, (f"{head}: a seed's validation figure predicts its held-out one in part, so the best is "
                      "expected at least as good as the median on new data; its own figure is optimistic, "
                      "the mean is the decision's")
    spread = statistics.stdev(vals)
    share = max(0.0, 1.0 - sampling_std ** 2 / spread ** 2) if spread > 0 else 0.0
    expected = mean + share * (best.val - mean)
    return best, (f"{head}: they spread by {spread:.3g} against one validation figure's sampling noise "
                  f"({sampling_std:.3g}), so about {share:.0%} of their variance is the models' own and the "
                  f"best is expected at {expected:.4g} on new data (its figure shrunk toward the mean); "
                  "its held-out figure is its own")


def _unselected(arm: Arm, race: _Race, plan: FinalPlan, seeds: Sequence[int]) -> list[float | None]:
    """``arm``'s validation figures over ``seeds`` for the decision: where its first run is the
    search's own training of it (the best of ``plan.compared`` draws on the same validation data),
    that figure less the expected maximum of their sampling error, sqrt(2 ln compared) times one
    figure's noise (the winner's curse; unknown noise: the seeds' known spread)."""
    values = arm.values("val", seeds)
    first = race.first_seed
    if race.selected != arm.name or first is None or first not in seeds or plan.compared < 2:
        return values
    i = list(seeds).index(first)
    value = values[i]
    noise = sampling_std(plan.metric, plan.val_samples, race.arms[0].summary("val").mean) or plan.prior_std
    if value is None or noise is None:
        return values
    sign = 1.0 if plan.maximize else -1.0
    values[i] = value - sign * noise * math.sqrt(2.0 * math.log(plan.compared))
    return values


def held_out_estimate(chosen: Arm, defaults: Arm, plan: FinalPlan, *, seeds: Sequence[int],
                      compared: int) -> HeldOutEstimate:
    """The result's figure on new data where no run of it has a held-out one (see
    :class:`HeldOutEstimate`): the paired gain over ``seeds`` on validation, less the expected
    maximum of the sampling error of ``compared`` configurations on the validation samples; a gain
    is never turned into a loss (the curse can explain all of a gain, not make it negative)."""
    d_val = defaults.summary("val").mean
    sign = 1.0 if plan.maximize else -1.0
    pairs = [(c, d) for c, d in zip(chosen.values("val", seeds), defaults.values("val", seeds), strict=True)
             if c is not None and d is not None]
    if chosen.name == defaults.name:
        gain_val: float | None = 0.0
    elif pairs:
        gain_val = sign * statistics.fmean(c - d for c, d in pairs)
    else:
        c_val = chosen.summary("val").mean
        gain_val = sign * (c_val - d_val) if c_val is not None and d_val is not None else None
    k = max(1, int(compared))
    s = sampling_std(plan.metric, plan.val_samples, d_val)
    bias = None if s is None or gain_val is None else (0.0 if chosen.name == defaults.name
                                                       else s * math.sqrt(2.0 * math.log(k)))
    gain = None
    if gain_val is not None and bias is not None:
        gain = max(min(gain_val, 0.0), gain_val - bias)
    return HeldOutEstimate(defaults=d_val, chosen=d_val + sign * gain if d_val is not None and gain is not None
                           else None, gain_val=gain_val, gain=gain, bias=bias, compared=k, sampling_std=s,
                           val_samples=plan.val_samples)


def _decision(comparison: Comparison, leader: Arm, defaults: Arm, seeds: Sequence[int], plan: FinalPlan, *,
              search_lead: float | None, own_seed: int | None = None,
              only_selected: bool = False) -> tuple[str, Arm, Comparison]:
    """``("chosen", leader, comparison)`` where the leader replaces the defaults (beyond noise;
    ahead within one figure's noise; or its lead in the search beyond that noise, the race's other
    runs not putting it behind: the comparison's reason says which), else ``("defaults", defaults,
    comparison)``.

    ``only_selected``: the leader's one run is the search's best draw (``own_seed``), which says no
    more than the selection did: the race's bound is not a second measurement of it."""
    level = defaults.summary("val").mean
    margin = sampling_std(plan.metric, plan.val_samples, level)
    if comparison.beyond_noise:
        return "chosen", leader, comparison
    if not only_selected and ahead_within_noise(comparison, margin=margin):
        assert margin is not None
        assert comparison.lower is not None
        return "chosen", leader, replace(
            comparison, extra={**comparison.extra, "margin": margin},
            reason=f"{comparison.reason}; ahead, and the bound {comparison.lower:+.4g} is above "
                   f"-{margin:.3g}, one validation figure's sampling noise: not behind beyond it")
    held, why_not = lead_verdict(leader, defaults, seeds, plan, search_lead, margin, own_seed=own_seed)
    if held is not None:
        assert margin is not None
        assert search_lead is not None
        return "chosen", leader, replace(
            comparison, extra={**comparison.extra, "margin": margin, "search_lead": search_lead},
            reason=f"{comparison.reason}; its lead in the search, {search_lead:+.4g}, is beyond one validation "
                   f"figure's sampling noise ({margin:.3g}) and the race's other runs do not put it behind "
                   f"beyond that noise ({held:+.4g}): adopted as a plain loop adopts its best")
    if why_not:
        comparison = replace(comparison, reason=f"{comparison.reason}; {why_not}")
    return "defaults", defaults, comparison


def races_on_resplits(task: Task, val_samples: int | None, notes: list[str]) -> bool:
    """Whether the race's rounds train and judge on partitions of their own: where validation
    is small and the task offers them (its two sets of one kind); says so in ``notes``."""
    if val_samples is None or val_samples >= RESPLIT_BELOW or task.resplit(1) is None:
        return False
    notes.append(f"validation has {val_samples} samples, so each round of the race trains and judges on its own "
                 "partition of the training and validation samples (the task's resplit; round 1 on its own split): "
                 "the decision rests on more of the data than the one split the search chose on")
    return True


def _keep_model(chosen: Arm, plan: FinalPlan, *, work: Path, folder: Path, notes: list[str]) -> int | None:
    """Copy the chosen arm's :func:`representative` run to ``folder/model.pt``; its seed (None: no
    run). Says which in ``notes`` where there was a choice."""
    vals = [r.val for r in chosen.runs if r.val is not None and not r.cut]
    level = statistics.fmean(vals) if vals else None
    run, how = representative(chosen.runs, sampling_std=sampling_std(plan.metric, plan.val_samples, level),
                              maximize=plan.maximize)
    if run is None:
        return None
    if how:
        notes.append(f"the model handed back is seed {run.seed} of {chosen.name}: {how}")
    with replacing(folder / "model.pt") as tmp:  # a signal mid-copy leaves no half a model.pt
        shutil.copyfile(work / f"{_slug(chosen.name)}-{run.seed}.pt", tmp)
    return run.seed


def _drop_unpaired(arms: list[Arm], names: Sequence[str], seeds: list[int], notes: list[str]) -> bool:
    """Drop the last round (its seed and every arm's run at it) where a run of the arms ``names``
    was cut; says so in ``notes``. Whether it dropped it."""
    seed = seeds[-1]
    if not any(r.cut for a in arms if a.name in names for r in a.runs if r.seed == seed):
        return False
    seeds.pop()
    for i, a in enumerate(arms):
        arms[i] = replace(a, runs=tuple(r for r in a.runs if r.seed != seed))
    notes.append(f"the extra round at seed {seed} was dropped: a run of it was cut by the time left")
    return True


def _weakest(challengers: Sequence[Arm], seeds: Sequence[int], maximize: bool) -> str:
    """The challenger with the worst validation mean so far (the last one before any run)."""
    sign = 1.0 if maximize else -1.0

    def score(a: Arm) -> float:
        vals = [v for v in a.values("val", seeds) if v is not None]
        return sign * statistics.fmean(vals) if vals else -math.inf

    if not seeds:
        return challengers[-1].name
    return min(reversed(challengers), key=score).name


def _leader(arms: Sequence[Arm], seeds: Sequence[int], maximize: bool) -> Arm | None:
    sign = 1.0 if maximize else -1.0
    scored = []
    for a in arms[1:]:
        vals = [v for v in a.values("val", seeds) if v is not None]
        if vals:
            scored.append((sign * statistics.fmean(vals), a))
    return max(scored, key=lambda t: t[0])[1] if scored else None


def _shorter_reaches(short: Arm, defaults: Arm, plan: FinalPlan, seeds: Sequence[int], *, resolution: float,
                     raced: int, notes: list[str]) -> Comparison | None:
    """The paired comparison where the search's leader at its shorter protocol reaches the defaults'
    metric at theirs (the lower bound within one validation sample, over two seeds or more), else
    None; says which in ``notes``."""
    same = compare_paired(short.values("val", seeds), defaults.values("val", seeds), seeds=seeds,
                          metric=plan.metric, maximize=plan.maximize, split="val",
                          resolution=resolution, alpha=ALPHA / max(1, raced + 1))
    d_epochs, s_epochs = _epochs(defaults, plan), _epochs(short, plan)
    if same.lower is not None and len(same.seeds) >= 2 and same.lower >= -max(resolution, 1e-12):
        notes.append(f"{short.name} at {s_epochs} of {d_epochs} epochs reached the defaults' {plan.metric} "
                     f"(the lower bound of its paired difference {same.lower:+.4g} is within one validation "
                     f"sample, {resolution:.4g}): the same {plan.metric} in {s_epochs / d_epochs:.0%} of the "
                     "training time")
        return same
    notes.append(f"{short.name} at {s_epochs} of {d_epochs} epochs did not reach the defaults' "
                 f"{plan.metric} at their own protocol ({same.describe()}): not adopted")
    return None


class _Race:
    """The race's arms and their runs, the seeds so far, and what one round of them costs."""

    def __init__(self, task: Task, plan: FinalPlan, *, store: Store, folder: Path, arms: list[Arm],
                 cap: float, say: Callable[[str, dict[str, object]], None] | None, notes: Sequence[str],
                 first: tuple[ArmRun, Path] | None, first_more: tuple[ArmRun, Path] | None = None) -> None:
        self.task, self.plan, self.store, self.cap, self.say = task, plan, store, cap, say
        self.arms, self.notes = arms, list(notes)
        self.seeds: list[int] = []
        self.work = folder / "final"
        self.work.mkdir(parents=True, exist_ok=True)
        self.measured: dict[str, float] = {}  # seconds per run of each arm, as they ran
        self.first_seed: int | None = None
        #: The arm whose first run is the search's training of it: the best of the search's draws
        self.selected: str | None = None
        # a task without test_data: a round on another partition than the one the search selected
        # on (round 0, the task's own) gives the held-out figures (its validation figure)
        self.partitions_hold_out = plan.resplit and task.test_data(1) is None
        if first is not None:
            run, model = first
            shutil.copyfile(model, self.work / f"{_slug(arms[0].name)}-{run.seed}.pt")
            self.arms[0] = _with_run(self.arms[0], run)
            self.measured[arms[0].name] = run.duration_s + RUN_OVERHEAD_S
            self.first_seed = run.seed
            if first_more is not None and first_more[0].seed == run.seed and len(arms) > 1:
                run, model = first_more
                shutil.copyfile(model, self.work / f"{_slug(arms[1].name)}-{run.seed}.pt")
                self.arms[1] = _with_run(self.arms[1], run)
                self.measured[arms[1].name] = run.duration_s + RUN_OVERHEAD_S
                self.selected = arms[1].name

    def _held_out(self, run: ArmRun, r: int) -> ArmRun:
        """``run`` of round ``r`` with its held-out figure: its validation figure on partition
        ``r`` where the partitions give them (not round 0: the search's own split)."""
        if not self.partitions_hold_out or r == 0 or run.test is not None:
            return run
        return replace(run, test=run.val, test_metrics=dict(run.val_metrics))

    def current(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def cost(self, names: Sequence[str]) -> float:
        """Seconds one run of each arm ``names`` takes (as measured, else as estimated)."""
        return sum(self.measured.get(n, _epochs(self.current(n), self.plan) * max(self.current(n).epoch_s, 1e-3)
                                     + RUN_OVERHEAD_S) for n in names)

    def need(self, names: Sequence[str], r: int) -> float:
        """Seconds of the rounds ``r`` on of the arms ``names`` (a first-seed run made before the
        race, the baseline's or the search's, is done)."""
        done = (self.cost([n for n in names if any(run.seed == self.first_seed for run in self.current(n).runs)])
                if self.first_seed is not None and r == 0 else 0.0)
        return self.cost(names) * (self.plan.seeds - r) - done

    def solo(self, name: str, *, index: int, stop_at: float) -> ArmRun:
        """One more training of the arm ``name`` outside the paired rounds (its seed and partition
        after every round's), cut at ``stop_at``: a run for the unpaired rank test only."""
        r = MAX_ROUNDS + index
        task = (self.task.resplit(r) if self.plan.resplit else None) or self.task
        arm = self.current(name)
        idx = self.arms.index(arm)
        t0 = time.monotonic()
        run = _train(task, arm, plan=self.plan, seed=self.plan.seed + 100 + r,
                     limit_s=max(0.5, stop_at - time.monotonic()), store=self.store, folder=self.work)
        run = self._held_out(run, r)
        self.measured[name] = time.monotonic() - t0
        self.arms[idx] = _with_run(arm, run)
        if self.say is not None:
            self.say("final_run", {"arm": name, "seed": run.seed, "val": run.val, "test": run.test})
        return run

    def round(self, names: Sequence[str], *, until: float, stop_at: float) -> None:
        """One more seed for the arms ``names``: each run may take up to 3x its estimate or its part
        of the time to ``until``, and never goes on past ``stop_at``; an arm with its run at the
        seed already (the baseline's) is not trained again."""
        r = len(self.seeds)
        seed = self.first_seed if self.first_seed is not None and r == 0 else self.plan.seed + 100 + r
        self.seeds.append(seed)
        group = [n for n in names if not any(run.seed == seed for run in self.current(n).runs)]
        task = (self.task.resplit(r) if self.plan.resplit else None) or self.task
        for i, name in enumerate(group):
            arm = self.current(name)
            idx = self.arms.index(arm)
            # the defaults' first whole training is the reference and the result when nothing
            # beats it: it is never cut (a model stopped before their own epochs would be less
            # than the user had), even where it runs past the budget's end (said so)
            reference = idx == 0 and not any(not run.cut for run in self.arms[0].runs)
            limit = math.inf if reference else _limit(arm, self.plan, until=until, stop_at=stop_at,
                                                      left=len(group) - i)
            t0 = time.monotonic()
            run = _train(task, arm, plan=self.plan, seed=seed, limit_s=limit, store=self.store,
                         folder=self.work)
            run = self._held_out(run, r)
            self.measured[name] = time.monotonic() - t0
            self.arms[idx] = _with_run(arm, run)
            self.notes.extend(_overrun(arm, self.plan, self.cap) if reference else [])
            if self.say is not None:
                self.say("final_run", {"arm": name, "seed": seed, "val": run.val, "test": run.test})


def run_final(task: Task, defaults: Arm, candidates: Sequence[Arm], plan: FinalPlan, *,
              store: Store, end: float, hard_end: float | None = None, cap_end: float | None = None,
              folder: Path, say: Callable[[str, dict[str, object]], None] | None = None,
              notes: Sequence[str] = (), shorter: Arm | None = None,
              first: tuple[ArmRun, Path] | None = None, first_more: tuple[ArmRun, Path] | None = None,
              defaults_more: Sequence[float] = (), search_lead: float | None = None) -> FinalOutcome:
    """Race ``defaults`` and ``candidates`` with paired seeds; the chosen model's state dict is
    left at ``folder / "model.pt"``.

    ``plan.seeds`` rounds run while ``hard_end`` holds them (the comparison needs them; what
    comes after gets less); more rounds of the leader and the defaults only until ``end``;
    no run goes on past ``cap_end`` (the budget's own end: a run slower than measured is cut
    there, not let run over the user's budget), except the defaults' first training: it is the
    reference and the result when nothing beats it, so it runs its own epochs (said so when it
    ends past ``cap_end``). All ``time.monotonic()``. ``notes``: said
    before the race's own.

    ``shorter``: the leader of the search at the search's shorter protocol (fewer epochs). It
    races beside the others but is never the leader; where no configuration beats the defaults,
    it is the result only when it reaches their metric: the one-sided lower bound of its paired
    difference at least minus the metric's resolution (one validation sample), over two seeds
    or more. Then the result is the same metric in less training time, and says so.

    ``first``: a run of the defaults at their own protocol made before the race (the baseline's,
    not cut) and its state dict's file: it is the defaults' run at the first seed (``run.seed``),
    which the other arms are trained at, and the defaults are not trained again for it.

    ``first_more``: the search's own training of the first candidate at ``first``'s seed and the
    protocol, and its state dict's file: that candidate's run at the first seed (not trained again;
    the best of the search's draws, so its first pair is inflated by the selection: the decision's
    bound against the seeds' known noise guards it, and later rounds dilute it).

    ``defaults_more``: the defaults' metric on validation from their trainings at this protocol
    outside the race (the search's evaluations of them): the rank test of the decision
    (:func:`~proftune.optimize._decide.compare_race`) counts them beside the race's runs.

    ``search_lead``: how far the first candidate led the defaults in the search, on the same
    validation data (in the better direction; another leader's lead is moved by its search mean).
    Where the race leaves the leader within noise, it is still the result when that lead is beyond
    one validation figure's sampling noise and the race's other runs of the two do not put it
    behind beyond that noise (:func:`search_lead_holds`): a plain loop adopts its best on validation.
    """
    hard_end = max(end, hard_end if hard_end is not None else end)
    race = _Race(task, plan, store=store, folder=folder, say=say, notes=notes,
                 cap=max(hard_end, cap_end if cap_end is not None else math.inf),
                 arms=[defaults, *list(candidates)[:MAX_CANDIDATES], *([shorter] if shorter is not None else [])],
                 first=first, first_more=first_more)
    arms, seeds, notes = race.arms, race.seeds, race.notes
    short_name = shorter.name if shorter is not None else None
    # ``--seeds`` rounds; while the rounds left do not fit the time, the weakest challenger so far
    # leaves the race (successive elimination; the comparison still counts every one that ran)
    active = [a.name for a in arms]
    raced = 0
    for r in range(plan.seeds):
        while len(active) > 2 and time.monotonic() + race.need(active, r) > hard_end:
            weakest = _weakest([race.current(n) for n in active[1:]], seeds, plan.maximize)
            active.remove(weakest)
            notes.append(f"{weakest} left the race after {r} seed(s): the time left would not hold "
                         f"{plan.seeds - r} more round(s) of every configuration")
        if r > 0 and time.monotonic() + race.cost(active) > hard_end:
            notes.append(f"stopped after {r} seed(s) of {plan.seeds}: the time left would not hold another round")
            break
        race.round(active, until=hard_end, stop_at=race.cap)
        raced = max(raced, len(active) - 1)
    leader = _leader([arms[0], *(a for a in arms[1:] if a.name in active and a.name != short_name)],
                     seeds, plan.maximize)
    # time left: more paired seeds of the leader and the defaults, for a sharper comparison; a
    # round starts only with half its measured time to spare and its runs stop at ``end`` (what
    # comes after, compression, keeps its time: one round that ran long under load took it)
    while (leader is not None and len(seeds) < MAX_ROUNDS
           and time.monotonic() + race.cost([arms[0].name, leader.name]) * 1.5 < end):
        race.round([arms[0].name, leader.name], until=end, stop_at=end)
        leader = race.current(leader.name)
        # an extra round counts only paired: a run cut by the clock leaves the other unpaired,
        # and the two summaries would then be over different seeds
        if _drop_unpaired(arms, [arms[0].name, leader.name], seeds, notes):
            leader = race.current(leader.name)
            break
    # time left where the defaults train cheaply beside the leader (a batch too large for the
    # data: 0.03 s against 0.5 s): more trainings of the defaults alone, unpaired, for the rank
    # test of the decision; added by the time there is, never by how the comparison stands
    solo: list[float] = []
    while (leader is not None and len(seeds) + len(solo) < MAX_ROUNDS
           and race.cost([arms[0].name]) * 3.0 < race.cost([leader.name])
           and time.monotonic() + race.cost([arms[0].name]) * 1.5 < end):
        run = race.solo(arms[0].name, index=len(solo), stop_at=end)
        if run.cut or run.val is None:
            break
        solo.append(run.val)
    if solo:
        lead_s = race.cost([leader.name]) if leader else 0.0
        notes.append(f"{len(solo)} more training(s) of the defaults alone, at seeds after the race's (they train in "
                     f"{race.cost([arms[0].name]):.2g} s against the leader's {lead_s:.2g} s): the rank test "
                     "counts them")
    resolution = metric_resolution(plan.metric, plan.val_samples)
    comparison = comparison_test = None
    decision, chosen = "defaults", arms[0]
    if leader is not None:
        alpha = ALPHA / max(1, raced)
        comparison = compare_race(_unselected(leader, race, plan, seeds), arms[0].values("val", seeds), seeds=seeds,
                                  defaults_more=[*defaults_more, *solo], metric=plan.metric, maximize=plan.maximize,
                                  split="val", resolution=resolution, alpha=alpha, prior_std=plan.prior_std)
        comparison_test = compare_paired(leader.values("test", seeds), arms[0].values("test", seeds),
                                         seeds=seeds, metric=plan.metric, maximize=plan.maximize,
                                         split="test", alpha=alpha, prior_std=plan.prior_std)
        decision, chosen, comparison = _decision(
            comparison, leader, arms[0], seeds, plan,
            search_lead=lead_of(leader, candidates[0] if candidates else None, search_lead, plan.maximize),
            own_seed=race.first_seed if race.selected == leader.name else None,
            only_selected=race.selected == leader.name and len(seeds) == 1)
    short = race.current(short_name) if short_name is not None else None
    if decision == "defaults" and short is not None and short_name in active:
        same = _shorter_reaches(short, arms[0], plan, seeds, resolution=resolution, raced=raced, notes=notes)
        if same is not None:
            decision, chosen, leader, comparison = "shorter", short, short, same
            comparison_test = compare_paired(short.values("test", seeds), arms[0].values("test", seeds),
                                             seeds=seeds, metric=plan.metric, maximize=plan.maximize,
                                             split="test", alpha=ALPHA)
    # the model handed back is the chosen configuration's seed best on validation (expected above
    # its median on new data; the decision's figure stays the mean); its held-out figure is its own
    model_seed = _keep_model(chosen, plan, work=race.work, folder=folder, notes=notes)
    shutil.rmtree(race.work, ignore_errors=True)
    # no run of the result was judged on data nothing selected on (no test_data, no resplit round
    # after the first): its figure on new data is an estimate corrected for the winner's curse
    estimate = None
    if not any(r.test is not None for r in chosen.runs if not r.cut):
        estimate = held_out_estimate(chosen, arms[0], plan, seeds=seeds,
                                     compared=max(plan.compared, raced + 1))
    return FinalOutcome(plan=plan, arms=arms, seeds=seeds, decision=decision, chosen=chosen.name,
                        leader=leader.name if leader else None, comparison=comparison,
                        comparison_test=comparison_test, model_seed=model_seed, note="; ".join(notes),
                        estimate=estimate)
