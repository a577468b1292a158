"""``proftune train TASK``: train with the fit loop and record the run."""

from __future__ import annotations

import math

from rich.table import Table

from .._api import TrainResult, run_train
from ..train import ThreadChoice
from . import _options as opt
from ._common import execute_run, out_console
from ._progress import train_task


@opt.command
def train(
    task: opt.TaskArg,
    t: opt.FitOpts = opt.FIT,
    o: opt.RunOpts = opt.RUN,
    threads: opt.ThreadsOpt = None,
    r: opt.ReportOpts = opt.REPORT,
) -> None:
    """Train TASK and record the run (config, environment, data fingerprint, metrics, curves)."""

    def body() -> TrainResult:
        return train_task(run_train, task, t, o)

    def render(d: TrainResult) -> None:
        table = Table(title=f"run {d.run_id}: {d.task}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in d.metrics.items():  # a NaN or infinity is recorded as null (JSON has neither)
            table.add_row(k, f"{v:.4f}" if math.isfinite(v) else "not finite")
        table.add_row("epochs / steps", f"{d.epochs} / {d.steps}")
        table.add_row("duration", f"{d.duration_s:.1f} s")
        table.add_row("throughput", f"{d.throughput:.0f} samples/s")
        table.add_row("data fingerprint", str(d.data_fingerprint))
        if d.threads:
            table.add_row("threads", _threads_text(d.threads))
        if d.stop_reason:
            table.add_row("stopped", d.stop_reason)
        out_console.print(table)

    execute_run(body, o, r, render=render, threads=threads)


def _threads_text(t: ThreadChoice) -> str:
    """``1 (computed; ms/step 1: 8.9, 2: 506)`` or ``2 (--threads)``."""
    if t.source == "user":
        return f"{t.threads} ({'--threads' if t.given_by == '$PROFTUNE_THREADS' else t.given_by})"
    times = ", ".join(f"{k}: {v:.3g}" for k, v in sorted(t.step_ms.items(), key=lambda kv: int(kv[0])))
    return f"{t.threads} (computed; ms/step {times})" if times else f"{t.threads} (computed)"
