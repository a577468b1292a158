"""The Ray backend on a local instance: loopback only, records, ASHA.

PBT is in ``test_ray_pbt.py`` (its own instance: the two files run on two xdist workers); the
two-node cluster that loses a node is in ``test_ray_cluster.py``.

Every trial must land in the study and the Store exactly as the local backend records it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import optuna
import pytest

import proftune
from proftune.search import RayOptions
from proftune.track import Store

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="ray[tune] is not installed (pip install 'proftune[ray]')")

psutil = pytest.importorskip("psutil", reason="psutil comes with ray[tune]")


def _space(**params: Any) -> dict[str, Any]:
    return {"params": params}


def _listening(procs: list[Any]) -> list[tuple[str, str, int]]:
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            out += [(proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN]
    return out


def _pid() -> int:
    return os.getpid()


def test_local_instance_stays_on_loopback_without_dashboard(local_ray: Any) -> None:
    ray = local_ray
    # ray was imported before the instance started (as by a user's own code): still loopback
    assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    pid = ray.get(ray.remote(_pid).remote())  # a worker process of the instance
    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
    assert pid in {p.pid for p in procs}
    sockets = _listening(procs)
    assert sockets  # GCS, raylet, workers
    outward = [s for s in sockets if s[1] not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert outward == []
    # no dashboard: its head process serves no HTTP, and no UI on Ray's dashboard port
    dashboards = [p for p in procs if any("dashboard.py" in a for a in p.cmdline())]
    assert _listening(dashboards) == []
    assert all(port != 8265 for _, _, port in sockets)
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"


def test_local_instance_records_every_trial_like_the_local_backend(tmp_path: Path, local_ray: Any) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    space = {"params": {"hidden": {"type": "categorical", "choices": [32, 512]}},
             "fixed": {"lr": 3e-3}}
    # one worker: both trials on one Ray actor, one process's cold start (torch, the task's data:
    # ~7 s of CPU) instead of two; trials side by side are test_each_ray_trial_reaches_on_trial's
    res = proftune.search("digits-mlp", space, trials=2, epochs=1, db=db, study="ray-local",
                          sampler="grid", constraints=["params<20000"], device="cpu",
                          backend="ray", ray=RayOptions(workers=1, storage_path=tmp_path / "ray"))
    states = {t.params["hidden"]: t for t in res.trials}
    assert set(states) == {32, 512}
    small, big = states[32], states[512]
    assert small.state == "complete"
    assert small.metrics["accuracy"] > 0.2
    assert small.steps > 0
    # the profile gate ran inside the trainable: infeasible, with the measured reason, no training
    assert big.state == "infeasible"
    assert big.steps == 0
    assert "params=" in (big.reason or "")
    assert res.backend["backend"] == "ray"
    assert res.backend["trials_run"] == 2
    store = Store(db)
    runs = {r.id: r for r in store.list_runs(kind="trial")}
    assert {small.run_id, big.run_id} <= set(runs)
    assert all(runs[t.run_id].status == "finished" for t in res.trials if t.run_id)
    study = optuna.load_study(study_name="ray-local", storage=db)
    assert len(study.trials) == 2
    assert all("proftune" in t.user_attrs for t in study.trials)


def test_each_ray_trial_reaches_on_trial_as_it_ends(tmp_path: Path, local_ray: Any) -> None:
    """A live sink (W&B) beside a Ray search gets each trial while the others still run, not all
    of them when Ray returns."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    seen: list[tuple[int, int]] = []  # (trial Run, trial Runs not ended yet at that moment)

    def on_trial(record: Any) -> None:
        runs = Store(db).list_runs(kind="trial", summary=True)
        seen.append((record.id, 4 - sum(1 for r in runs if r.status != "running")))

    res = proftune.search("digits-mlp", {"params": {"lr": {"type": "float", "low": 1e-3, "high": 1e-2}}},
                          trials=4, epochs=1, db=db, study="ray-live", device="cpu", backend="ray",
                          on_trial=on_trial, ray=RayOptions(workers=2, storage_path=tmp_path / "ray"))
    assert sorted(i for i, _ in seen) == sorted(t.run_id for t in res.trials)  # each trial once
    assert seen[0][1] > 0, seen  # the first came while trials were still to end


