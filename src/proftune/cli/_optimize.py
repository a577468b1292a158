"""``proftune optimize TASK``: the closed loop in one resumable command."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from .._units import format_bytes, format_ms
from . import _options as opt
from ._common import check_log, err_console, execute_run, json_out, log_run, out_console, trial_logger
from ._script import command_started, optimize_on_script, script_command

#: Keys of ``--json`` (the issue's contract) first, in this order.
JSON_KEYS = ("stages", "final", "vs_baseline")


@opt.command
def optimize_command(
    ctx: typer.Context,
    task: opt.TaskArg,
    budget: Annotated[str, typer.Option("--budget", help="Wall-clock budget: 90, 90s, 5m, 1h.")] = "20m",
    memory_budget: Annotated[str | None, opt.shared(
        "--memory-budget", then="; bounds the batch size.", show_default=False)] = None,
    constraint: opt.ConstraintOpt = None,
    objective: Annotated[str | None, opt.shared("--objective", show_default=False)] = None,
    space: Annotated[str | None, opt.shared(
        "--space", then="; default: the params the fit loop and the task read.", show_default=False)] = None,
    max_accuracy_drop: opt.MaxDropOpt = 0.01,
    goal: Annotated[str, opt.shared("--goal", then=": latency, size or none.")] = "latency",
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds of the final training (mean +- std).")] = 3,
    out: Annotated[str | None, opt.shared(
        "--out", then=" the run's folder (default ./proftune-optimize/TASK/).", show_default=False)] = None,
    study: opt.StudyOpt = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the run in --out from its last stage (the stages, in the order they run: "
        f"{opt.choices('optimize_stages', last=', ')}).")] = False,
    ignore_findings: Annotated[bool, typer.Option(
        "--ignore-findings", help="Go on past error findings of the health stage.")] = False,
    o: opt.RunOpts = opt.RUN,
    threads: opt.ThreadsOpt = None,
    log: opt.LogOpt = None,
    wandb_project: opt.WandbProjectOpt = "proftune",
    report: opt.ReportOpt = None,
    force: Annotated[bool, opt.shared(
        "--force", then="; the --out folder always holds its own report.html.")] = False,
) -> None:
    """Profile, compute, search, verify and compress TASK within --budget; resumable."""
    from ..optimize import optimize

    started = command_started()  # a script's budget is the user's wall clock from the command's start
    failed_run: list[int] = []  # the optimize run, where it failed midway: W&B still gets it
    plans: list[dict[str, Any]] = []  # the budget plans said so far: a later one says what changed

    def progress(event: str, data: dict[str, Any]) -> None:
        if event == "run_failed":
            failed_run.append(int(data["run_id"]))
        elif event == "stage_start":
            err_console.print(f"[bold]{data['stage']}[/] (share {data['share_s']:.0f} s)", highlight=False)
        elif event == "plan":
            now = data.get("plan") or {}
            again = plan_change(plans[-1], now) if plans and now else None
            plans.append(now)
            err_console.print(f"[bold]plan[/]: {escape(str(data['text']) if again is None else again)}",
                              highlight=False)
        elif event == "stage_rerun":
            err_console.print(f"[yellow]{data['stage']}[/]: finished before, but {', '.join(data['missing'])} "
                              "is missing: running it again", highlight=False)
        elif event == "stage_reused":
            err_console.print(f"[dim]{data['stage']}: finished before, reused[/]", highlight=False)
        elif event == "yellow_flag":
            err_console.print(f"[yellow]yellow flag[/]: {data['cause']} in {data['region']} "
                              f"(trials {data['trials']}): region paused", highlight=False)

    def body() -> Any:
        cmd = script_command(task, ctx.args, command="optimize")
        if cmd is not None:
            return optimize_on_script(cmd, objective=objective, space=space, budget=budget, seed=o.seed, db=o.db,
                                      study=study, started=started)
        check_log(log, command="optimize")
        live = trial_logger(log, project=wandb_project)
        try:
            with _quiet(o.debug):
                result = optimize(task, budget, memory_budget=memory_budget, constraints=tuple(constraint or ()),
                                  objective=objective, space=space, max_accuracy_drop=max_accuracy_drop, goal=goal,
                                  seeds=seeds, out=out, study=study, resume=resume,
                                  ignore_findings=ignore_findings, seed=o.seed, device=o.device, db=o.db,
                                  progress=progress, on_trial=live)
        except Exception:  # failed midway: the team's project still gets the run and its stages, failed
            if failed_run:
                try:
                    log_run(log, failed_run[0], project=wandb_project, db=o.db, live=live)
                except Exception as exc:  # noqa: BLE001 - the loop's own error is what the user must see
                    err_console.print(f"[yellow]W&B[/]: the failed run {failed_run[0]} was not logged: "
                                      f"{escape(f'{type(exc).__name__}: {exc}')}", highlight=False)
            raise
        return json_out(result.to_dict(), JSON_KEYS,
                        log_run(log, result.run_id, project=wandb_project, db=o.db, live=live))

    execute_run(body, o, opt.ReportOpts(report, force), threads=threads,
                render=lambda d: _render_script(d) if "metric_source" in d else _render(d))


@contextlib.contextmanager
def _quiet(debug: bool) -> Iterator[None]:
    """No library warnings on stderr unless --debug (torch, torchao and Optuna warn a lot)."""
    if debug:
        yield
        return
    torch_log = logging.getLogger("torch")
    level = torch_log.level
    torch_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch_log.setLevel(level)


def plan_change(before: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The budget plan made again (at the search's start, from the time measured since) in one
    line of what changed against the one said before; None where the race no longer fits or now
    does (the whole plan is said again)."""
    if bool(before.get("race_fits")) != bool(now.get("race_fits")):
        return None
    said = [f"made again from the time left: {now.get('left_s', 0):.0f} s (was {before.get('left_s', 0):.0f} s)"]

    def seconds(v: Any) -> str:
        return f"~{float(v):.0f} s"

    for key, label, show in (("search_s", "the search", seconds), ("trial_epochs", "epochs a trial", str),
                             ("finalists", "finalists", str), ("seeds", "paired seeds", str),
                             ("race_s", "the race", seconds)):
        old, new = before.get(key), now.get(key)
        if old is not None and new is not None and show(old) != show(new):
            said.append(f"{label} {show(new)} (was {show(old)})")
    if len(said) == 1:
        said.append("the rest as planned")
    return "; ".join(said)


