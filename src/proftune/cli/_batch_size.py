"""``proftune batch-size TASK --memory-budget X``: the largest batch size under a memory budget."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ..recommend import find_batch_size, format_bytes
from ..track import Store
from . import _options as opt
from ._common import execute_run, out_console, parse_params, task_arg

BudgetOpt = Annotated[str, opt.shared("--memory-budget")]


@opt.command
def batch_size(
    task: opt.TaskArg,
    memory_budget: BudgetOpt,
    data: opt.DataOpt = None,
    param: opt.ParamOpt = None,
    o: opt.RunOpts = opt.RUN,
    r: opt.ReportOpts = opt.REPORT,
    from_prediction: Annotated[bool, typer.Option(
        "--predict", help="Start from `proftune predict`'s answer (fake steps) and verify it with one "
                          "real step instead of probing.")] = False,
) -> None:
    """Largest batch size whose training step fits MEMORY_BUDGET: a memory model from <= 3 probe
    steps, verified by one step at the answer."""

    def body() -> Any:
        return find_batch_size(task_arg(task, data), parse_params(param), memory_budget=memory_budget,
                               device=o.device, seed=o.seed, store=Store(o.db), from_prediction=from_prediction)

    def render(result: Any) -> None:
        d = result.to_dict()
        m = d["model"]
        table = Table(title=f"run {d['run_id']}: largest batch size under {format_bytes(d['memory_budget'])}")
        table.add_column("batch size", justify="right")
        table.add_column("peak", justify="right")
        table.add_column("predicted", justify="right")
        table.add_column("status")
        table.add_column("role")
        for p in d["probes"]:
            predicted = m["intercept_bytes"] + m["per_sample_bytes"] * p["batch_size"]
            table.add_row(str(p["batch_size"]), format_bytes(p["peak_bytes"]), format_bytes(predicted),
                          p["status"], p["role"])
        out_console.print(table)
        out_console.print(
            f"max_batch_size = [bold]{d['max_batch_size']}[/] (limited by {d['limited_by']}; "
            f"{d['runs']} measured steps)\n"
            f"memory model: peak(B) = {format_bytes(m['intercept_bytes'])} + "
            f"{format_bytes(m['per_sample_bytes'])} x B (residual {format_bytes(m['residual_bytes'])}, "
            f"margin {format_bytes(m['margin_bytes'])})\n"
            f"predicted peak {format_bytes(d['predicted_peak_bytes'])}, measured "
            f"{format_bytes(d['measured_peak_bytes'])}; params+grads+optimizer state "
            f"{format_bytes(d['static_bytes'])}"
        )

    execute_run(body, o, r, render=render)
