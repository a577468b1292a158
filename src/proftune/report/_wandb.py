"""A Run in Weights & Biases: config, metrics per step and epoch, the profile's histograms and
layer table, the final metrics as the summary, the report and model as artifacts; the runs a
run started (a study's trials) as runs of one group.

Offline mode needs no account and no network: ``mode="offline"`` (or ``WANDB_MODE=offline``)
writes the run under ``<dir>/wandb/offline-run-*``; ``wandb sync`` uploads it later. The run's
``.wandb`` file is complete once wandb's service has shut down (at the process's exit, or after
``wandb.teardown()``): ``run.finish()`` returns when the run is, not when its file is.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

from .._jsonsafe import finite_float, is_finite_number, json_dumps
from .._optional import require
from ..exceptions import ConfigError
from ..track import RunRecord, Store
from ._mlflow import flat_params
from ._tensorboard import quantile_histogram

__all__ = ["MODES", "WandbTrialLogger", "export_wandb", "wandb_module", "wandb_run"]

#: W&B's modes: ``offline`` writes files only; ``online`` needs an account; ``disabled`` logs nothing.
MODES = ("offline", "online", "disabled")


class WandbRun(TypedDict):
    """A W&B run written: the proftune run it holds, its W&B id and its local folder."""

    proftune_run: int
    wandb_id: str
    dir: str


def wandb_module() -> Any:
    return require("wandb", feature="W&B export")


def wandb_mode(mode: str | None) -> str | None:
    if mode is not None and mode not in MODES:
        raise ConfigError(f"mode={mode!r} is not a W&B mode; valid: {', '.join(MODES)} "
                          "(None: W&B's own setting, WANDB_MODE).")
    return mode


@contextmanager
def wandb_run(*, project: str, dir: str | Path | None, mode: str | None, exit_code: int = 0,
              **init: Any) -> Iterator[Any]:
    """``wandb.init`` quiet (no console capture, no git or code scan, no system stats), finished
    on leaving with ``exit_code``; failed (exit code 1) when the block raises."""
    wandb = wandb_module()
    folder = Path(dir) if dir is not None else Path.cwd()
    folder.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(console="off", silent=True, disable_git=True, save_code=False,
                              x_disable_stats=True, x_disable_machine_info=True)
    run = wandb.init(project=project, dir=str(folder), mode=wandb_mode(mode), settings=settings, reinit="create_new",
                     **init)
    try:
        yield run
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish(exit_code=exit_code)


def _config(config: Mapping[str, Any]) -> dict[str, bool | int | float | str | None]:
    """The run's params by name (as values where they are scalars), then its settings as ``config.*``."""
    out: dict[str, bool | int | float | str | None] = {}
    for k, v in (config.get("params") or {}).items():
        out[str(k)] = v if isinstance(v, (bool, int, float, str)) or v is None else json_dumps(v)
    for k, v in flat_params(config).items():
        if k.startswith("config."):
            out[k] = v
    return out


def _log_curves(run: Any, r: RunRecord) -> None:
    run.define_metric("epoch")
    run.define_metric("epoch/*", step_metric="epoch")
    for point in r.curve("step"):
        if is_finite_number(point.get("step")):
            values = {f"step/{k}": float(v) for k, v in point.items()
                      if k not in ("step", "epoch") and is_finite_number(v)}
            if values:
                run.log(values, step=int(point["step"]))
    for point in r.curve("epoch"):
        if is_finite_number(point.get("epoch")):
            values = {f"epoch/{k}": float(v) for k, v in point.items()
                      if k not in ("step", "epoch") and is_finite_number(v)}
            if values:
                run.log({"epoch": int(point["epoch"]), **values})
    lr_range = r.curve("lr_range")
    if lr_range:
        run.define_metric("lr_range/*", step_metric="lr_range/index")
        for i, point in enumerate(lr_range):
            values = {f"lr_range/{k}": float(point[k]) for k in ("lr", "loss", "smoothed")
                      if is_finite_number(point.get(k))}
            run.log({"lr_range/index": i, **values})


