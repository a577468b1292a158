"""A Run in MLflow: params, metrics per step, tags (task, data fingerprint, environment) and
artifacts (profile.json, report.html, the model when the run wrote one)."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._jsonsafe import finite_float, is_finite_number, json_dumps
from .._optional import require
from ..exceptions import ConfigError
from ..track import RunRecord, Store

__all__ = ["export_mlflow", "mlflow_client"]

_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` (needs the ``mlflow`` package)."""
    return require("mlflow.tracking", feature="MLflow export").MlflowClient(tracking_uri=uri)


def key(name: str) -> str:
    """An MLflow-legal metric/param name (letters, digits, ``_-. /``)."""
    return _KEY.sub("_", str(name))[:250] or "_"


def default_artifact_location(uri: str) -> str | None:
    """Next to a SQLite tracking database (``<folder>/mlartifacts``), else MLflow's default."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return (db.resolve().parent / "mlartifacts").as_uri()
    return None


def experiment_id(client: Any, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    return str(client.create_experiment(name, artifact_location=default_artifact_location(uri)))


def log_in_batches(client: Any, run_id: str, *, metrics: Iterable[Any] = (), params: Iterable[Any] = (),
                   tags: Iterable[Any] = ()) -> None:
    """``log_batch`` within MLflow's limits (1000 metrics, 100 params, 100 tags per call)."""
    ms, ps, ts = list(metrics), list(params), list(tags)
    while ms or ps or ts:
        client.log_batch(run_id, metrics=ms[:1000], params=ps[:100], tags=ts[:100])
        ms, ps, ts = ms[1000:], ps[100:], ts[100:]


def flat_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The run's params by name, then its other settings as ``config.<key>``, all as text."""
    out: dict[str, str] = {}
    for k, v in (config.get("params") or {}).items():
        out[key(k)] = _text(v)
    for k, v in config.items():
        if k != "params":
            out[key(f"config.{k}")] = _text(v)
    return out


def _text(v: Any) -> str:
    text = json_dumps(v) if isinstance(v, (dict, list)) else str(v)
    return text[:6000]


def run_tags(r: RunRecord) -> dict[str, str]:
    env = r.env or {}
    tags = {"proftune.run_id": str(r.id), "proftune.kind": r.kind, "proftune.task": r.task,
            "proftune.status": r.status, "proftune.data_fingerprint": (r.data_fingerprint or "")[:8],
            "proftune.data_md5": r.data_fingerprint or "", "mlflow.runName": f"{r.task} {r.kind} {r.id}"}
    if r.study:
        tags["proftune.study"] = r.study
    for k in ("device", "device_name", "python", "torch", "cuda", "cores", "git_commit", "hostname"):
        if env.get(k) is not None:
            tags[f"env.{k}"] = str(env[k])
    if r.error:
        tags["proftune.error"] = r.error[:5000]
    return tags


def export_mlflow(run: int | RunRecord, uri: str, *, experiment: str = "proftune",
                  store: Store | str | None = None, db: str | None = None, report: bool = True) -> str:
    """Log run ``run`` to the MLflow tracking server or store at ``uri``; returns MLflow's run id.

    Params: the run's params (and its other settings as ``config.*``); metrics: the final ones
    plus every curve point at its step; tags: task, kind, data fingerprint, environment;
    artifacts: ``profile.json`` (a profile run), ``report.html`` (``report=True``), and the
    files the run wrote (the compressed model, plots, traces) where they still exist.
    """
    st = store if isinstance(store, Store) else (None if isinstance(run, RunRecord) else Store(store or db))
    record = run if isinstance(run, RunRecord) else st.get_run(int(run))  # type: ignore[union-attr]
    if not uri:
        raise ConfigError(f"uri={uri!r} is not a tracking URI; give one, e.g. sqlite:///mlflow.db, "
                          "file:///tmp/mlruns or http://127.0.0.1:5000.")
    client = mlflow_client(uri)
    from mlflow.entities import Metric, Param

    exp_id = experiment_id(client, experiment, uri)
    created = client.create_run(exp_id, tags=run_tags(record), run_name=f"{record.task} {record.kind} {record.id}")
    mlflow_id = str(created.info.run_id)
    now = int(time.time() * 1000)
    metrics = [Metric(key(k), f, now, 0) for k, v in record.metrics.items() if (f := finite_float(v)) is not None]
    for scope in ("step", "epoch"):
        for point in record.curve(scope):
            if is_finite_number(point.get(scope)):
                x = int(point[scope])
                metrics += [Metric(key(f"{scope}/{k}"), float(v), now, x) for k, v in point.items()
                            if k not in ("step", "epoch") and is_finite_number(v)]
    for i, point in enumerate(record.curve("lr_range")):
        metrics += [Metric(key(f"lr_range/{k}"), float(point[k]), now, i) for k in ("lr", "loss", "smoothed")
                    if is_finite_number(point.get(k))]
    params = [Param(k, v) for k, v in flat_params(record.config).items()]
    log_in_batches(client, mlflow_id, metrics=metrics, params=params)
    with tempfile.TemporaryDirectory(prefix="proftune-mlflow-") as tmp:
        if record.kind == "profile" and record.result:
            path = Path(tmp) / "profile.json"
            path.write_text(json_dumps(record.result, indent=2))
            client.log_artifact(mlflow_id, str(path))
        if report:
            from ._build import run_page

            path = Path(tmp) / "report.html"
            path.write_text(run_page(record, st).render(), encoding="utf-8")
            client.log_artifact(mlflow_id, str(path))
        for name, value in (record.artifacts or {}).items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and item and Path(item).is_file():
                    client.log_artifact(mlflow_id, item, artifact_path="model" if name == "output" else name)
    ended = {"failed": "FAILED", "interrupted": "KILLED"}.get(record.status, "FINISHED")  # MLflow's RunStatus names
    client.set_terminated(mlflow_id, status=ended)
    return mlflow_id
