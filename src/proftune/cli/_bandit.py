"""``proftune bandit TASK --configs configs.yaml --rounds N``: allocate runs across configurations."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ..diagnose import bandit as run_bandit
from . import _options as opt
from ._common import execute_run, out_console


@opt.command
def bandit(
    task: opt.TaskArg,
    configs: Annotated[str, typer.Option(
        "--configs", help="YAML file: a list of param mappings (each may have a name).")],
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Training runs to allocate in this call (>= 1).")],
    policy: Annotated[str, typer.Option("--policy", help="thompson, ucb or uniform.")] = "thompson",
    metric: Annotated[str | None, opt.shared("--metric", then=": the one to reward (default accuracy, else val_loss).",
                                             show_default=False)] = None,
    mode: Annotated[str, typer.Option(
        "--mode", help="max, min or auto (the metric's known direction, or the task's metric_directions).",
    )] = "auto",
    epochs: Annotated[int | None, opt.shared("--epochs", then=" per run.", min=1)] = None,
    name: Annotated[str | None, typer.Option("--name", help="Bandit name in the store (default: task + configs hash).",
                                             show_default=False)] = None,
    o: opt.RunOpts = opt.RUN,
    r: opt.ReportOpts = opt.REPORT,
) -> None:
    """Run TASK ROUNDS times, choosing each configuration by Thompson sampling or UCB; the state
    lives in the store, so the next call continues. Reports allocation and the regret curve."""

    def body() -> Any:
        return run_bandit(task, configs, rounds=rounds, policy=policy, metric=metric, mode=mode,
                          epochs=epochs, name=name, device=o.device, seed=o.seed, db=o.db)

    def render(report: Any) -> None:
        d = report.to_dict()
        table = Table(title=f"bandit {d['bandit']} ({d['policy']}, {d['metric']} {d['mode']}): "
                            f"{d['total_pulls']} pulls in all")
        for col in ("config", "pulls", f"mean {d['metric']}", "std", "params"):
            table.add_column(col, overflow="fold")
        for a in d["arms"]:
            mean = "-" if a["mean"] is None else f"{a['mean']:.4f}"
            std = "-" if a["std"] is None or a["std"] != a["std"] else f"{a['std']:.4f}"
            mark = " (best)" if a["arm"] == d["best"] else ""
            table.add_row(a["arm"] + mark, str(a["pulls"]), mean, std, str(a["params"]))
        out_console.print(table)
        if d["regret"]:
            step = max(1, len(d["regret"]) // 8)
            points = ", ".join(f"{i + 1}: {d['regret'][i]:.3g}" for i in range(0, len(d["regret"]), step))
            out_console.print(f"cumulative regret vs the best estimated mean (pull: regret): {points}; "
                              f"final {d['regret'][-1]:.3g} (uniform allocation: {d['uniform_regret'][-1]:.3g})")

    execute_run(body, o, r, render=render)