def _log_profile(run: Any, p: Mapping[str, Any]) -> None:
    wandb = wandb_module()
    layers = [lay for lay in p.get("layers") or [] if isinstance(lay, Mapping)]
    cols = ["name", "type", "params", "macs", "forward_ms", "backward_ms", "activation_bytes", "time_share"]
    table = wandb.Table(columns=cols, data=[[lay.get(c) for c in cols] for lay in layers])
    values: dict[str, object] = {"profile/layers": table}
    for lay in layers:
        name = str(lay.get("name") or "model")
        stats = lay.get("stats") or {}
        for kind, folder in (("weight", "weights"), ("activation", "activations")):
            h = quantile_histogram(stats[kind]) if isinstance(stats.get(kind), Mapping) else None
            if h is not None:
                values[f"{folder}/{name}"] = wandb.Histogram(np_histogram=(h["counts"], [h["lo"], *h["edges"]]))
    run.log(values)
    step, mem = p.get("step") or {}, p.get("memory") or {}
    summary = {f"profile/step_{k}": float(v) for k, v in step.items() if is_finite_number(v)}
    summary.update({f"profile/memory_{k}": float(v) for k, v in mem.items() if is_finite_number(v)})
    for key in ("macs", "flops"):
        if is_finite_number(p.get(key)):
            summary[f"profile/{key}"] = float(p[key])
    run.summary.update(summary)


def _artifacts(run: Any, r: RunRecord, store: Store | None, *, report: bool) -> None:
    wandb = wandb_module()
    with tempfile.TemporaryDirectory(prefix="proftune-wandb-") as tmp:
        files: list[tuple[str, str, Path]] = []  # (artifact name, type, file)
        if r.kind == "profile" and r.result:
            path = Path(tmp) / "profile.json"
            path.write_text(json_dumps(r.result, indent=2))
            files.append((f"profile-{r.id}", "profile", path))
        if report and store is not None:
            from ._build import run_page

            path = Path(tmp) / "report.html"
            path.write_text(run_page(r, store).render(), encoding="utf-8")
            files.append((f"report-{r.id}", "report", path))
        for name, value in (r.artifacts or {}).items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and item and Path(item).is_file():
                    kind = "model" if name == "output" else name
                    files.append((f"{kind}-{r.id}", kind, Path(item)))
        for name, kind, path in files:
            art = wandb.Artifact(_artifact_name(name), type=_artifact_name(kind))
            art.add_file(str(path))
            run.log_artifact(art)


def _artifact_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:128] or "artifact"


def _export_one(r: RunRecord, store: Store | None, *, project: str, dir: str | Path | None, mode: str | None,
                group: str, report: bool) -> WandbRun:
    tags = [f"kind:{r.kind}", f"status:{r.status}"]
    if r.data_fingerprint:
        tags.append(f"data:{r.data_fingerprint[:8]}")
    # a run that failed (or was interrupted) in proftune fails in W&B too: exit code 1
    with wandb_run(project=project, dir=dir, mode=mode, name=f"{r.task} {r.kind} {r.id}", group=group,
                   job_type=r.kind, tags=tags, config=_config(r.config),
                   exit_code=0 if r.status in ("finished", "running") else 1) as run:
        run.config.update({"proftune.run_id": r.id, "proftune.task": r.task,
                           **{f"env.{k}": str(v) for k, v in (r.env or {}).items()
                              if k in ("device", "device_name", "python", "torch", "cuda", "cores", "git_commit")
                              and v is not None}})
        _log_curves(run, r)
        if r.kind == "profile" and isinstance(r.result, Mapping) and r.result.get("layers"):
            _log_profile(run, r.result)
        run.summary.update({k: f for k, v in r.metrics.items() if (f := finite_float(v)) is not None})
        _artifacts(run, r, store, report=report)
        return {"proftune_run": r.id, "wandb_id": str(run.id), "dir": str(Path(run.dir).parent)}


