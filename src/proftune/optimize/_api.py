"""``proftune.optimize``: the closed loop in one resumable call.

baseline -> health -> compute -> layer_value -> search -> final -> compress, each stage a Run
(kind ``optimize``, linked to the run's parent ``optimize`` Run) fed by the measured outputs of
the stages before it. Every stage calls the public API of the subpackage that owns the work.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._device import resolve_device
from .._holdout import HoldoutInfo, held_out_info
from .._jsonsafe import finite_float, json_safe
from .._threads import fit_key, work_threads
from ..exceptions import ConfigError, RunFailedError
from ..search import prepare_storage
from ..task import Task, load_task
from ..track import Store, data_fingerprint, environment, not_held, redact_url
from ..train import TrainParams
from ._budget import Budget
from ._changes import ParamChange, optimizer_defaults, param_changes
from ._config import OptimizeConfig, Validated, default_study, validate
from ._final import Arm, FinalOutcome
from ._output import load_line, write_html, write_outputs, write_summary
from ._planner import Planner
from ._records import (
    BaselineOutputs,
    CompressOutputs,
    ComputeOutputs,
    FinalOutputs,
    HealthOutputs,
    LayerValueOutputs,
    SearchStageOutputs,
)
from ._result_records import (
    CompressedModel,
    FinalSummary,
    OptimizeResult,
    SplitComparisons,
    SplitSummaries,
    StageRow,
    VsBaseline,
)
from ._search_plan import task_param_defaults
from ._stages import BaseStage, StageResult, stages
from ._state import OptimizeState, StageStatus, StateFile, own_run
from ._story import tell

log = logging.getLogger(__name__)


def ended_as(exc: BaseException) -> str:
    """The status a run or stage ended by ``exc`` is recorded with: ``interrupted`` for Ctrl-C or
    SIGTERM (a KeyboardInterrupt, as the CLI raises it), ``failed`` for anything else."""
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"

__all__ = ["OptimizeResult", "optimize"]

Progress = Callable[[str, dict[str, object]], None]


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
        identity = StateFile(task=self.name, study=self.cfg.study or default_study(self.name),
                             objective=v.objective, budget_s=v.budget_s)
        self.state = OptimizeState.load_or_new(self.out, identity)
        self.study: str = self.state.data["study"]
        self.budget = Budget(v.budget_s, spent_s=float(self.state.data.get("spent_s", 0.0)),
                             skip=tuple(st.name for st in stages() if st.skipped(self)))
        self.defaults_record = TrainParams.of(task)
        self.defaults: Mapping[str, object] = self.defaults_record.params
        # selection reads all of val_data; the figures a user reads come from data nothing selected
        # on (test_data, resplit rounds) or an estimate corrected for the winner's curse
        self.task = task
        self.holdout = held_out_info(task, batch_size=self.defaults_record.batch_size or 32)
        #: The plan of the budget, from the stages' records and this clock (the loop plans nothing).
        self.planner = Planner(state=self.state, v=v, clock=self.budget, holdout=self.holdout, out=self.out,
                               full_epochs=task.default_epochs)
        self.run_id = self._parent_run()

    # -- records ------------------------------------------------------------------------------
    def _parent_run(self) -> int:
        stored = self.state.data.get("run_id")
        if stored is not None:
            # this process runs it now: a sweep of stale runs (a stage's, a concurrent `runs list`)
            # must not take the first, dead process's pid for this one's and mark it failed
            self.store.update_run(int(stored), status="running", ended_at=None, duration_s=None, error=None,
                                  pid=os.getpid(), host=socket.gethostname())
            return int(stored)
        config = {"stage": None, "budget_s": self.v.budget_s, "objective": self.v.objective,
                  "params": self.defaults, "out": str(self.out), "study": self.study,
                  "held_out": self.holdout.to_dict(),
                  "options": {k: redact_url(v) if k == "db" and v else v
                              for k, v in vars(self.cfg).items() if k not in ("extra", "on_trial")}}
        run_id = self.store.start_run("optimize", self.name, config=config, env=environment(self.dev),
                                      data_fingerprint=data_fingerprint(self.task, dict(self.defaults)),
                                      study=self.study)
        self.state.data["run_id"] = run_id
        self.state.save()
        return run_id

    def stage(self, st: BaseStage) -> None:
        """Run stage ``st`` (unless it finished before and its files are there) as a Run linked to
        the optimize run."""
        name = st.name
        if self.state.finished(name):
            missing = st.missing_files(self.state.outputs(name), self.out)
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
            # the stage's work outside the fit loop (evaluations, probes, range tests) at the
            # threads the load leaves: a thread per core on a busy machine waits at every parallel
            # region (a plateau CNN's compute stage at load 8: 9.4 s at two threads, 2.5 s at one)
            # the stage's own runs (diagnose, profile, each tune and train) end with it, with their
            # own status and end time, not held until the command's outputs are written
            with work_threads(fit_key(self.task, self.dev.type)), not_held():
                res = st.run(self, share, started + share)
        except BaseException as exc:
            status = ended_as(exc)
            self.store.finish_run(run_id, status=status, error=f"{type(exc).__name__}: {exc}")
            self.state.set_status(name, StageStatus(status=status, error=f"{type(exc).__name__}: {exc}",
                                                    run_id=run_id, share_s=share,
                                                    duration_s=time.monotonic() - started))
            self.state.save()
            raise
        if not isinstance(res, StageResult) or not isinstance(res.outputs, st.record):
            raise TypeError(f"stage {name!r} ({type(st).__name__}.run) must return a StageResult holding its "
                            f"{st.record.__name__}, but got {res!r}.")
        duration = time.monotonic() - started
        metrics = {k: x for k, x in (("before", res.before), ("after", res.after)) if x is not None}
        outputs = res.outputs.to_dict()
        self.store.finish_run(run_id, status="finished", result=json_safe(outputs),
                              metrics={f"{self.v.metric}_{k}": x for k, x in metrics.items()})
        self.state.set_status(name, StageStatus(status=res.status, duration_s=duration, share_s=share,
                                                run_id=run_id, outputs=outputs, metric_before=res.before,
                                                metric_after=res.after))
        self.state.data["spent_s"] = self.budget.elapsed_s
        self.state.save()
        self.say("stage_end", {"stage": name, "duration_s": duration, "status": res.status,
                               "before": res.before, "after": res.after})
        st.on_end(self)

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> OptimizeResult:
        try:
            for st in stages():
                self.stage(st)
        except BaseException as exc:
            status = ended_as(exc)
            self.store.finish_run(self.run_id, status=status, error=f"{type(exc).__name__}: {exc}",
                                  result=json_safe({"stages": self.state.stages}))
            self.say("run_failed", {"run_id": self.run_id, "error": f"{type(exc).__name__}: {exc}", "status": status})
            raise
        result = self._result()
        metrics = {f"final_{self.v.metric}": result.final.mean or float("nan")}
        # finished only once every output is written: a write that fails (a full disk) leaves the
        # run failed with what was kept, and --resume writes the outputs again (every stage reused)
        try:
            result = dataclasses.replace(result, files=write_outputs(result, self.state, self.out))
            self.store.update_run(self.run_id, result=json_safe(result.to_dict()), metrics=metrics,
                                  artifacts=result.files)
            html = write_html(self.run_id, self.out, self.store)  # reads the run's result
            if html is not None:
                result = dataclasses.replace(result, files={**result.files, "report": html})
            write_summary(result, self.out)
        except BaseException as exc:
            kept = sorted(str(p.relative_to(self.out)) for p in self.out.rglob("*")
                          if p.is_file() and not p.name.startswith("."))
            status = ended_as(exc)
            self.store.finish_run(self.run_id, status=status,
                                  error=f"{type(exc).__name__}: {exc}; kept in {str(self.out)!r}: {', '.join(kept)}; "
                                        "run again with --resume to write the outputs",
                                  artifacts={"kept": kept})
            self.say("run_failed", {"run_id": self.run_id, "error": f"{type(exc).__name__}: {exc}", "status": status})
            raise
        self.store.finish_run(self.run_id, status="finished", result=json_safe(result.to_dict()),
                              metrics=metrics, artifacts=result.files)
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
                             computed=comp.computed.params(), reasons=comp.reasons(),
                             fixed=self.state.record(SearchStageOutputs).fixed(), searched=searched,
                             built=optimizer_defaults(self.task, self.defaults))
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
        held_source = self.holdout.describe()
        if race.estimate is not None:  # no data nothing selected on: the defaults' figure is their own
            d_test = dataclasses.replace(d_test, mean=race.estimate.defaults)
            held_source = f"{HoldoutInfo('estimate', None, self.holdout.val_samples, None).describe()}: " \
                          f"{race.estimate.describe()}"
        rows: list[StageRow] = []
        for stage in stages():
            name = stage.name
            rec = st.stages.get(name, {})  # state.json's entry of the stage
            after = rec.get("metric_after")
            gain = None
            if after is not None and d_val.mean is not None and name in ("search", "final", "compress"):
                gain = (after - d_val.mean) if self.v.maximize else (d_val.mean - after)
            rows.append(StageRow(name=name, status=rec.get("status"), duration_s=rec.get("duration_s"),
                                   share_s=rec.get("share_s"), run_id=rec.get("run_id"),
                                   metric_before=rec.get("metric_before"), metric_after=after,
                                   compares=stage.compares, gain_vs_baseline=gain,
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
            latency_device=fin.latency_device or str(self.dev),
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
            metric=self.v.metric, decision=race.decision, defaults_params=dict(self.defaults),
            summary=_decision_line(race, self.v.metric), defaults=SplitSummaries(val=d_val, test=d_test),
            final=SplitSummaries(val=chosen.summary("val"), test=(
                dataclasses.replace(chosen.summary("test"), mean=race.estimate.chosen) if race.estimate is not None
                else chosen.summary("test"))),
            baseline=d_val.mean, baseline_test=d_test.mean, final_mean=fin.metric.mean, final_std=fin.metric.std,
            final_test_mean=fin.test.mean, final_test_std=fin.test.std, leader=race.leader,
            leader_vs_defaults=SplitComparisons(val=cmp_val, test=race.comparison_test),
            beyond_noise=bool(cmp_val and cmp_val.beyond_noise), search_gap=race.search_gap(),
            race_note=race.note, held_out=self.holdout, held_out_source=held_source,
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
            stages=rows, final=final, vs_baseline=vs, flags=st.record(SearchStageOutputs).flags,
            warnings=st.record(HealthOutputs).warnings,
            layer_findings=st.record(LayerValueOutputs).findings,
            stop_reason=self._stop_reason(), spec=self.spec)
        # a line that runs from any folder: the params from config.yaml, the weights by absolute path
        result = dataclasses.replace(result, final=dataclasses.replace(final, load=load_line(result)))
        return dataclasses.replace(result, story=tell(result))


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
    if not cmp.beyond_noise:
        return (f"{race.chosen} is ahead of the defaults and not behind them beyond one validation figure's noise "
                f"({cmp.describe()})")
    return f"{race.chosen} beats the defaults beyond noise ({cmp.describe()})"


def _signed(diff: float, maximize: bool) -> float:
    return diff if maximize else -diff


def _compact(name: str, outputs: Mapping[str, object]) -> dict[str, object]:
    """A stage's outputs for ``--json`` and the table: the decisions, not every measurement."""
    drop = {"search": ("history", "plan", "top", "trials_log"), "layer_value": ("layers",),
            "compute": ("recommendations",), "final": ("evidence", "race")}
    return {k: v for k, v in outputs.items() if k not in drop.get(name, ())}


