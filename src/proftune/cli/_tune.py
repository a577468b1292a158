"""``proftune tune TASK --space space.yaml``: constraint-aware, profile-gated search."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .._paths import OutputPath
from ..exceptions import ConfigError, RunFailedError, TaskLoadError
from . import _options as opt
from ._common import (
    check_log,
    err_console,
    execute_run,
    json_out,
    keep_whole,
    log_run,
    out_console,
    parse_params,
    task_arg,
    trial_logger,
    value_text,
)
from ._script import script_command, tune_on_script

#: Keys of ``--json`` (the issue's contract), in this order.
JSON_KEYS = ("study", "best", "trials", "correlations", "importance", "budget", "scan", "strategy")


@opt.command
def tune(
    ctx: typer.Context,
    task: opt.TaskArg,
    space: Annotated[Path | None, opt.shared("--space", then="; required for a task.", show_default=False)] = None,
    objective: Annotated[list[str] | None, opt.shared(
        "--objective", then="; repeat for a Pareto front.", show_default=False)] = None,
    constraint: opt.ConstraintOpt = None,
    trials: Annotated[int, typer.Option(
        "--trials", help="Trained trials (complete or pruned) the study should hold; gated ones count apart.")] = 20,
    scan: Annotated[int | None, typer.Option(
        "--scan", help="Profile N Halton configurations first and restrict the space to where the hard "
        "profile constraints hold (default 16 with such constraints; 0: off).", show_default=False)] = None,
    max_gated: Annotated[int | None, typer.Option(
        "--max-gated", help="Stop after this many trials ended before training (default 10 per trial).",
        show_default=False)] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Stop starting trials after S seconds.",
                                                  show_default=False)] = None,
    sampler: Annotated[str, typer.Option(
        "--sampler", help=f"{opt.choices('samplers')}.")] = "tpe",
    pruner: Annotated[str, typer.Option("--pruner", help=f"{opt.choices('pruners')}.")] = "none",
    epochs: Annotated[int | None, opt.shared("--epochs", then=" per trial (default: the task's).",
                                             show_default=False)] = None,
    study: opt.StudyOpt = None,
    workers: Annotated[int, typer.Option("--workers", help="Processes on this machine sharing the study.")] = 1,
    max_failures: Annotated[int, typer.Option(
        "--max-failures", help="Stop when more trials than this failed in user code.")] = 5,
    plot: Annotated[Path | None, opt.shared_output("--plot", then=": a folder.")] = None,
    backend: Annotated[str, typer.Option(
        "--backend",
        help=f"{opt.choices('search_backends')} (local: this machine's processes; ray: Ray Tune).")] = "local",
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Ray cluster to join: auto or HOST:PORT (default: start a local one).",
        show_default=False)] = None,
    scheduler: Annotated[str, typer.Option(
        "--scheduler", help="With --backend ray: fifo, asha or pbt (population-based training).")] = "fifo",
    log: opt.LogOpt = None,
    wandb_project: opt.WandbProjectOpt = "proftune",
    param: opt.ParamOpt = None,
    o: opt.RunOpts = opt.RUN,
    threads: opt.ThreadsOpt = None,
    r: opt.ReportOpts = opt.REPORT,
    data: opt.DataOpt = None,
) -> None:
    """Search TASK's hyperparameters under constraints; gate each trial by profiling it first."""
    def body() -> Any:
        from ..search import RayOptions, load_objective, search

        cmd = script_command(task, ctx.args, command="tune")
        if cmd is not None:
            return tune_on_script(cmd, objective=objective, space=space, trials=trials, timeout=timeout,
                                  sampler=sampler, pruner=pruner, study=study, db=o.db, seed=o.seed,
                                  max_failures=max_failures)
        if space is None:
            raise ConfigError("--space is required for a task (a YAML of the params to search); a script "
                              "goes after --: `proftune tune --objective val_acc:max -- python train.py ARGS`.")
        params = parse_params(param)  # fixed for every trial, as the space's fixed:
        check_log(log, command="tune")
        live = trial_logger(log, project=wandb_project)

        ray = (RayOptions(address=ray_address, scheduler=scheduler, workers=workers, debug=o.debug)
               if backend == "ray" else None)
        try:
            target = (load_objective(task) if data is None else None) or task_arg(task, data)
            result = search(target, str(space), objectives=objective or None,
                            constraints=constraint or (), trials=trials, timeout=timeout, sampler=sampler,
                            pruner=pruner, epochs=epochs, study=study, db=o.db, workers=workers, seed=o.seed,
                            device=o.device, max_failures=max_failures, max_gated=max_gated, scan=scan, plot=plot,
                            backend=backend, ray=ray, params=params,
                            on_trial=TrialPace(trials, timeout=timeout, workers=workers, then=live))
        except TaskLoadError as exc:
            if data is not None:
                raise
            raise TaskLoadError(f"{exc} tune also searches a plain function of the params: 'obj.py:fn' or "
                                "'package.module:fn' (see proftune.search).") from None
        except RunFailedError as exc:  # too many failures: the study still reaches W&B, failed
            if exc.run_id is not None:
                log_run(log, exc.run_id, project=wandb_project, db=o.db, live=live)
            raise
        logged = log_run(log, result.run_id, project=wandb_project, db=o.db, live=live)
        failed = [t for t in result.trials if t.state == "failed"]
        if result.trials and len(failed) == len(result.trials):  # nothing was tuned: not done
            last = failed[-1]
            message = (f"every trial failed ({len(failed)} of {len(result.trials)}); the last, "
                       f"trial {last.number}: {last.reason}")
            from ..track import Store

            # the tune's run says so too (it ended, but tuned nothing): runs list --status failed finds it
            Store(result.db).update_run(result.run_id, status="failed", error=message)
            raise RunFailedError(message + (f" (logged to W&B project {wandb_project})" if logged else ""))
        return json_out(result.to_dict(), JSON_KEYS, logged)

    execute_run(body, o, r, render=_render, threads=threads,
                outputs=lambda: [_plot_output(plot)])


