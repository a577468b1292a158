"""``proftune export RUN --tensorboard DIR | --mlflow URI | --wandb``: a run in the tools people already use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypedDict

import typer

from .._paths import OutputPath, check_outputs
from ..exceptions import ConfigError
from . import _options as opt
from ._common import execute, out_console

if TYPE_CHECKING:
    from ..report import WandbRun


class _MLflowRun(TypedDict):
    uri: str
    experiment: str
    run_id: str


class _WandbRuns(TypedDict):
    project: str
    runs: list[WandbRun]


class _RunId(TypedDict):
    run_id: int


class _Exported(_RunId, total=False):
    """Where ``export`` wrote the run: each of the tools asked (the TensorBoard folder, the MLflow
    run, the W&B runs)."""

    tensorboard: str
    mlflow: _MLflowRun
    wandb: _WandbRuns


@opt.command
def export_command(
    run_id: Annotated[int, typer.Argument(help="Run id.")],
    tensorboard: Annotated[str | None, typer.Option(
        "--tensorboard", help="Write TensorBoard events to this folder.", show_default=False)] = None,
    mlflow: Annotated[str | None, typer.Option(
        "--mlflow", help="Log to this MLflow tracking URI (sqlite:///mlflow.db, file:///..., http://...).",
        show_default=False)] = None,
    experiment: Annotated[str, typer.Option("--experiment", help="MLflow experiment name.")] = "proftune",
    wandb: Annotated[bool, typer.Option(
        "--wandb", help="Log to Weights & Biases (offline with WANDB_MODE=offline or --wandb-mode offline: "
                        "files under ./wandb, no account, no network).")] = False,
    project: Annotated[str, typer.Option("--project", help="W&B project name.")] = "proftune",
    wandb_dir: Annotated[Path | None, typer.Option(
        "--wandb-dir", help="Folder that holds W&B's wandb/ folder (default: here).", show_default=False)] = None,
    wandb_mode: Annotated[str | None, typer.Option(
        "--wandb-mode", help="offline, online or disabled (default: W&B's own setting, WANDB_MODE).",
        show_default=False)] = None,
    f: opt.FileOpts = opt.FILE,
) -> None:
    """Export a recorded run: scalars, histograms, tables and hparams to TensorBoard; params,
    metrics per step, tags and artifacts to MLflow; config, history, histograms, summary and artifacts
    to W&B."""

    def body() -> _Exported:
        from ..report import export_mlflow, export_tensorboard, export_wandb
        from ..track import Store

        if tensorboard is None and mlflow is None and not wandb:
            raise ConfigError("give --tensorboard DIR, --mlflow URI and/or --wandb.")
        # event files get names of their own (time, host, pid): the folder only needs to be writable
        check_outputs([OutputPath("--tensorboard", tensorboard, folder=True),
                       OutputPath("--wandb-dir", wandb_dir, folder=True)], force=f.force)
        store = Store(f.db)
        record = store.get_run(run_id)
        out: _Exported = {"run_id": run_id}
        if tensorboard is not None:
            out["tensorboard"] = str(export_tensorboard(record, tensorboard, store=store))
        if mlflow is not None:
            out["mlflow"] = {"uri": mlflow, "experiment": experiment,
                             "run_id": export_mlflow(record, mlflow, experiment=experiment, store=store)}
        if wandb:
            out["wandb"] = {"project": project, "runs": export_wandb(record, project=project, dir=wandb_dir,
                                                                     mode=wandb_mode, store=store)}
        return out

    def render(d: _Exported) -> None:
        if "tensorboard" in d:
            out_console.print(f"tensorboard: {d['tensorboard']}  (tensorboard --logdir {d['tensorboard']})",
                              highlight=False)
        if "mlflow" in d:
            m = d["mlflow"]
            out_console.print(f"mlflow: run {m['run_id']} in experiment {m['experiment']!r} at {m['uri']}",
                              highlight=False)
        if "wandb" in d:
            for w in d["wandb"]["runs"]:
                out_console.print(f"wandb: run {w['proftune_run']} as {w['wandb_id']} in project "
                                  f"{d['wandb']['project']!r} at {w['dir']}", highlight=False)

    execute(body, json_out=f.json_out, debug=f.debug, render=render)
