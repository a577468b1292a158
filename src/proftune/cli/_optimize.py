"""``proftune optimize TASK``: the closed loop in one resumable command."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.table import Table

from ._common import (
    DbOpt,
    DebugOpt,
    DeviceOpt,
    JsonOpt,
    SeedOpt,
    TaskArg,
    err_console,
    execute,
    out_console,
)

#: Keys of ``--json`` (the issue's contract) first, in this order.
JSON_KEYS = ("stages", "final", "vs_baseline")


def optimize_command(
    task: TaskArg,
    budget: Annotated[str, typer.Option("--budget", help="Wall-clock budget: 90, 90s, 5m, 1h.")] = "20m",
    memory_budget: Annotated[str | None, typer.Option(
        "--memory-budget", help="Largest training step memory (4GiB, 512MB); bounds the batch size.",
        show_default=False)] = None,
    constraint: Annotated[list[str] | None, typer.Option(
        "--constraint", help='Hard constraint on every trial, e.g. "step_time_ms<50"; repeat for several.',
        show_default=False)] = None,
    objective: Annotated[str | None, typer.Option(
        "--objective", help="METRIC[:max|min] (default accuracy:max, else val_loss:min).",
        show_default=False)] = None,
    space: Annotated[str | None, typer.Option(
        "--space", help="Search space YAML (default: the params the fit loop and the task read).",
        show_default=False)] = None,
    max_accuracy_drop: Annotated[float, typer.Option(
        "--max-accuracy-drop", help="Largest metric drop compression may cost (0.01 = 1 point).")] = 0.01,
    goal: Annotated[str, typer.Option("--goal", help="Compress toward: latency, size or none.")] = "latency",
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds of the final training (mean +- std).")] = 3,
    out: Annotated[str | None, typer.Option(
        "--out", help="Output folder (default ./proftune-optimize/TASK/).", show_default=False)] = None,
    study: Annotated[str | None, typer.Option(
        "--study", help="Study name; the same name again continues the run.", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out from its last stage.")] = False,
    ignore_findings: Annotated[bool, typer.Option(
        "--ignore-findings", help="Go on past error findings of the health stage.")] = False,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    db: DbOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Profile, compute, search, verify and compress TASK within --budget; resumable."""
    from ..optimize import optimize

    def progress(event: str, data: dict[str, Any]) -> None:
        if event == "stage_start":
            err_console.print(f"[bold]{data['stage']}[/] (share {data['share_s']:.0f} s)", highlight=False)
        elif event == "stage_reused":
            err_console.print(f"[dim]{data['stage']}: finished before, reused[/]", highlight=False)
        elif event == "yellow_flag":
            err_console.print(f"[yellow]yellow flag[/]: {data['cause']} in {data['region']} "
                              f"(trials {data['trials']}): region paused", highlight=False)

    def body() -> Any:
        with _quiet(debug):
            result = optimize(task, budget, memory_budget=memory_budget, constraints=tuple(constraint or ()),
                          objective=objective, space=space, max_accuracy_drop=max_accuracy_drop, goal=goal,
                              seeds=seeds, out=out, study=study, resume=resume,
                              ignore_findings=ignore_findings, seed=seed, device=device, db=db,
                              progress=progress)
        d = result.to_dict()
        return {**{k: d[k] for k in JSON_KEYS}, **{k: v for k, v in d.items() if k not in JSON_KEYS}}

    execute(body, json_out=json_out, debug=debug, render=_render)


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


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _render(d: dict[str, Any]) -> None:
    metric = d["objective"].split(":")[0]
    table = Table(title=f"optimize {d['task']}: {d['elapsed_s']:.0f} s of {d['budget_s']:.0f} s "
                        f"(study {d['study']}, run {d['run_id']})")
    for col in ("stage", "status", "time s", f"{metric} before -> after", "vs baseline"):
        table.add_column(col)
    for s in d["stages"]:
        before, after = s.get("metric_before"), s.get("metric_after")
        change = f"{_fmt(before)} -> {_fmt(after)}" if (before is not None or after is not None) else ""
        table.add_row(s["name"], _fmt(s["status"]), _fmt(s.get("duration_s")), change,
                      f"{s['gain_vs_baseline']:+.4g}" if s.get("gain_vs_baseline") is not None else "")
    out_console.print(table)
    f = d["final"]
    std = f" +- {f['std']:.4g}" if f.get("std") is not None else ""
    out_console.print(f"final: {metric} {_fmt(f.get('mean'))}{std}  params {f.get('params')}")
    out_console.print(f"model: {f.get('model')}  latency {_fmt(f.get('latency_ms'))} ms  "
                      f"size {_fmt(f.get('size_bytes'))} B")
    if f.get("compressed"):
        c = f["compressed"]
        out_console.print(f"compressed ({c.get('method')}): {metric} {_fmt(c.get('metric'))}, latency "
                          f"{_fmt(c.get('latency_ms'))} ms, size {_fmt(c.get('size_bytes'))} B -> {c.get('model')}")
    for flag in d.get("flags") or []:
        out_console.print(f"[yellow]yellow flag[/]: {flag['cause']} in {flag['region']}: {flag['action']}")
    for w in d.get("warnings") or []:
        out_console.print(f"[yellow]warning[/] {w['cause']}: {w['summary']} (fix: {w['fix']})")
    for lf in d.get("layer_findings") or []:
        out_console.print(f"layer {lf['layer']}: {lf['finding']}; {lf['action']}")
    out_console.print(f"outputs: {d['out']}")
