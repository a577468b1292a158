"""Weights & Biases, offline (no account, no network): a run's config, history, summary,
histograms and artifacts, read back from the offline run's ``.wandb`` file with wandb's own
record protobuf (``wandb.proto.wandb_internal_pb2.Record``).

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic, version) and then LevelDB's
log format, 32 KiB blocks of chunks ``crc32c(4) length(2, little-endian) type(1) data``, a record
split over blocks as FIRST, MIDDLE..., LAST. wandb 0.31 reads it in its Go core only, so the
framing is undone here (a dozen lines) and every record is parsed by wandb's protobuf.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from proftune import fit
from proftune.exceptions import ConfigError
from proftune.report import WandbLogger, export_wandb
from proftune.track import Store

wandb = pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")
from wandb.proto import wandb_internal_pb2 as pb  # noqa: E402

_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> list[Any]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, pos, parts = [], 7, b""
    while pos + 7 <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < 7:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if length == 0 and kind == 0:
            pos += room
            continue
        chunk = data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (_FULL, _FIRST):
            parts = chunk
        else:
            parts += chunk
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString(parts)
            out.append(rec)
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_offline(run_dir: str | Path) -> dict[str, Any]:
    """What an offline run holds: run (name, group, job type, tags, start time), config, history rows,
    summary, artifacts (name, type, files), exit code."""
    # wandb's service writes the file out when it shuts down (at exit; here, now): run.finish()
    # returns once the run is complete, not once the file is
    wandb.teardown()
    files = list(Path(run_dir).glob("run-*.wandb"))
    assert len(files) == 1, f"one .wandb file expected in {run_dir}, found {files}"
    got: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "artifacts": [], "exit_code": None}
    for rec in _records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            got["run"] = {"id": r.run_id, "project": r.project, "name": r.display_name, "group": r.run_group,
                          "job_type": r.job_type, "tags": list(r.tags),
                          "start_time": r.start_time.ToDatetime(tzinfo=dt.timezone.utc)}
            got["config"].update({_key(i): json.loads(i.value_json) for i in r.config.update})
        elif kind == "config":
            got["config"].update({_key(i): json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            got["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            got["summary"].update({_key(i): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "artifact":
            a = rec.artifact
            got["artifacts"].append({"name": a.name, "type": a.type, "files": [m.path for m in a.manifest.contents]})
        elif kind == "exit":
            got["exit_code"] = rec.exit.exit_code
    return got


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.mark.usefixtures("offline")
def test_export_profile_and_train_runs(store: Store, runs: dict[str, int], tmp_path: Path) -> None:
    prof = store.get_run(runs["profile"])
    [out] = export_wandb(prof, project="proftune-test", dir=tmp_path, store=store)
    assert Path(out["dir"]).parent == tmp_path / "wandb"
    assert Path(out["dir"]).name.startswith("offline-run-")
    got = read_offline(out["dir"])
    assert got["run"]["project"] == "proftune-test"
    assert got["run"]["name"] == f"{prof.task} profile {prof.id}"
    assert got["run"]["job_type"] == "profile"
    assert got["config"]["batch_size"] == prof.config["params"]["batch_size"]
    assert got["config"]["proftune.run_id"] == prof.id
    assert got["summary"]["step_time_ms"] == pytest.approx(prof.metrics["step_time_ms"])
    assert got["summary"]["profile/macs"] == prof.result["macs"]
    logged = {k: v for row in got["history"] for k, v in row.items()}
    layers = [lay for lay in prof.result["layers"] if (lay.get("stats") or {}).get("weight")]
    assert layers, "the recorded profile has weight statistics"
    tag = f"weights/{layers[0]['name'] or 'model'}"
    assert logged[f"{tag}/_type"] == "histogram"
    weight = layers[0]["stats"]["weight"]
    assert logged[f"{tag}/bins"][1:4] == pytest.approx([weight["p1"], weight["p50"], weight["p99"]])
    assert sum(logged[f"{tag}/values"]) == pytest.approx(weight["numel"], rel=0.01)
    assert logged["profile/layers/_type"] == "table-file"
    kinds = {a["type"]: a["files"] for a in got["artifacts"]}
    assert kinds["profile"] == ["profile.json"]
    assert kinds["report"] == ["report.html"]
    assert got["exit_code"] == 0

    train = store.get_run(runs["train"])
    [tout] = export_wandb(train.id, project="proftune-test", dir=tmp_path, store=store, report=False)
    tgot = read_offline(tout["dir"])
    steps = [(row["_step"], row["step/loss"]) for row in tgot["history"] if "step/loss" in row]
    assert [s for s, _ in steps] == [p["step"] for p in train.curves["step"]]
    assert steps[0][1] == pytest.approx(train.curves["step"][0]["loss"])
    epochs = [row["epoch"] for row in tgot["history"] if any(k.startswith("epoch/") for k in row)]
    assert epochs == [p["epoch"] for p in train.curves["epoch"]]
    assert tgot["artifacts"] == [] or all(a["type"] != "report" for a in tgot["artifacts"])


@pytest.mark.usefixtures("offline")
def test_logger_callback_and_failure(tmp_path: Path) -> None:
    logger = WandbLogger("fit", dir=tmp_path, every=2, group="g1")
    result = fit("digits-mlp", {"batch_size": 128}, epochs=1, max_steps=4, device="cpu", callbacks=[logger])
    [run_dir] = sorted((tmp_path / "wandb").glob("offline-run-*"))
    got = read_offline(run_dir)
    assert got["run"]["group"] == "g1"
    assert got["config"]["batch_size"] == 128
    assert [row["_step"] for row in got["history"] if "step/loss" in row] == [2, 4]
    assert got["summary"]["accuracy"] == pytest.approx(result.metrics["accuracy"])
    assert got["exit_code"] == 0

    class Boom(WandbLogger):
        def on_step_end(self, state: Any) -> None:
            super().on_step_end(state)
            if state.step == 2:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit("digits-mlp", {"batch_size": 128}, epochs=1, max_steps=4, device="cpu",
            callbacks=[Boom("fit", dir=tmp_path / "b")])
    [failed] = sorted((tmp_path / "b" / "wandb").glob("offline-run-*"))
    assert read_offline(failed)["exit_code"] == 1


def test_bad_mode_and_project(store: Store, runs: dict[str, int], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="offline, online, disabled"):
        export_wandb(runs["profile"], mode="dry", dir=tmp_path, store=store)
    with pytest.raises(ConfigError, match="project"):
        export_wandb(runs["profile"], project="a/b", dir=tmp_path, store=store)
    with pytest.raises(ConfigError, match="offline, online, disabled"):
        WandbLogger(mode="cloud")
    assert not (tmp_path / "wandb").exists()


def test_cli_export(db_url: str, runs: dict[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from proftune.cli import app

    monkeypatch.delenv("WANDB_MODE", raising=False)
    res = CliRunner().invoke(app, ["export", str(runs["train"]), "--wandb", "--wandb-mode", "offline", "--project",
                                   "cli", "--wandb-dir", str(tmp_path), "--db", db_url, "--json"])
    assert res.exit_code == 0, res.output
    [w] = json.loads(res.stdout)["wandb"]["runs"]
    got = read_offline(w["dir"])
    assert got["run"]["project"] == "cli"
    assert got["run"]["id"] == w["wandb_id"]
    bad = CliRunner().invoke(app, ["export", str(runs["train"]), "--wandb", "--wandb-mode", "cloud", "--db", db_url])
    assert bad.exit_code == 2
    assert "offline, online, disabled" in bad.output


@pytest.mark.usefixtures("offline")
def test_a_study_as_one_group(store: Store, runs: dict[str, int], tmp_path: Path) -> None:
    tune = store.get_run(runs["tune"])
    trials = sorted(store.list_runs(parent_id=tune.id), key=lambda r: r.id)
    assert trials, "the recorded study has trials"
    out = export_wandb(tune, project="study", dir=tmp_path, store=store, report=False)
    assert [o["proftune_run"] for o in out] == [tune.id, *(t.id for t in trials)]
    groups = set()
    for o, rec in zip(out, [tune, *trials], strict=True):
        got = read_offline(o["dir"])
        groups.add(got["run"]["group"])
        assert got["run"]["job_type"] == rec.kind
        for k, v in rec.metrics.items():
            if isinstance(v, float):
                assert got["summary"][k] == pytest.approx(v)
    assert groups == {tune.study}
