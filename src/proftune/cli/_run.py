"""``proftune run [--every N] [--steps K] [--out profile.json] -- python train.py ARGS``: profile an
unmodified script; its training step is found by the optimizer's global step hooks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from .._paths import OutputPath, check_outputs
from .._records import JsonRecord
from ..exceptions import ConfigError
from ..profile import Profile, ScriptResult, parse_command, run_script
from ..recommend import Recommendation, bottleneck_rule, data_loading_rule, precision_rule
from ..track import Store, environment, held_until_written
from . import _options as opt
from ._common import err_console, execute, out_console, value_text


def _memory_headroom(p: Profile) -> Recommendation:
    """A larger batch where the sampled step's peak leaves room on the device (CUDA only: a CPU
    has no allocator limit to measure against)."""
    import torch

    mem = p.memory
    evidence: dict[str, int | str] = {"peak_bytes": mem.peak_bytes, "activations_bytes": mem.activations_bytes,
                                "batch_size": p.batch_size, "device": p.device}
    if not p.device.startswith("cuda") or not torch.cuda.is_available() or not mem.peak_bytes:
        return Recommendation("batch_size", None, "memory headroom is measured against a CUDA device's "
                              f"memory; this profile ran on {p.device} (use `proftune batch-size TASK`).",
                              evidence, "low", "")
    total = torch.cuda.get_device_properties(torch.device(p.device)).total_memory
    fixed = max(mem.peak_bytes - mem.activations_bytes, 0)
    per_sample = mem.activations_bytes / max(p.batch_size, 1)
    evidence["device_total_bytes"] = total
    if per_sample <= 0:
        return Recommendation("batch_size", None, "no activation memory was measured per sample.", evidence, "low", "")
    fits = int((0.9 * total - fixed) / per_sample)
    return Recommendation("batch_size", max(fits, p.batch_size),
                          f"the step's peak is {mem.peak_bytes / 2**30:.2f} GiB of {total / 2**30:.1f} GiB at "
                          f"batch {p.batch_size}; activations grow ~linearly, so about {fits} samples fit in 90%.",
                          evidence, "low", "a larger batch uses the device better; re-tune the learning rate")


def recommendations(p: Profile) -> list[Recommendation]:
    """What a profile alone supports: precision, data loading, bottleneck layers, memory headroom."""
    rules = [data_loading_rule, bottleneck_rule, _memory_headroom]
    if p.mode == "train":
        rules.insert(0, precision_rule)
    return [rule(p) for rule in rules]


def _task_name(command: list[str]) -> str:
    return Path(command[1] if command and Path(command[0]).name.startswith("python") and len(command) > 1
                else command[0]).stem


def _record(store: Store, result: ScriptResult, command: list[str], config: dict[str, Any],
            first: int) -> list[int]:
    """One Run per profiled model (or one failed Run when nothing was sampled); ``first``: the Run
    started with the script (``running`` while it ran), which the first model's profile finishes."""
    ids: list[int] = []
    task = _task_name(command)
    # a script stopped by SIGTERM/SIGINT is interrupted (what it sampled is kept), not failed
    status = "interrupted" if result.interrupted else ("finished" if result.exit_code == 0 else "failed")
    error = None
    if result.interrupted:
        error = f"interrupted by {result.interrupted}"
    elif result.exit_code:
        error = f"the script exited with code {result.exit_code}" + (f": {result.error}" if result.error else "")
    profiles = result.profiles or (None,)
    for i, p in enumerate(profiles):
        env = environment(p.device if p is not None else None)
        if i == 0:
            run_id = first
            store.update_run(run_id, config={**config, "command": command}, env=env)
        else:
            run_id = store.start_run("profile", task, config={**config, "command": command}, env=env)
        fields: dict[str, Any] = {}
        if p is not None:
            p = dataclasses.replace(p, config={**p.config, "run_id": run_id})
            fields = {"metrics": p.metrics(), "result": p.to_dict()}
        err = error if p is not None else (error or f"no step was sampled: {result.summary}")
        store.finish_run(run_id, status=status if p is not None or result.interrupted else "failed", error=err,
                         **fields)
        ids.append(run_id)
    return ids


@dataclass(frozen=True)
class _Ran(JsonRecord):
    """What ``proftune run`` prints (``--json``: these fields): how the script ended, as its first Run
    records it, the profiles (each one Run of ``run_ids``) and what the first one recommends."""

    ended_at: str | None
    duration_s: float | None
    exit_code: int
    interrupted: str | None
    error: str | None
    summary: str
    steps_seen: int
    run_ids: list[int]
    profiles: list[Profile]
    recommendations: list[Recommendation]
    out: str | None
    report: str | None


def _print_end(d: _Ran) -> None:
    """When the Run ended and how long it took, as the store records it."""
    if d.ended_at:
        took = f" after {d.duration_s:.1f} s" if d.duration_s is not None else ""
        out_console.print(f"run {d.run_ids[0]} ended {d.ended_at}{took}", style="dim", highlight=False)


