"""``proftune diagnose TASK``: train with the health checks and report findings, most likely first."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..diagnose import DiagnoseResult, Finding
from ..diagnose import diagnose as run_diagnose
from . import _options as opt
from ._common import execute_run, out_console
from ._progress import train_task

_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


def _where(f: Finding) -> str:
    parts = [f"step {f.step}" if f.step else "", f"layer {f.layer}" if f.layer else ""]
    where = " ".join(x for x in parts if x)
    return escape(f" [{where}]") if where else ""  # escaped: rich would read "[step 3]" as markup


@opt.command
def diagnose(
    task: opt.TaskArg,
    t: opt.FitOpts = opt.FIT,
    lr_test: Annotated[bool, typer.Option("--lr-test/--no-lr-test",
                                          help="Confirm lr findings with a short LR range test.")] = True,
    o: opt.RunOpts = opt.RUN,
    threads: opt.ThreadsOpt = None,
    r: opt.ReportOpts = opt.REPORT,
) -> None:
    """Train TASK, watch it, and say what is wrong: cause, evidence, severity and fix."""

    def body() -> DiagnoseResult:
        return train_task(run_diagnose, task, t, o, description="diagnose", lr_test=lr_test)

    def render(d: DiagnoseResult) -> None:
        if not d.findings:
            out_console.print(f"run {d.run_id}: {d.task}: no findings, training looks healthy "
                              f"({', '.join(f'{k} {v:.4f}' for k, v in d.metrics.items())})")
            return
        table = Table(title=f"run {d.run_id}: {d.task}: root causes first, each with what it explains")
        for col in ("#", "cause", "severity", "evidence", "fix"):
            table.add_column(col, overflow="fold")
        for i, f in enumerate(d.findings, start=1):
            table.add_row(str(i), f.cause, f"[{_STYLE[f.severity]}]{f.severity}[/]",
                          f"{escape(f.summary)}{_where(f)}\n[dim]{escape(f.why)}[/]", escape(f.fix))
            for c in f.consequences:
                table.add_row("", f"  -> {c.cause}", f"[{_STYLE[c.severity]}]{c.severity}[/]",
                              f"{escape(c.summary)}{_where(c)}\n[dim]{escape(c.why)}[/]", "")
        out_console.print(table)

    execute_run(body, o, r, render=render, threads=threads)
