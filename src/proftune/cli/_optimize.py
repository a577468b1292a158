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


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _ms(v: Any) -> str:
    return f"{v:.3g} ms" if isinstance(v, (int, float)) else "-"


def _kib(v: Any) -> str:
    return f"{v / 1024:.1f} KiB" if isinstance(v, (int, float)) else "-"


def _pm(s: dict[str, Any] | None) -> str:
    """``mean ± std (n)`` of a summary."""
    if not s or s.get("mean") is None:
        return "-"
    std = f" ± {s['std']:.3f}" if s.get("std") is not None else ""
    return f"{s['mean']:.4f}{std} (n={s.get('n')})"


def _source(evidence: str) -> str:
    for word in ("searched", "computed", "measured", "fixed"):
        if evidence.startswith(word):
            return word
    return "default"


def _changes(d: dict[str, Any]) -> Table:
    """What changed against the defaults: param, default, chosen, where the value came from."""
    f = d["final"]
    defaults = (d.get("vs_baseline") or {}).get("defaults_params") or {}
    table = Table(title="what changed against the defaults", title_justify="left")
    for col in ("param", "default", "result", "from", "evidence"):
        table.add_column(col, overflow="fold")
    evidence = f.get("evidence") or {}
    for name, value in sorted((f.get("params") or {}).items()):
        default = defaults.get(name, "(unset)")
        changed = repr(default) != repr(value)
        ev = str(evidence.get(name, ""))
        table.add_row(name, _fmt(default), f"[bold]{_fmt(value)}[/]" if changed else _fmt(value),
                      _source(ev) if changed else "unchanged", ev if changed else "")
    if f.get("epochs") is not None and f.get("default_epochs") is not None and f["epochs"] != f["default_epochs"]:
        table.add_row("epochs", _fmt(f["default_epochs"]), f"[bold]{f['epochs']}[/]", "computed",
                      "the epochs every search trial ran: what the budget held six trials of")
    return table


def _render(d: dict[str, Any]) -> None:
    metric = d["objective"].split(":")[0]
    vs = d.get("vs_baseline") or {}
    table = Table(title=f"optimize {d['task']}: {d['elapsed_s']:.0f} s of {d['budget_s']:.0f} s "
                        f"(study {d['study']}, run {d['run_id']})", title_justify="left")
    for col in ("stage", "status", "time s", "share s", f"{metric}: before -> after", "what before -> after compares"):
        table.add_column(col, overflow="fold")
    for s in d["stages"]:
        before, after = s.get("metric_before"), s.get("metric_after")
        change = f"{_fmt(before)} -> {_fmt(after)}" if (before is not None or after is not None) else ""
        table.add_row(s["name"], _fmt(s["status"]), _fmt(s.get("duration_s"), 3), _fmt(s.get("share_s"), 3),
                      change, s.get("compares") or "" if change else "")
    out_console.print(table)
    out_console.print(_changes(d))
    f = d["final"]
    dv, fv = (vs.get("defaults") or {}), (vs.get("final") or {})
    verdict = "[green]kept the choice[/]" if vs.get("decision") == "chosen" else "[yellow]kept the defaults[/]"
    out_console.print(f"[bold]result[/]: {verdict}: {vs.get('summary', '')}", highlight=False)
    out_console.print(f"  {metric} on validation (selection): defaults {_pm(dv.get('val'))} -> result "
                      f"{_pm(fv.get('val'))}", highlight=False)
    gain_test = vs.get("gain_test")
    test_cmp = (vs.get("leader_vs_defaults") or {}).get("test") or {}
    out_console.print(f"  {metric} held out ({vs.get('held_out_source', '-')}): defaults {_pm(dv.get('test'))} "
                      f"-> result {_pm(fv.get('test'))}"
                      + (f", {gain_test:+.4f}" if gain_test is not None else "")
                      + (f" (the leader against the defaults there: {test_cmp['reason']})"
                         if test_cmp.get("reason") and vs.get("decision") == "chosen" else ""), highlight=False)
    gap = vs.get("search_gap") or {}
    if gap.get("gap") is not None:
        out_console.print(f"  search -> final: the search measured {gap['arm']} at {gap['search_mean']:.4f} "
                          f"({gap['search_n']} trial(s)), the final seeds {gap['final_mean']:.4f} "
                          f"(gap {gap['gap']:+.4f})", highlight=False)
    bs = f.get("batch_size")
    out_console.print(f"model: {f.get('model')} ({f.get('epochs')} epochs; seed {f.get('model_seed')}, the best of "
                      f"{len(f.get('seeds') or [])} on validation: {_fmt(f.get('model_val'))}, held out "
                      f"{_fmt(f.get('model_test'))}; latency batch 1 {_ms(f.get('latency_ms'))}, batch {bs or '-'} "
                      f"{_ms(f.get('latency_batch_ms'))}, size {_kib(f.get('size_bytes'))})", highlight=False)
    if f.get("compressed"):
        c = f["compressed"]
        sp = vs.get("latency_speedup")
        out_console.print(f"compressed ({c.get('method')}): latency batch 1 {_ms(c.get('latency_ms'))} vs "
                          f"{_ms(f.get('latency_ms'))} uncompressed" + (f" ({sp:.2f}x)" if sp else "")
                          + f", batch {bs or '-'} {_ms(c.get('latency_batch_ms'))} vs {_ms(f.get('latency_batch_ms'))}"
                          + f", size {_kib(c.get('size_bytes'))} vs {_kib(f.get('size_bytes'))}; {metric} "
                          f"{_fmt(c.get('metric'))} on validation, {_fmt(c.get('test_metric'))} held out "
                          f"-> {c.get('model')}", highlight=False)
    elif vs.get("compression"):
        out_console.print(f"compression: {vs['compression']}", highlight=False)
    out_console.print(f"[bold]stopped[/]: {d.get('stop_reason') or '-'}", highlight=False)
    for flag in d.get("flags") or []:
        out_console.print(f"[yellow]yellow flag[/]: {flag['cause']} in {flag['region']}: {flag['action']}")
    for w in d.get("warnings") or []:
        out_console.print(f"[yellow]warning[/] {w['cause']}: {w['summary']} (fix: {w['fix']})")
    for lf in d.get("layer_findings") or []:
        out_console.print(f"layer {lf['layer']}: {lf['finding']}; {lf['action']}")
    out_console.print(f"outputs: {d['out']}")
