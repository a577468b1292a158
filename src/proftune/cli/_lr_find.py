"""``proftune lr-find TASK``: the LR range test and its robust suggestion."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .._paths import OutputPath
from ..recommend import lr_find
from ..track import Store
from . import _options as opt
from ._common import execute_run, out_console, parse_params, task_arg


@opt.command
def lr_find_command(
    task: opt.TaskArg,
    data: opt.DataOpt = None,
    min_lr: Annotated[float, typer.Option("--min-lr", help="First lr of the sweep.")] = 1e-7,
    max_lr: Annotated[float, typer.Option("--max-lr", help="Last lr of the sweep.")] = 10.0,
    steps: Annotated[int, opt.shared("--steps", then=": the sweep's optimizer steps.")] = 100,
    batch_size: opt.BatchSizeOpt = None,
    plot: Annotated[str | None, opt.shared_output("--plot", then=": one PNG file, the curve.")] = None,
    param: opt.ParamOpt = None,
    o: opt.RunOpts = opt.RUN,
    r: opt.ReportOpts = opt.REPORT,
) -> None:
    """Exponential LR range test through the fit loop: suggested_lr (robust to noisy loss),
    min_lr where the loss starts to fall, max_lr the last before it blows up, and the curve."""

    def body() -> Any:
        return lr_find(task_arg(task, data), parse_params(param), min_lr=min_lr, max_lr=max_lr, steps=steps,
                       batch_size=batch_size, device=o.device, seed=o.seed, plot=plot, store=Store(o.db))

    def render(result: Any) -> None:
        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.3g}"

        out_console.print(f"run {result.run_id}: LR range test, {result.optimizer}, batch "
                          f"{result.batch_size}, {result.steps}/{result.steps_planned} steps "
                          f"({result.stop_reason or 'complete'})")
        if result.suggested_lr is None:
            out_console.print(f"[bold red]no suggestion[/]: {result.message}")
        else:
            out_console.print(f"suggested_lr = [bold]{fmt(result.suggested_lr)}[/]  ({result.rule})")
            out_console.print(f"elsewhere: `recommend` runs this same test and scales {fmt(result.suggested_lr)} "
                              f"from batch {result.batch_size} to the batch it recommends; `optimize` runs it "
                              "shorter, checks the rate in a short training and searches around it", style="dim")
            if result.message:
                out_console.print(f"note: {result.message}")
        out_console.print(f"min_lr (loss starts to fall) = {fmt(result.min_lr)}; lr at the smoothed "
                          f"minimum = {fmt(result.lr_at_min_loss)}; max_lr (last before blow-up) = "
                          f"{fmt(result.max_lr)}")
        if plot:
            out_console.print(f"plot: {plot}")

    execute_run(body, o, r, render=render, outputs=[OutputPath("--plot", plot)])