RELATIVE_TASK = """
from proftune.examples._wine import WineMLP

class Mine(WineMLP):
    name = "mine"
"""


def test_a_relative_task_file_trains_on_every_ray_trial(tmp_path: Path, local_ray: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """As the README names tasks; each Ray trial runs in a working directory of its own."""
    from typer.testing import CliRunner

    from proftune.cli import app

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "my_task.py").write_text(RELATIVE_TASK)
    (tmp_path / "s.yaml").write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["tune", "tasks/my_task.py:Mine", "--space", "s.yaml", "--backend", "ray",
                                   "--trials", "2", "--epochs", "1", "--sampler", "grid", "--device", "cpu",
                                   "--db", f"sqlite:///{tmp_path / 'p.db'}", "--study", "relative", "--json"])
    assert res.exit_code == 0, res.stderr[-3000:]
    d = json.loads(res.stdout)
    assert d["backend"]["backend"] == "ray"
    assert d["counts"]["complete"] == 2, [(t["state"], t["reason"]) for t in d["trials"]]
    assert sorted(t["params"]["hidden"] for t in d["trials"]) == [8, 16]


def test_asha_records_a_trial_that_ran_every_epoch_as_complete(tmp_path: Path, local_ray: Any) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    space = _space(lr={"type": "categorical", "choices": [1e-2, 3e-3, 1e-4]})
    res = proftune.search("digits-mlp", space, trials=3, epochs=2, db=db, study="asha", sampler="grid",
                          device="cpu", backend="ray",
                          ray=RayOptions(workers=1, scheduler="asha", storage_path=tmp_path / "ray"))
    per_epoch = proftune.fit("digits-mlp", {"lr": 1e-2}, epochs=1, device="cpu").steps
    done = [t for t in res.trials if t.state == "complete"]
    # the first trial has nobody to lose to at its rungs: it runs both epochs and is complete
    assert done, [(t.state, t.reason) for t in res.trials]
    assert all(t.steps == 2 * per_epoch for t in done)
    assert all("accuracy" in t.metrics for t in done)
    study = optuna.load_study(study_name="asha", storage=db)
    states = sorted(t.state.name for t in study.trials)
    assert "COMPLETE" in states
    # a trial that trained every epoch is complete (ASHA does not cut it at its top rung); one
    # that ASHA stopped at its first rung is pruned, with the scheduler named as the reason
    schedule = res.backend["schedule"]
    for t in res.trials:
        epochs_reported = {p["epoch"] for p in schedule.get(str(t.number), [])}
        assert (t.state == "complete") == (epochs_reported == {1, 2}), (t.state, t.reason, epochs_reported)
        if t.state == "pruned":
            assert "asha" in (t.reason or "")


def test_scheduler_problems_name_ray_options_and_read_as_flags_in_tune(tmp_path: Path) -> None:
    """RayOptions' ``scheduler=`` in the library, tune's ``--scheduler`` on the command line; both
    refused before Ray starts (PBT with nothing to perturb, ASHA with two objectives)."""
    from typer.testing import CliRunner

    from proftune.cli import app
    from proftune.exceptions import ConfigError
    from proftune.search import Objective, Space
    from proftune.search._ray import _scheduler
    from proftune.search._settings import SearchSettings

    space = Space.from_dict(_space(hidden={"type": "int", "low": 4, "high": 16}))
    settings = SearchSettings(task="wine-mlp", space=space, objectives=[Objective("accuracy", "maximize")],
                              constraints=[], trials=1, study="s", db="")
    with pytest.raises(ConfigError, match=r"^scheduler='pbt' perturbs lr, weight_decay, momentum or dropout"):
        _scheduler(settings, RayOptions(scheduler="pbt"))
    file = tmp_path / "space.yaml"
    file.write_text("params:\n  hidden: {type: int, low: 4, high: 16}\n")
    result = CliRunner().invoke(app, ["tune", "wine-mlp", "--space", str(file), "--backend", "ray",
                                      "--scheduler", "asha", "--objective", "accuracy", "--objective", "val_loss",
                                      "--db", f"sqlite:///{tmp_path / 'p.db'}"])
    assert result.exit_code == 2, result.output
    assert ("--scheduler 'asha' needs one objective, but --objective has 2; use --scheduler 'fifo' for a "
            "Pareto front.") in result.stderr, result.stderr