def export_wandb(run: int | RunRecord, *, project: str = "proftune", dir: str | Path | None = None,
                 mode: str | None = None, group: str | None = None, store: Store | str | None = None,
                 db: str | None = None, report: bool = True, children: bool = True,
                 skip: Collection[int] = ()) -> list[WandbRun]:
    """Log run ``run`` to W&B project ``project``; returns ``{"proftune_run", "wandb_id", "dir"}``
    per W&B run written (``dir``: the local run folder, ``<dir>/wandb/offline-run-*`` offline).

    Config: the run's params (its other settings as ``config.*``, environment as ``env.*``);
    history: ``step/*`` at each optimizer step, ``epoch/*`` against ``epoch``; a profile's layer
    table and weight/activation histograms (rebuilt from the recorded quantiles, as TensorBoard's);
    summary: the final metrics; artifacts: ``profile.json``, ``report.html`` and the files the
    run wrote (the model). The runs it started (``children``: a study's trials) follow as runs of
    one group (``group``, default the study's name, else ``<task> <kind> <id>``), but for the
    run ids in ``skip`` (logged already, by :class:`WandbTrialLogger` while the study ran).
    """
    st = store if isinstance(store, Store) else (None if isinstance(run, RunRecord) and store is None and db is None
                                                 else Store(store or db))
    record = run if isinstance(run, RunRecord) else st.get_run(int(run))  # type: ignore[union-attr]
    if not project or "/" in project:
        raise ConfigError(f"project={project!r} is not a W&B project name; give a name without '/', e.g. 'proftune'.")
    wandb_mode(mode)
    wandb_module()
    name = group or record.study or f"{record.task} {record.kind} {record.id}"
    out = [_export_one(record, st, project=project, dir=dir, mode=mode, group=name, report=report)]
    if children and st is not None:
        for child in sorted(st.list_runs(parent_id=record.id), key=lambda c: c.id):
            if child.id in skip:
                continue
            out.append(_export_one(child, st, project=project, dir=dir, mode=mode, group=name, report=False))
    return out



class WandbTrialLogger:
    """A study's trials in W&B as they end: ``search(..., on_trial=WandbTrialLogger("team"))``.

    Each trial Run becomes one W&B run as :func:`export_wandb` writes a trial (params as config,
    ``epoch/*`` curves, final metrics as summary; job type ``trial``), in the group named after
    its study, so that a team sees a study's trials while it runs; a failed trial is logged with
    exit code 1. Afterwards ``export_wandb(tune_run, skip=logger.run_ids)`` adds the study's own
    run without logging its trials twice. A trial that W&B refused (``errors``) is not in
    ``run_ids``: that export tries it again. ``mode`` and ``dir`` as for :func:`export_wandb`.
    """

    def __init__(self, project: str = "proftune", *, dir: str | Path | None = None, mode: str | None = None,
                 group: str | None = None) -> None:
        if not project or "/" in project:
            raise ConfigError(f"project={project!r} is not a W&B project name; give a name without '/', "
                              "e.g. 'proftune'.")
        self.project, self.dir, self.mode, self.group = project, dir, wandb_mode(mode), group
        wandb_module()
        #: ``{"proftune_run", "wandb_id", "dir"}`` per trial logged, in the order they ended.
        self.logged: list[WandbRun] = []
        #: ``(proftune run id, message)`` per trial that W&B refused.
        self.errors: list[tuple[int, str]] = []

    @property
    def run_ids(self) -> set[int]:
        """The proftune run ids logged (what ``export_wandb(skip=)`` takes)."""
        return {int(x["proftune_run"]) for x in self.logged}

    def __call__(self, record: RunRecord) -> None:
        group = self.group or record.study or f"{record.task} tune {record.parent_id}"
        try:
            out = _export_one(record, None, project=self.project, dir=self.dir, mode=self.mode, group=group,
                              report=False)
        except (wandb_module().errors.Error, OSError) as exc:  # W&B's failure (service, network) ends no study
            self.errors.append((record.id, f"{type(exc).__name__}: {exc}"))
            return
        self.logged.append(out)