def _plot_output(plot: Path | None) -> OutputPath:
    from ..search import PLOT_FILES

    return OutputPath("--plot", plot, folder=True, names=PLOT_FILES)


def _render(d: dict[str, Any]) -> None:
    _render_scan(d.get("scan"))
    if d.get("script"):
        out_console.print(f"script {d['script']['command']}: {d['script']['metric_source']}", highlight=False,
                          markup=False)
    _render_trials(d)
    _render_best(d)
    _render_analysis(d)
    _render_strategy(d.get("strategy") or [])
    if (d.get("script") or {}).get("best_command"):
        out_console.print(f"run it: {d['script']['best_command']}", highlight=False, markup=False)
    if d["plots"]:
        out_console.print("plots: " + ", ".join(d["plots"]))


def _render_scan(scan: dict[str, Any] | None) -> None:
    if not scan:
        return
    early = ", stopped early: bounds stable" if scan["stopped_early"] else ""
    out_console.print(f"[bold]feasibility scan[/]: {scan['profiles']} profiles in {scan['duration_s']:.1f} s "
                      f"(no training{early}); {scan['feasible_share']:.0%} of them feasible")
    for b in scan["bounds"]:
        out_console.print(f"  {b['text']}")
    for note in scan["notes"]:
        out_console.print(f"  {note}")


class TrialPace:
    """Says once, after the first trials, when ``--trials`` is beyond what the time holds at their
    pace: the ``--timeout`` ends the search first, or no timeout and the trials would take days.
    Then hands each trial to ``then`` (a live logger) where there is one."""

    #: Trials ended before the pace is read (their median seconds).
    AFTER = 3
    #: Without a --timeout, a search longer than this is worth a word.
    LONG_S = 86400.0

    def __init__(self, trials: int, *, timeout: float | None, workers: int, then: Any = None) -> None:
        self.trials, self.timeout, self.workers, self.then = trials, timeout, max(1, workers), then
        self.started: float | None = None  # the first trial's start: about when the timeout's clock began
        self.seconds: list[float] = []
        self.said = False

    def __call__(self, record: Any) -> None:
        if self.then is not None:
            self.then(record)
        if record.duration_s is not None:
            self.seconds.append(float(record.duration_s))
            if self.started is None:
                self.started = time.monotonic() - float(record.duration_s)
        if self.said or len(self.seconds) < self.AFTER:
            return
        self.said = True
        pace = statistics.median(self.seconds) / self.workers  # seconds of wall clock a trial
        left = self.trials - len(self.seconds)
        if self.timeout is not None:
            spent = time.monotonic() - (self.started if self.started is not None else time.monotonic())
            holds = int(max(0.0, self.timeout - spent) / max(pace, 1e-9))
            if holds < left:
                err_console.print(f"--trials {self.trials}: at ~{pace:.3g} s a trial (the median of the first "
                                  f"{len(self.seconds)}{f', {self.workers} workers' if self.workers > 1 else ''}), "
                                  f"the --timeout {self.timeout:g} s holds ~{holds} more of the {left} left: the "
                                  "search stops at the timeout", markup=False, soft_wrap=True)
        elif left * pace > self.LONG_S:
            err_console.print(f"--trials {self.trials}: at ~{pace:.3g} s a trial (the median of the first "
                              f"{len(self.seconds)}), the {left} left would take ~{left * pace / 86400:.3g} days; "
                              "--timeout S bounds it (Ctrl-C stops it, the study keeps every trial that ended)",
                              markup=False, soft_wrap=True)


