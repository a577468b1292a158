"""MLflow: a run's params, metrics per step, tags and artifacts, read back with MlflowClient,
from a local store and over HTTP from `mlflow server`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proftune import fit
from proftune.report import MLflowLogger, export_mlflow
from proftune.track import Store

from ._servers import free_port, serving

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
mlflow = pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
from mlflow.tracking import MlflowClient  # noqa: E402


@pytest.fixture(scope="module")
def _blank_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated MLflow database; each test copies it (the migrations take seconds)."""
    path = tmp_path_factory.mktemp("mlflow") / "blank.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def mlflow_uri(_blank_db: Path, tmp_path: Path) -> str:
    shutil.copy(_blank_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _check_profile_run(client: MlflowClient, mlflow_id: str, store: Store, rid: int) -> None:
    record = store.get_run(rid)
    run = client.get_run(mlflow_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["proftune.task"] == record.task
    assert run.data.tags["proftune.data_fingerprint"] == record.data_fingerprint[:8]
    assert run.data.tags["env.torch"] == record.env["torch"]
    assert run.data.params["batch_size"] == str(record.config["params"]["batch_size"])
    assert run.data.metrics["step_time_ms"] == pytest.approx(record.metrics["step_time_ms"])
    names = {a.path for a in client.list_artifacts(mlflow_id)}
    assert {"profile.json", "report.html"} <= names


def test_export_to_a_sqlite_store(store: Store, runs: dict[str, int], mlflow_uri: str, tmp_path: Path) -> None:
    uri = mlflow_uri
    client = MlflowClient(tracking_uri=uri)
    mlflow_id = export_mlflow(runs["profile"], uri, store=store)
    _check_profile_run(client, mlflow_id, store, runs["profile"])
    train = store.get_run(runs["train"])
    tid = export_mlflow(train, uri, experiment="digits", store=store)
    history = client.get_metric_history(tid, "step/loss")
    assert [m.step for m in history] == [p["step"] for p in train.curves["step"]]
    assert history[0].value == pytest.approx(train.curves["step"][0]["loss"])
    assert client.get_experiment_by_name("digits") is not None
    local = client.download_artifacts(tid, "report.html", str(tmp_path))
    assert "loss per step" in Path(local).read_text()


def test_logger_callback(mlflow_uri: str) -> None:
    uri = mlflow_uri
    logger = MLflowLogger(uri, experiment="fit", every=2)
    result = fit("digits-mlp", {"batch_size": 128}, epochs=1, max_steps=4, device="cpu", callbacks=[logger])
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["batch_size"] == "128"
    assert run.data.tags["proftune.task"] == "digits-mlp"
    assert [m.step for m in client.get_metric_history(logger.run_id, "step/loss")] == [2, 4]
    assert run.data.metrics["accuracy"] == pytest.approx(result.metrics["accuracy"])


@pytest.mark.skipif(shutil.which("mlflow") is None, reason="the mlflow package provides no `mlflow` command here")
def test_export_over_http_to_mlflow_server(store: Store, runs: dict[str, int], mlflow_uri: str,
                                           tmp_path: Path) -> None:
    port = free_port()
    cmd = [shutil.which("mlflow") or "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", mlflow_uri,  # already migrated: the server starts sooner
           "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"]
    uri = f"http://127.0.0.1:{port}"
    with serving(cmd, f"{uri}/health", log=tmp_path / "server.log"):
        mlflow_id = export_mlflow(runs["profile"], uri, store=store)
        _check_profile_run(MlflowClient(tracking_uri=uri), mlflow_id, store, runs["profile"])
    assert any((tmp_path / "artifacts").rglob("profile.json"))
