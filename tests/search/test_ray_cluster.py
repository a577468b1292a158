"""The Ray backend on a two-node cluster on 127.0.0.1 that loses its worker node mid-trial.

The fixture starts a head and a worker node with ``ray start`` (one CPU each, no dashboard, no
usage stats, every address on loopback) in a temp folder of its own, and stops exactly the
processes it started (never ``ray stop``, which would stop every Ray cluster on the machine).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import proftune
from proftune.search import RayOptions
from proftune.track import Store

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="ray[tune] is not installed (pip install 'proftune[ray]')")
psutil = pytest.importorskip("psutil", reason="psutil comes with ray[tune]")

HERE = Path(__file__).parent
#: GCS notices a dead node within ~5 s instead of Ray's default ~30 s, and a live node on a busy
#: machine is not taken for dead (a raylet would have to miss five checks in a row).
FAST_NODE_DEATH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                   "health_check_timeout_ms": 1000, "health_check_failure_threshold": 5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_start(*args: str) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    for key in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, str(HERE / "ray_loopback.py"), "start", *args],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _ours(folder: str) -> list[Any]:
    """Every process of the cluster in ``folder``: those naming it, and all their children."""
    found: dict[int, Any] = {}
    for proc in psutil.process_iter(["cmdline"]):
        if any(folder in arg for arg in proc.info["cmdline"] or ()):
            found[proc.pid] = proc
            with contextlib.suppress(psutil.Error):
                found.update({c.pid: c for c in proc.children(recursive=True)})
    found.pop(os.getpid(), None)
    return list(found.values())


def _raylets(folder: str) -> set[int]:
    return {p.pid for p in _ours(folder) if p.name() == "raylet"}


def _stop(folder: str) -> None:
    procs = _ours(folder)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=3)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)


@pytest.fixture
def two_nodes() -> Iterator[tuple[str, int, str]]:
    """A head and a worker node on 127.0.0.1, one CPU each; yields (address, worker raylet, folder)."""
    folder = tempfile.mkdtemp(prefix="ptray-", dir="/tmp")  # short: Ray's socket paths must fit
    port = _free_port()
    try:
        _ray_start("--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                   "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--temp-dir={folder}",
                   f"--system-config={json.dumps(FAST_NODE_DEATH)}")
        head = _raylets(folder)
        _ray_start(f"--address=127.0.0.1:{port}", "--num-cpus=1", "--node-ip-address=127.0.0.1",
                   "--disable-usage-stats", f"--temp-dir={folder}")
        worker = _raylets(folder) - head
        assert len(head) == 1
        assert len(worker) == 1
        yield f"127.0.0.1:{port}", worker.pop(), folder
    finally:
        _stop(folder)
        shutil.rmtree(folder, ignore_errors=True)
    assert _ours(folder) == []


# Each trial marks that it trains, then waits for the test's "release": both trials are known to
# be mid-trial, one on each node, when the worker node is killed.
BLOCKING_TASK = '''
import os, time, uuid
from pathlib import Path
from proftune.examples._digits import DigitsMLP

MARKS = Path({marks!r})
DRIVER = {driver}  # the driver reads the data too (its fingerprint): it neither marks nor waits

class BlockingDigits(DigitsMLP):
    name = "blocking-digits"
    def train_data(self, batch_size, params):
        if os.getpid() == DRIVER:
            return super().train_data(batch_size, params)
        (MARKS / f"training-{{os.getpid()}}-{{uuid.uuid4().hex}}").touch()
        deadline = time.monotonic() + 600  # a guard only: the test always releases
        while not (MARKS / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return super().train_data(batch_size, params)
'''


def _marked_pids(marks: Path) -> set[int]:
    return {int(m.name.split("-")[1]) for m in marks.glob("training-*")}


def _kill_node(raylet: int) -> list[int]:
    """SIGKILL a node as a machine loss would end it: its raylet and every process under it."""
    node = psutil.Process(raylet)
    procs = [*node.children(recursive=True), node]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=30)
    return [p.pid for p in procs]


def test_two_node_cluster_retries_a_trial_whose_node_died(tmp_path: Path,
                                                          two_nodes: tuple[str, int, str]) -> None:
    address, worker_raylet, folder = two_nodes
    marks = tmp_path / "marks"
    marks.mkdir()
    task = tmp_path / "blocking_task.py"
    task.write_text(BLOCKING_TASK.format(marks=str(marks), driver=os.getpid()))
    db = f"sqlite:///{tmp_path / 'p.db'}"
    lost: dict[str, Any] = {}

    def kill_the_worker_node_mid_trial() -> None:
        # wait on the trials' own marks: both trials hold in train_data, one on each node
        deadline = time.monotonic() + 600  # a guard only: both trials mark within a worker's start
        while time.monotonic() < deadline and len(_marked_pids(marks)) < 2:
            time.sleep(0.05)
        training = _marked_pids(marks)
        on_worker = {c.pid for c in psutil.Process(worker_raylet).children(recursive=True)} & training
        lost.update(training=training, on_worker=on_worker)
        if len(training) == 2 and len(on_worker) == 1:
            lost["killed"] = _kill_node(worker_raylet)
            lost["trial_alive"] = psutil.pid_exists(next(iter(on_worker)))
        (marks / "release").touch()

    killer = threading.Thread(target=kill_the_worker_node_mid_trial, daemon=True)
    killer.start()
    space = {"params": {"lr": {"type": "categorical", "choices": [3e-3, 1e-2]}}}
    try:
        res = proftune.search(str(task), space, trials=2, epochs=1, db=db, study="two-nodes",
                              sampler="grid", device="cpu", backend="ray",
                              ray=RayOptions(address=address, workers=2, storage_path=tmp_path / "ray"))
    finally:
        (marks / "release").touch()
        killer.join(30)
    # the fault happened: two trials training, one of them on the worker node, which was killed
    # with that trial's process before the trials were let go on
    assert len(lost["training"]) == 2, lost
    assert len(lost["on_worker"]) == 1, lost
    assert worker_raylet in lost["killed"]
    assert lost["trial_alive"] is False
    assert worker_raylet not in _raylets(folder)
    # the trial on the dead node ran again on the head; nothing finished was lost
    assert res.backend["retries"] >= 1
    assert res.counts()["complete"] == 2, [(t.state, t.reason) for t in res.trials]
    assert sorted(t.params["lr"] for t in res.trials) == [3e-3, 1e-2]
    assert all(t.metrics["accuracy"] > 0.5 for t in res.trials)


# The second trial to train waits for the test's "release": the driver is killed while it waits.
HOLDING_TASK = '''
import os, time, uuid
from pathlib import Path
from proftune.examples._digits import DigitsMLP

MARKS = Path({marks!r})

class HoldingDigits(DigitsMLP):
    name = "holding-digits"
    def train_data(self, batch_size, params):
        if os.environ.get("PROFTUNE_TEST_DRIVER") == str(os.getpid()):  # the driver's own read
            return super().train_data(batch_size, params)
        (MARKS / f"training-{{time.time_ns()}}-{{uuid.uuid4().hex}}").touch()
        deadline = time.monotonic() + 120
        while (len(list(MARKS.glob("training-*"))) >= 2 and not (MARKS / "release").exists()
               and time.monotonic() < deadline):
            time.sleep(0.05)
        return super().train_data(batch_size, params)
'''

DRIVER = '''
import json, os, sys
os.environ["PROFTUNE_TEST_DRIVER"] = str(os.getpid())
import proftune
from proftune.search import RayOptions
space = {{"params": {{"lr": {{"type": "categorical", "choices": [3e-3, 1e-2]}}}}}}
res = proftune.search({task!r}, space, trials=2, epochs=1, db={db!r}, study="resume", sampler="grid",
                      device="cpu", backend="ray", ray=RayOptions(workers=1, storage_path={ray!r}))
print(json.dumps({{"backend": res.backend, "states": [t.state for t in res.trials],
                  "lrs": [t.params["lr"] for t in res.trials]}}))
'''


@pytest.mark.slow  # two drivers, two Ray instances: about a minute on 2 cores
def test_a_killed_driver_resumes_its_experiment(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    task = tmp_path / "holding_task.py"
    task.write_text(HOLDING_TASK.format(marks=str(marks)))
    db = f"sqlite:///{tmp_path / 'p.db'}"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(task=str(task), db=db, ray=str(tmp_path / "ray")))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    first = subprocess.Popen([sys.executable, str(script)], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(list(marks.glob("training-*"))) < 2:
            assert first.poll() is None
            time.sleep(0.2)
        assert len(list(marks.glob("training-*"))) == 2  # the first trial done, the second training
    finally:  # the driver and the Ray instance it started, all at once
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    finished = [r for r in Store(db).list_runs(kind="trial") if r.status == "finished"]
    assert len(finished) == 1
    (marks / "release").touch()
    second = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    out = json.loads(second.stdout.strip().splitlines()[-1])
    assert out["backend"]["resumed"] is True
    # the trial in flight when the driver died is failed and its params trained again
    assert sorted(out["states"]) == ["complete", "complete", "failed"]
    assert sorted(out["lrs"]) == [3e-3, 3e-3, 1e-2]
    # the trial finished before the kill keeps its record (Ray may train it again: it saves its
    # experiment state every few seconds, and the driver can die in between)
    runs = {r.id: r for r in Store(db).list_runs(kind="trial")}
    assert runs[finished[0].id].status == "finished"
    assert runs[finished[0].id].metrics == finished[0].metrics


PBT_DRIVER = '''
import json
import proftune
from proftune.search import RayOptions
space = {{"params": {{"lr": {{"type": "float", "low": 1e-4, "high": 0.1, "log": True, "default": 0.01}}}},
          "fixed": {{"optimizer": "sgd"}}}}
res = proftune.search("digits-mlp", space, trials=4, epochs=4, db={db!r}, study="pbt", device="cpu",
                      backend="ray", ray=RayOptions(workers=2, scheduler="pbt", population=4, storage_path={ray!r}))
print(json.dumps({{"experiment": res.backend["experiment"], "states": [t.state for t in res.trials]}}))
'''


@pytest.mark.slow  # two drivers, two Ray instances: about two minutes on 2 cores
def test_a_killed_pbt_driver_starts_its_population_again(tmp_path: Path) -> None:
    """Restored, a PBT population waited forever on a member whose checkpoint records name
    checkpoints deleted after Ray's last save; the same command starts it again instead."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    script = tmp_path / "driver.py"
    script.write_text(PBT_DRIVER.format(db=db, ray=str(tmp_path / "ray")))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    rounds = tmp_path / "ray" / "pbt" / "pbt_global.txt"  # Ray's log of PBT's exploits, one line each
    first = subprocess.Popen([sys.executable, str(script)], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300  # a guard only
        while time.monotonic() < deadline and (not rounds.exists() or len(rounds.read_text().splitlines()) < 4):
            assert first.poll() is None
            time.sleep(0.2)
        assert len(rounds.read_text().splitlines()) >= 4  # two rounds done, the population mid-run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    second = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                            timeout=400, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    out = json.loads(second.stdout.strip().splitlines()[-1])
    assert out["experiment"] == str((tmp_path / "ray" / "pbt-2").resolve())
    assert out["states"] == ["complete"] * 4