def test_the_drivers_records_keep_the_keys_a_study_held(tmp_path: Path) -> None:
    """A worker's record crosses to the driver as JSON whole, the driver adding its Run and retries;
    a trial whose worker sent none (failed after its retries, stopped by the scheduler) is recorded
    by the driver without the keys of a run trial (stage, repeat, seed, duration_s)."""
    from proftune._jsonsafe import json_dumps
    from proftune.search import Objective, Space
    from proftune.search._ray import _Recorder
    from proftune.search._records import TrialFigures
    from proftune.search._settings import SearchSettings

    db = f"sqlite:///{tmp_path / 'p.db'}"
    settings = SearchSettings(task="wine-mlp", space=Space.from_dict(_space(lr={"type": "float", "low": 0.01,
                                                                                 "high": 0.1})),
                              objectives=[Objective("accuracy", "maximize")], constraints=[], trials=3,
                              study="s", db=db)
    store = Store(db)
    recorder = _Recorder(settings, store, "asha")
    for number, trial_id in enumerate("abc"):
        recorder.started(trial_id, number, {"lr": 0.05})
    recorder.retries["a"] = 2
    recorder.schedule["b"] = [{"epoch": 1, "objective": 0.4}]

    state, values, failed = recorder.finished("a", None, True)
    assert (state, values) == ("failed", None)
    assert failed.to_dict() == {"params": {}, "metrics": {}, "constraints": {},
                                "reason": "the Ray worker running the trial failed after its retries",
                                "steps": 0, "train_s": 0.0, "gate_s": 0.0, "anomalies": [],
                                "run_id": recorder.runs["a"], "state": "failed", "ray_retries": 2}
    state, values, stopped = recorder.finished("b", {"objective": 0.4, "epoch": 1}, False)
    assert (state, values) == ("pruned", None)
    assert stopped.to_dict()["metrics"] == {"objective": 0.4}
    assert stopped.to_dict()["schedule"] == [{"epoch": 1, "objective": 0.4}]
    assert not {"stage", "repeat", "seed", "duration_s", "sampler"} & set(stopped.to_dict())

    worker = TrialFigures(params={"lr": 0.05}, metrics={"accuracy": 0.9}, steps=3, seed=4,
                          curve=[{"epoch": 1, "accuracy": 0.9}], state="complete", duration_s=1.5)
    told = {"constraints_raw": {"c": 0.0}, "user_attrs_raw": {"proftune_gated": True}}
    state, values, got = recorder.finished("c", {"proftune_record": json_dumps({**worker.to_dict(), **told}),
                                                 "objective_0": 0.9}, False)
    assert (state, values) == ("complete", [0.9])
    assert got.to_dict() == {**worker.to_dict(), "run_id": recorder.runs["c"], "ray_retries": 0}
    assert list(got.to_dict())[:13] == ["params", "metrics", "constraints", "reason", "steps", "train_s", "gate_s",
                                        "anomalies", "stage", "run_id", "repeat", "seed", "curve"]
    assert (got.constraints_raw, got.user_attrs_raw) == (told["constraints_raw"], told["user_attrs_raw"])
    runs = {r.id: r for r in store.list_runs(kind="trial")}
    assert runs[recorder.runs["a"]].status == "failed"
    assert runs[recorder.runs["c"]].result["steps"] == 3