@opt.command
def run_command(
    ctx: typer.Context,
    command: Annotated[list[str] | None, opt.unset_argument(
        help="The script to run, after --: python train.py ARGS (or python -m pkg.module ARGS).")] = None,
    every: Annotated[int | None, opt.unset(
        "--every", help="Sample every N-th training step (default: every 50th, further apart where a sampled "
                        "step costs more than 1.5% of the training's time: a very short step).")] = None,
    steps: Annotated[int | None, opt.shared(
        "--steps", then=": K sampled steps, then the script runs on unwatched.", show_default=False)] = None,
    out: Annotated[Path | None, opt.shared_output("--out", then=" the (largest model's) profile as JSON.")] = None,
    report: opt.ReportOpt = None,
    stats: Annotated[bool, typer.Option("--stats/--no-stats", help="Weight, activation, gradient statistics.")] = True,
    f: opt.FileOpts = opt.FILE,
) -> None:
    """Profile an unmodified training script: per-layer time, MACs, memory, statistics and the step's
    phases, found through its optimizer; records a Run and prints what the profile recommends."""
    cmd = list(command or []) + list(ctx.args)
    exit_code = [0]

    def body() -> _Ran:
        if every is not None and (isinstance(every, bool) or every < 1):
            raise ConfigError(f"--every must be a positive integer, but got {every}.")
        if steps is not None and steps < 1:
            raise ConfigError(f"--steps must be a positive integer, but got {steps}.")
        check_outputs([OutputPath("--out", out), OutputPath("--report", report)], force=f.force)
        store = Store(f.db)
        # recorded as it starts (running, with this process): its duration is the script's, and a
        # crash of this process leaves a run the store's reaping finds
        parse_command(cmd)  # a command that cannot run is refused before any Run is recorded
        run0 = store.start_run("profile", _task_name(cmd), config={"command": cmd})
        try:
            result = run_script(cmd, every=every, steps=steps, stats=stats)
        except BaseException as exc:
            store.finish_run(run0, status="interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
                             error=f"{type(exc).__name__}: {exc}")
            raise
        # a script ended by SIGTERM or SIGINT exits 130, as every other command does on an interrupt
        # (a script's own exit code otherwise: 143 for a SIGTERM left to its default)
        exit_code[0] = 130 if result.interrupted else result.exit_code
        config = {"every": result.every, "max_overhead": result.max_overhead, "steps": steps, "source": "run"}
        first = result.profiles[0] if result.profiles else None
        recs = recommendations(first) if first is not None else []
        with held_until_written([out, report]):  # its Runs finished once --out and --report are written
            ids = _record(store, result, cmd, config, run0)
            if first is not None and out is not None:
                dataclasses.replace(first, config={**first.config, "run_id": ids[0]}).save(out)
            if first is not None and report is not None:
                from ..report import write_report

                write_report(ids[0], report, store=store, force=True)
            # as recorded (the held Run reads with the end and duration of its work, as the page does)
            ran = store.get_run(ids[0])
        return _Ran(ended_at=ran.ended_at, duration_s=ran.duration_s, exit_code=result.exit_code,
                    interrupted=result.interrupted, error=result.error, summary=result.summary,
                    steps_seen=result.steps_seen, run_ids=ids, profiles=list(result.profiles), recommendations=recs,
                    out=str(out) if (out and first is not None) else None,
                    report=str(report) if (report and first is not None) else None)

    def render(d: _Ran) -> None:
        from ._profile import render_profile

        err_console.print(f"proftune: {d.summary}", markup=False, highlight=False)
        if d.profiles:
            p = d.profiles[0]
            render_profile(dataclasses.replace(p, config={**p.config, "run_id": d.run_ids[0]}), 10,
                            Path(d.out) if d.out else None)
            for other, rid in zip(d.profiles[1:], d.run_ids[1:], strict=False):
                out_console.print(f"also profiled: {other.config.get('model')} (run {rid})", highlight=False)
            for r in d.recommendations:
                out_console.print(f"→ {r.name}: {value_text(r.value, digits=3)} — {r.reason}",
                                  highlight=False, markup=False)
            if d.report:
                out_console.print(f"report {d.report}", style="dim")
        else:
            out_console.print("no profile: no step was sampled (lower --every?)", highlight=False)
        _print_end(d)
        if d.interrupted:
            err_console.print(f"the script was interrupted by {d.interrupted}; the steps sampled before "
                              "are recorded.", markup=False)
        elif d.exit_code:
            err_console.print(f"the script exited with code {d.exit_code}", markup=False)

    execute(body, json_out=f.json_out, debug=f.debug, render=render)
    if exit_code[0]:
        raise typer.Exit(exit_code[0])
