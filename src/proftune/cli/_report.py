"""``proftune report RUN_ID | --study NAME | profile.json``: one self-contained HTML report."""

from __future__ import annotations

from typing import Annotated, TypedDict

import typer

from ..exceptions import ConfigError
from . import _options as opt
from ._common import err_console, execute, out_console


class _Written(TypedDict):
    report: str  # the file
    bytes: int


@opt.command
def report_command(
    source: Annotated[str | None, opt.unset_argument(help="A run id, or a saved profile (JSON).")] = None,
    study: Annotated[str | None, opt.shared(
        "--study", then=": report that study (all its trials) instead of a run.", show_default=False)] = None,
    out: Annotated[str | None, opt.shared_output("--out", then=" the HTML file (default report-<id>.html).")] = None,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the report in the browser.")] = False,
    f: opt.FileOpts = opt.FILE,
) -> None:
    """Write one HTML page for a run, a study or a profile: charts with the numbers beside them,
    plotly inlined, opens offline."""

    def body() -> _Written:
        from ..report import write_report

        if (source is None) == (study is None):
            raise ConfigError("give either RUN_ID or profile.json, or --study NAME (exactly one); "
                              "e.g. `proftune report 3` or `proftune report --study cnn`.")
        path = write_report(source, out, study=study, db=f.db, open_browser=open_browser, force=f.force)
        return {"report": str(path), "bytes": path.stat().st_size}

    def render(d: _Written) -> None:
        out_console.print(f"report: {d['report']} ({d['bytes'] / 2**20:.1f} MiB)", highlight=False)
        err_console.print("self-contained: open it from file://, nothing is fetched", style="dim")

    execute(body, json_out=f.json_out, debug=f.debug, render=render)
