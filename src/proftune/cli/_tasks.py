"""``proftune tasks``: the built-in tasks."""

from __future__ import annotations

from rich.table import Table

from ..examples import BUILTIN_TASKS
from . import _options as opt
from ._common import execute, out_console


def tasks(json_out: opt.JsonOpt = False) -> None:
    """List the built-in tasks (usable wherever a command takes TASK)."""

    def body() -> dict[str, list[dict[str, str | None]]]:  # name, description, requires (None: nothing)
        return {"tasks": [{"name": n, "description": t.description, "requires": t.requires or None}
                          for n, t in BUILTIN_TASKS.items()]}

    def render(d: dict[str, list[dict[str, str | None]]]) -> None:
        table = Table(title="built-in tasks")
        table.add_column("name")
        table.add_column("description")
        for t in d["tasks"]:
            table.add_row(t["name"], t["description"])
        out_console.print(table)

    execute(body, json_out=json_out, render=render)
