"""``proftune recommend TASK``: every training parameter proftune computes, from one Profile."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from .._units import parse_duration
from ..exceptions import ConfigError
from ..integrations import EMIT_FORMATS, emit_snippet
from ..profile import Profile
from ..recommend import Recommendations, recommend
from ..track import Store
from . import _options as opt
from ._common import (
    as_flags,
    err_console,
    execute_run,
    keep_whole,
    out_console,
    parse_params,
    progress_enabled,
    task_arg,
    value_text,
)


@dataclass(frozen=True)
class _Result:
    """The recommendations with their JSON form (the list itself would serialise as a bare list)."""

    recs: Recommendations
    emit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = self.recs.to_dict()
        if self.emit is not None:
            out["emit"] = {"format": self.emit, "snippet": self.snippet()}
        return out

    def snippet(self) -> str:
        assert self.emit is not None
        return emit_snippet(self.recs, self.emit, header=f"proftune recommend, run {self.recs.run_id}")


@opt.command
def recommend_command(
    task: opt.TaskArg,
    data: opt.DataOpt = None,
    memory_budget: Annotated[str | None, opt.shared(
        "--memory-budget", then="; default: free CUDA memory, none on CPU.", show_default=False)] = None,
    target_batch: Annotated[int | None, typer.Option(
        "--target-batch", min=1, help="Batch size to reach (default: the critical batch size).",
        show_default=False)] = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", help="A saved Profile (JSON) to read instead of profiling now.", show_default=False)] = None,
    lr_steps: Annotated[int, typer.Option("--lr-steps", min=5, help="Steps of the LR range test.")] = 100,
    noise_steps: Annotated[int, typer.Option(
        "--noise-steps", min=1, help="Steps of the noise-scale measurement.")] = 30,
    optimizer_budget: Annotated[str, typer.Option(
        "--optimizer-budget", help="Time for the equal-time optimizer comparison (4s, 1min; 0 skips it).")] = "4s",
    embedding_budget: Annotated[str, typer.Option(
        "--embedding-budget", help="Time for sizing embedding tables (two trainings; 0 skips it).")] = "120s",
    ddp: Annotated[int | None, opt.shared(
        "--ddp", then=" at a few batch sizes and give the per-rank batch (ddp_batch_size).", min=2,
        show_default=False)] = None,
    ddp_share: Annotated[float, typer.Option(
        "--ddp-share", help="The largest share of the DDP step the all-reduce may take.")] = 0.10,
    emit: Annotated[str | None, typer.Option(
        "--emit", help="Print the parameters as a snippet to paste: lightning, transformers or yaml.",
        show_default=False)] = None,
    param: opt.ParamOpt = None,
    o: opt.RunOpts = opt.RUN,
    threads: opt.ThreadsOpt = None,
    r: opt.ReportOpts = opt.REPORT,
) -> None:
    """Batch size, lr and its scaling, critical batch, accumulation, precision, data loading,
    bottleneck layers and the optimizer (and embedding sizes for a model with embedding tables),
    each with the measured evidence behind it."""

    def body() -> _Result:
        if emit is not None and emit not in EMIT_FORMATS:
            raise ConfigError(f"--emit {emit!r} is unknown; valid: {', '.join(EMIT_FORMATS)}.")
        prof = Profile.load(profile) if profile else None
        opt_s, emb_s = (0.0 if text.strip() in ("0", "0s") else parse_duration(text, name=name)
                        for text, name in ((optimizer_budget, "--optimizer-budget"),
                                           (embedding_budget, "--embedding-budget")))
        say = (lambda msg: err_console.print(f"[dim]... {msg}[/]")) if progress_enabled() else None
        return _Result(recommend(task_arg(task, data), parse_params(param), profile=prof, memory_budget=memory_budget,
                                 target_batch=target_batch, device=o.device, seed=o.seed, lr_steps=lr_steps,
                                 noise_steps=noise_steps, optimizer_budget_s=opt_s, embedding_budget_s=emb_s,
                                 ddp=ddp, ddp_share=ddp_share,
                                 store=Store(o.db),
                                 progress=say), emit)

    def render(result: _Result) -> None:
        if result.emit is not None:  # stdout holds only the snippet: `> params.py` works
            sys.stdout.write(result.snippet())
            return
        recs = result.recs
        table = Table(title=f"run {recs.run_id}: recommendations", show_lines=True)
        table.add_column("name")
        table.add_column("value")
        table.add_column("confidence")
        table.add_column("why, and its effect", overflow="fold")
        for r in recs:
            effect = f"\n[dim]effect:[/] {escape(r.effect)}" if r.effect else ""
            table.add_row(r.name, escape(value_text(r.value, digits=3)), r.confidence,
                          escape(as_flags(r.reason)) + effect)
        keep_whole(table, "name", "confidence")
        out_console.print(table)

    execute_run(body, o, r, render=render, threads=threads)