def fmt(v: Any) -> str:
    """Three significant digits (``0.0679``); whole numbers as they are."""
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.3g}"
    return "-" if v is None else str(int(v) if isinstance(v, float) else v)


def _table(title: str, columns: tuple[str, ...]) -> Table:
    """A rich table in a terminal; a plain one (Markdown rows, no colour) when piped."""
    plain = not out_console.is_terminal
    table = Table(title=title, title_justify="left", box=box.MARKDOWN if plain else box.SIMPLE_HEAD,
                  title_style="bold" if not plain else "", show_edge=not plain)
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def _changes(rows: list[dict[str, Any]], title: str) -> Table:
    """Param, its default (and whose default it is), the result's value, where it came from."""
    table = _table(title, ("param", "default", "result", "from", "why (the measurement or trial behind it)"))
    for r in rows:
        if r.get("changed"):
            table.add_row(r["param"], f"{fmt(r.get('default'))} ({r.get('default_from')})",
                          f"[bold]{escape(fmt(r.get('value')))}[/]", r.get("source") or "",
                          escape(str(r.get("why") or "")))
    return table


def _render(d: dict[str, Any]) -> None:
    story = d.get("story") or {}
    metric = d["objective"].split(":")[0]
    out_console.print(f"[bold]optimize {escape(d['task'])}[/] (run {d['run_id']}, study {escape(d['study'])})",
                      highlight=False)
    style = "green" if story.get("adopted") else "yellow"
    out_console.print(f"[bold {style}]{escape(str(story.get('decision', '')))}[/]", highlight=False)
    lines = story.get("lines") or []
    if out_console.is_terminal:  # wrapped beside their labels
        answers = Table.grid(padding=(0, 2))
        answers.add_column(style="bold", no_wrap=True)
        answers.add_column(overflow="fold")
        for x in lines:
            answers.add_row(f"  {x['label']}", x["text"])
        out_console.print(answers, highlight=False)
    else:  # one line each, whole, for grep and less
        width = max((len(x["label"]) for x in lines), default=0)
        for x in lines:
            out_console.print(f"  {x['label'].ljust(width)}  {escape(x['text'])}", highlight=False, soft_wrap=True)
    changes = (d.get("final") or {}).get("changes") or []
    if any(r.get("changed") for r in changes):
        out_console.print(_changes(changes, "what changed against the defaults"))
        same = [f"{r['param']} {fmt(r.get('value'))}" for r in changes if not r.get("changed")]
        if same:
            out_console.print(f"  unchanged: {escape(', '.join(same))}", highlight=False)
    proposed = (d.get("vs_baseline") or {}).get("leader_changes") or []
    if story.get("adopted") is False and any(r.get("changed") for r in proposed):
        out_console.print(_changes(proposed, "what the search's best would have changed (not adopted: "
                                             "not better than the defaults beyond noise)"))
    table = _table(f"stages: {escape(str(next((x['text'] for x in lines if x['label'] == 'time'), '')))}",
                   ("stage", "status", "time", "its share", f"{metric}: the two numbers", "what it did"))
    for row in story.get("stages") or []:
        table.add_row(row["stage"], str(row.get("status") or "-"), row["time"], row["share"],
                      escape(row.get("numbers") or ""), escape(row.get("did") or ""))
    out_console.print(table)
    f = d.get("final") or {}
    out_console.print(f"model: {escape(str(f.get('model')))} ({f.get('epochs')} epoch(s), seed {f.get('model_seed')}, "
                      f"the best on validation of {len(f.get('seeds') or [])} seeds: {fmt(f.get('model_val'))}, "
                      "held out "
                      f"{fmt(f.get('model_test'))}; batch 1 {format_ms(f.get('latency_ms'))}, batch "
                      f"{f.get('batch_size') or '-'} {format_ms(f.get('latency_batch_ms'))}, "
                      f"{format_bytes(f.get('size_bytes'))})", highlight=False)
    if f.get("compressed"):
        out_console.print(f"compressed: {escape(str(f['compressed'].get('model')))}", highlight=False)
    for note in story.get("notes") or []:
        style = "yellow" if note.startswith(("yellow flag", "warning")) else ""
        out_console.print(f"[{style}]{escape(note)}[/]" if style else escape(note), highlight=False)
    report = (d.get("files") or {}).get("report")
    out_console.print(f"outputs: {escape(d['out'])}" + (f" (the whole story: {escape(report)})" if report else ""),
                      highlight=False)