def optimize(task: Task | str, budget: str | float = "20m", *, config: OptimizeConfig | None = None,
             store: Store | None = None, progress: Progress | None = None, **options: Any) -> OptimizeResult:
    """Run the closed loop on ``task`` within ``budget`` (``"5m"``, ``90``, ...) and return its result.

    ``options`` set :class:`OptimizeConfig` fields (``memory_budget``, ``constraints``,
    ``objective``, ``space``, ``max_accuracy_drop``, ``goal``, ``seeds``, ``out``, ``study``,
    ``resume``, ``ignore_findings``, ``device``, ``db``, ``seed``, ``on_trial``: each search trial's
    Run as it ends, e.g. ``proftune.report.WandbTrialLogger``). The same call again with
    ``resume=True`` (or the same ``study``) continues from the last finished stage.
    ``progress(event, data)`` is called at each stage's start and end, after search chunks and
    after each final run, and with ``"run_failed"`` (``run_id``, ``error``, ``status``: ``failed``,
    or ``interrupted`` by Ctrl-C or SIGTERM) where the loop ends midway, before the error is raised.
    """
    task_obj = load_task(task)
    v = validate(task_obj, config, {"budget": budget, **options})
    st = store or Store(v.cfg.db)
    _check_same_store(v, st)
    with own_run(v.out, st, (v.stored or {}).get("study") or v.cfg.study):
        _before_the_clock(st)
        return _Loop(task_obj, v, st, progress, spec=task if isinstance(task, str) else None).run()


def _before_the_clock(store: Store) -> None:
    """What a process pays once, paid before the budget's clock starts, so that the budget buys
    trainings: torch's optimizers import ``torch._dynamo`` when the first one is built (1.5 s on
    this 2-core machine, 7 s at load 9: half of a 16 s budget, in the defaults' own training), and
    Optuna's storage on a new database loads alembic and stamps its schema (0.3 s, 2 s at load 9,
    in the search stage's first call)."""
    try:
        import torch._dynamo  # noqa: F401
    except ImportError:  # a torch without it: its optimizers do not import it either
        pass
    try:
        prepare_storage(store.url)
    except Exception:  # the search stage opens it again and says what is wrong there
        log.debug("the search's storage could not be opened before the clock", exc_info=True)


def _absolute_spec(spec: str) -> str:
    """``spec`` with a relative task file made absolute (built-in names, modules unchanged)."""
    head, sep, tail = spec.rpartition(":") if ":" in spec else (spec, "", "")
    path_part, cls = (head, f":{tail}") if sep and tail.isidentifier() else (spec, "")
    if path_part.endswith(".py") and Path(path_part).exists():
        return f"{Path(path_part).resolve()}{cls}"
    return spec
