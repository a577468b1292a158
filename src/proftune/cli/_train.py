"""``proftune train TASK``: train with the fit loop and record the run."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from .._api import run_train
from ..task import load_task
from ._common import execute, out_console, parse_params, task_arg, with_report
from ._options import (
    DataOpt,
    DbOpt,
    DebugOpt,
    DeviceOpt,
    EpochsOpt,
    ForceOpt,
    JsonOpt,
    MaxStepsOpt,
    ParamOpt,
    ReportOpt,
    SeedOpt,
    TaskArg,
    ThreadsOpt,
)
from ._progress import EpochProgress


def train(
    task: TaskArg,
    data: DataOpt = None,
    epochs: EpochsOpt = None,
    max_steps: MaxStepsOpt = None,
    param: ParamOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    db: DbOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
    threads: ThreadsOpt = None,
    report: ReportOpt = None,
    force: ForceOpt = False,
) -> None:
    """Train TASK and record the run (config, environment, data fingerprint, metrics, curves)."""

    def body() -> Any:
        params = parse_params(param)
        task_obj = load_task(task_arg(task, data))
        progress = EpochProgress.for_run(task_obj, epochs, max_steps)
        return run_train(task_obj, params, epochs=epochs, max_steps=max_steps, device=device, seed=seed,
                         db=db, callbacks=[progress])

    def render(report: Any) -> None:
        d = report.to_dict()
        table = Table(title=f"run {d['run_id']}: {d['task']}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in d["metrics"].items():
            table.add_row(k, f"{v:.4f}")
        table.add_row("epochs / steps", f"{d['epochs']} / {d['steps']}")
        table.add_row("duration", f"{d['duration_s']:.1f} s")
        table.add_row("throughput", f"{d['throughput']:.0f} samples/s")
        table.add_row("data fingerprint", str(d["data_fingerprint"]))
        if d.get("threads"):
            table.add_row("threads", _threads_text(d["threads"]))
        if d["stop_reason"]:
            table.add_row("stopped", d["stop_reason"])
        out_console.print(table)

    execute(with_report(body, report, db, force=force), json_out=json_out, debug=debug, render=render, threads=threads)


def _threads_text(t: dict[str, Any]) -> str:
    """``1 (computed; ms/step 1: 8.9, 2: 506)`` or ``2 (--threads)``."""
    if t["source"] == "user":
        return f"{t['threads']} ({'--threads' if t['given_by'] == '$PROFTUNE_THREADS' else t['given_by']})"
    measured: dict[str, float] = {}
    for check in t.get("checks", []):
        measured.update(check["step_ms"])
    times = ", ".join(f"{k}: {v:.3g}" for k, v in sorted(measured.items(), key=lambda kv: int(kv[0])))
    return f"{t['threads']} (computed; ms/step {times})" if times else f"{t['threads']} (computed)"