def _render_script(d: dict[str, Any]) -> None:
    """The loop on a script: the decision, each stage (those skipped with why), the flags to pass."""
    metric = d["objective"].split(":")[0]
    final = d["final"]
    style = "green" if final["adopted"] else "yellow"
    out_console.print(f"[bold]optimize {escape(d['task'])}[/] (run {d['run_id']}): {escape(d['metric_source'])}",
                      highlight=False)
    out_console.print(f"[bold {style}]{escape(final['decision'])}[/]", highlight=False)
    table = _table("stages", ("stage", "status", "time", "what it did"))
    for row in d["stages"]:
        table.add_row(row["stage"], row["status"], f"{row['time_s']:.1f} s", escape(str(row["did"])))
    out_console.print(table)
    vs = d.get("vs_baseline") or {}
    for key, label in (("best", "search's best"), ("defaults", "defaults")):
        figs = vs.get(key) or {}
        if figs.get("mean") is not None:
            test = vs.get(f"{key}_test") or {}
            held = (f"; {vs.get('test_metric')} {fmt(test.get('mean'))} ± {fmt(test.get('std'))}"
                    if test.get("mean") is not None else "")
            out_console.print(f"  {label}: {metric} {fmt(figs['mean'])} ± {fmt(figs.get('std'))} over {figs['n']} "
                              f"run(s){held}", highlight=False, markup=False)
    for note in d.get("notes") or []:
        out_console.print(f"[yellow]{escape(note)}[/]", highlight=False)
    out_console.print(f"run it: {final['command']}", highlight=False, markup=False)
