"""The Ray backend on a local instance: loopback only, records, ASHA, PBT recovery.

The two-node cluster that loses a node is in ``test_ray_cluster.py``.

Every trial must land in the study and the Store exactly as the local backend records it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
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


def test_pbt_ladder_and_population_start_at_the_users_setting() -> None:
    from proftune.search import Space
    from proftune.search._ray import _ladder, _population_space

    space = Space.from_dict({"params": {
        "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True, "default": 0.1},
        "dropout": {"type": "float", "low": 0.0, "high": 0.4, "default": 0.1},
        "hidden": {"type": "int", "low": 32, "high": 256, "step": 32}}})
    lr, dropout = space.params[0], space.params[1]
    # half-decade rungs down from the start, inside the declared range
    assert _ladder(lr) == pytest.approx([1e-4, 10**-3.5, 1e-3, 10**-2.5, 1e-2, 10**-1.5, 0.1])
    assert _ladder(dropout) == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4])
    pop = _population_space(space, 4)
    spec = type("Spec", (), {})()
    values = []
    for member in range(4):
        spec.config = {"pbt_member": member}
        values.append((pop["lr"].func(spec), pop["dropout"].func(spec)))
    # member 0 at the user's setting, the others on the nearest rungs around it
    assert values[0] == (0.1, 0.1)
    assert [v[0] for v in values[1:]] == pytest.approx([10**-1.5, 1e-2, 10**-2.5])
    assert [v[1] for v in values[1:]] == pytest.approx([0.05, 0.15, 0.0])


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """One local Ray instance, started as ``proftune tune --backend ray`` starts it, for this module.

    The searches below join it (Ray starts once for all of them); it stops after the module.
    """
    from proftune.search._ray import _ray_session

    with _ray_session(RayOptions(workers=2)) as ray:
        yield ray


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
    res = proftune.search("digits-mlp", space, trials=2, epochs=1, db=db, study="ray-local",
                          sampler="grid", constraints=["params<20000"], device="cpu",
                          backend="ray", ray=RayOptions(workers=2, storage_path=tmp_path / "ray"))
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


def test_pbt_recovers_from_a_harmful_learning_rate(tmp_path: Path, local_ray: Any) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    epochs = 4
    # AdamW on digits-mlp: tuned lr 1e-2; the user's setting is 10x too high, 0.1
    space = _space(lr={"type": "float", "low": 1e-4, "high": 0.1, "log": True, "default": 0.1})
    res = proftune.search("digits-mlp", space, trials=4, epochs=epochs, db=db, study="pbt", device="cpu",
                          backend="ray", ray=RayOptions(workers=2, scheduler="pbt", population=4,
                                                        storage_path=tmp_path / "ray"))
    tuned = proftune.fit("digits-mlp", {"lr": 1e-2}, epochs=epochs, device="cpu")
    harmful = proftune.fit("digits-mlp", {"lr": 0.1}, epochs=epochs, device="cpu")
    assert harmful.metrics["accuracy"] < tuned.metrics["accuracy"] - 0.03  # the start does harm
    assert res.best is not None
    assert res.best.metrics["accuracy"] >= tuned.metrics["accuracy"] - 0.01
    # every member trained exactly `epochs` epochs (a restored member does not train one more)
    assert len(res.trials) == 4
    assert [t.steps for t in res.trials] == [tuned.steps] * 4
    # each member's schedule is recorded, one point per epoch
    schedule = res.backend["schedule"]
    assert len(schedule) == 4
    assert all(sorted({p["epoch"] for p in pts}) == list(range(1, epochs + 1)) for pts in schedule.values())
    # the member that started at the user's harmful setting was rescued by exploiting a better one
    started_harmful = [k for k, pts in schedule.items() if pts[0]["epoch"] == 1 and pts[0]["lr"] == 0.1]
    assert len(started_harmful) == 1
    rescued = next(t for t in res.trials if str(t.number) == started_harmful[0])
    assert rescued.metrics["accuracy"] >= harmful.metrics["accuracy"] + 0.03