def _render_trials(d: dict[str, Any]) -> None:
    objectives = d["objectives"]
    table = Table(title=f"study {d['study']} ({d['sampler']}, pruner {d['pruner']})")
    for col in ("#", "state", "params", *objectives, "reason", "s"):
        table.add_column(col, overflow="fold")
    metric_names = [o.split(":")[0] for o in objectives]
    for t in d["trials"]:
        params = ", ".join(f"{k}={value_text(v)}" for k, v in t["params"].items())
        vals = [value_text(t["metrics"].get(m, "")) for m in metric_names]
        state = "gated" if t.get("gated") else t["state"]
        table.add_row(str(t["number"]), state, params, *vals, t["reason"] or "",
                      f"{t['duration_s']:.1f}" if t["duration_s"] is not None else "")
    keep_whole(table, "#", "state", *objectives, "s")  # params and reasons wrap; numbers are never cut
    out_console.print(table)
    counts = ", ".join(f"{k} {v}" for k, v in d["counts"].items() if v)
    comp, budget = d["compute"], d["budget"]
    out_console.print(f"trials: {budget['trained']} trained, {budget['gated']} gated before training "
                      f"({budget['gated_share']:.0%}; limit {budget['max_gated']}); states: {counts}")
    out_console.print(f"training {comp['train_s']:.1f} s, profiling {comp['gate_s']:.1f} s, scan "
                      f"{comp['scan_s']:.1f} s, on infeasible trials {comp['infeasible_s']:.1f} s "
                      f"(training {comp['infeasible_train_s']:.1f} s)")
    if budget.get("stopped") == "max_gated":
        out_console.print(f"[yellow]stopped: {budget['gated']} trials were gated (--max-gated)[/]")


def _render_best(d: dict[str, Any]) -> None:
    metric_names = [o.split(":")[0] for o in d["objectives"]]
    if not d["best"]:
        out_console.print("[bold red]no feasible trial finished[/]")
        return
    best = d["best"]
    label = "Pareto front" if len(metric_names) > 1 else "best"
    out_console.print(f"[bold]{label}[/]: trial {best['number']}: "
                      + ", ".join(f"{k}={value_text(v)}" for k, v in best["params"].items())
                      + " -> " + ", ".join(f"{m}={value_text(best['metrics'].get(m))}" for m in metric_names))
    sel = d.get("selection")
    if sel:
        interval = (f", 95% interval [{value_text(sel['low'])}, {value_text(sel['high'])}]"
                    if sel.get("se") is not None else "")
        out_console.print(f"  mean {metric_names[0]}={value_text(sel['mean'])} over {sel['n']} evaluations{interval} "
                          f"({sel['repeats']} of {sel['evaluations']} trials re-evaluated leaders"
                          + (f", {sel['neighbours']} tried their neighbours" if sel.get("neighbours") else "") + ")")
    for p in d["pareto"][1:]:
        out_console.print(f"  trial {p['number']}: "
                          + ", ".join(f"{m}={value_text(p['metrics'].get(m))}" for m in metric_names))


def _render_analysis(d: dict[str, Any]) -> None:
    if d["correlations"]:
        targets = sorted({t for per in d["correlations"].values() for t in per})
        ct = Table(title="correlation of each param with the targets (Spearman / Pearson)")
        ct.add_column("param")
        for t in targets:
            ct.add_column(t, justify="right")
        for p, per in d["correlations"].items():
            ct.add_row(p, *[f"{per[t]['spearman']:+.2f} / {per[t]['pearson']:+.2f}" if t in per else ""
                            for t in targets])
        out_console.print(ct)
    for metric, per in d["importance"].items():
        it = Table(title=f"parameter importance for {metric}")
        it.add_column("param")
        it.add_column("fANOVA", justify="right")
        it.add_column("PED-ANOVA", justify="right")
        fan, ped = per.get("fanova", {}), per.get("ped_anova", {})
        for p in dict.fromkeys([*fan, *ped]):
            if p == "error":
                continue
            it.add_row(p, value_text(fan.get(p, "")), value_text(ped.get(p, "")))
        out_console.print(it)


def _render_strategy(statements: list[dict[str, Any]]) -> None:
    if not statements:
        return
    out_console.print("[bold]strategy[/] (what the trials say to do next):")
    for st in statements:
        out_console.print(f"  [{st['action']}] {st['text']}")
