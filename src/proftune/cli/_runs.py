"""``proftune runs list|show|compare``: read the experiment log."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from .._paths import OutputPath, check_outputs
from ..track import RUN_KINDS, RunComparison, RunRecord, RunSummary, Store
from . import _options as opt
from ._common import err_console, execute, keep_whole, out_console, value_text

runs_app = typer.Typer(help="List, show and compare recorded runs.", no_args_is_help=True)


def _open(db: str | None) -> Store:
    store = Store(db)
    store.reap_stale()
    return store


#: A cell of a run's field: a number to 4 digits, a dict as ``k=v`` pairs, never a Python repr.
_fmt = value_text


@runs_app.command("list")
def list_runs(
    task: Annotated[str | None, typer.Option("--task", help="Only runs of this task.")] = None,
    kind: Annotated[str | None, typer.Option(
        "--kind", help=f"Only runs of this kind ({opt.choices('run_kinds', last=', ')}).")] = None,
    status: Annotated[str | None, typer.Option("--status", help="running, finished, failed or interrupted.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many runs, newest first.")] = 50,
    db: opt.DbOpt = None,
    json_out: opt.JsonOpt = False,
    debug: opt.DebugOpt = False,
) -> None:
    """List recorded runs, newest first."""

    def body() -> dict[str, list[RunSummary]]:
        from ..exceptions import ConfigError

        if kind is not None and kind not in RUN_KINDS:
            raise ConfigError(f"--kind {kind!r} is unknown; valid: {', '.join(RUN_KINDS)}.")
        store = _open(db)
        runs = store.list_runs(task=task, kind=kind, status=status, limit=limit, summary=True)
        return {"runs": [r.summary() for r in runs]}

    def render(d: dict[str, list[RunSummary]]) -> None:
        table = Table(title="runs", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
        for col in ("id", "kind", "task", "status", "started", "duration", "data", "metrics"):
            table.add_column(col, overflow="fold")
        for r in d["runs"]:
            metrics = "\n".join(f"{k}={_fmt(v)}" for k, v in list(r["metrics"].items())[:3])  # one a line
            dur = f"{r['duration_s']:.1f}s" if r["duration_s"] is not None else "-"
            table.add_row(str(r["run_id"]), r["kind"], r["task"], r["status"],
                          r["started_at"][:16].replace("T", " "), dur, str(r["data_fingerprint"] or "-"), metrics)
        keep_whole(table, "id", "kind", "task", "status", "started", "duration", "data")
        out_console.print(table)

    execute(body, json_out=json_out, debug=debug, render=render)


@runs_app.command("show")
def show(
    run_id: Annotated[int, typer.Argument(help="Run id.")],
    db: opt.DbOpt = None,
    json_out: opt.JsonOpt = False,
    debug: opt.DebugOpt = False,
) -> None:
    """Show one run: config, environment, data fingerprint, metrics, curves, anomalies."""

    def body() -> RunRecord:
        return _open(db).get_run(run_id)

    def render(r: RunRecord) -> None:
        table = Table(title=f"run {r.id}", show_header=False)
        table.add_column("field")
        table.add_column("value")
        for key, value in (("kind", r.kind), ("task", r.task), ("status", r.status), ("started_at", r.started_at),
                           ("ended_at", r.ended_at), ("duration_s", r.duration_s),
                           ("data_fingerprint", (r.data_fingerprint or "")[:8] or None), ("error", r.error)):
            if value is not None:
                table.add_row(key, _fmt(value))
        for k, v in r.config.items():
            table.add_row(f"config.{k}", _fmt(v))
        for k, v in r.metrics.items():
            table.add_row(f"metrics.{k}", _fmt(v))
        for k in ("python", "torch", "cuda", "device", "device_name", "cores", "git_commit"):
            table.add_row(f"env.{k}", _fmt(r.env.get(k)))
        if r.anomalies:
            table.add_row("anomalies", _fmt(r.anomalies))
        table.add_row("curves", ", ".join(f"{k}: {len(v) if isinstance(v, list) else 0} points"
                                          for k, v in r.curves.items()))
        out_console.print(table)

    execute(body, json_out=json_out, debug=debug, render=render)


@runs_app.command("compare")
def compare(
    a: Annotated[int, typer.Argument(help="First run id.")],
    b: Annotated[int, typer.Argument(help="Second run id.")],
    db: opt.DbOpt = None,
    json_out: opt.JsonOpt = False,
    debug: opt.DebugOpt = False,
    report: opt.ReportOpt = None,
    force: opt.ForceOpt = False,
) -> None:
    """Compare two runs: config and environment differences, data fingerprints, metric deltas."""

    def body() -> RunComparison:
        check_outputs([OutputPath("--report", report)], force=force)
        store = _open(db)
        d = store.compare(a, b)
        if report is not None:
            from ..report import write_compare_report

            path = write_compare_report(a, b, report, store=store, force=True)  # checked above
            err_console.print(f"report: {path}", markup=False)
        return d

    def render(d: RunComparison) -> None:
        table = Table(title=f"run {d['a']} vs run {d['b']}")
        for col in ("what", f"run {d['a']}", f"run {d['b']}", "delta"):
            table.add_column(col)
        fp = d["data_fingerprint"]
        table.add_row("data", str(fp["a"]), str(fp["b"]), "same data" if fp["match"] else "DIFFERENT data")
        for k, v in d["config"].items():
            table.add_row(f"config.{k}", _fmt(v["a"]), _fmt(v["b"]), "")
        for k, v in d["metrics"].items():
            delta = "" if v["delta"] is None else f"{v['delta']:+.4g}"
            table.add_row(f"metrics.{k}", _fmt(v["a"]), _fmt(v["b"]), delta)
        for k, v in d["env"].items():
            table.add_row(f"env.{k}", _fmt(v["a"]), _fmt(v["b"]), "")
        out_console.print(table)

    execute(body, json_out=json_out, debug=debug, render=render)
