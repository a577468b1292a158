"""--workers N: processes sharing one study, on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest

import proftune
from proftune import Store
from proftune.track import RunRecord

SPACE = {"params": {"hidden": {"type": "int", "low": 4, "high": 32},
                    "lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}}


def _check_shared(result: proftune.SearchResult, db: str, study: str, trials: int) -> None:
    runs = Store(db).list_runs(kind="trial", study=study)
    assert len(runs) == trials
    assert result.counts()["complete"] == trials
    assert len({r.pid for r in runs}) == 2  # both worker processes ran trials of the one study
    loaded = optuna.load_study(study_name=study, storage=db)
    # a worker that lost the race for the last slot drops its trial before running it
    kept = [t for t in loaded.trials if not t.user_attrs.get("proftune_surplus")]
    assert len(kept) == trials
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in kept)
    assert {r.result["trial"] for r in runs} == {t.number for t in kept}


def test_two_workers_share_a_sqlite_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """...and ``on_trial`` is called here, in the parent, once per trial as the workers end them."""
    # a look every 20 ms, not every second: these trials take a fraction of a second each
    monkeypatch.setattr("proftune.search._backends.POLL_S", 0.02)
    db = f"sqlite:///{tmp_path / 'p.db'}"
    calls: list[tuple[int, int, str, int, str]] = []  # (pid, trial run, its status, trials ended, tune status)

    def on_trial(record: RunRecord) -> None:
        st = Store(db)
        ended = sum(1 for r in st.list_runs(kind="trial") if r.status != "running")
        calls.append((os.getpid(), record.id, record.status, ended, st.list_runs(kind="tune")[0].status))

    result = proftune.search("wine-mlp", SPACE, trials=6, epochs=2, sampler="random", workers=2,
                             study="w", db=db, on_trial=on_trial)
    _check_shared(result, db, "w", 6)
    trials = Store(db).list_runs(kind="trial", study="w")
    assert sorted(c[1] for c in calls) == sorted(r.id for r in trials)  # each once
    assert {(c[0], c[2], c[4]) for c in calls} == {(os.getpid(), "finished", "running")}
    assert calls[0][3] < len(trials)  # the first handed over while trials were still to end


def test_two_workers_share_a_postgresql_study(postgres_url: str) -> None:
    result = proftune.search("wine-mlp", SPACE, trials=6, epochs=2, sampler="random", workers=2,
                             study="pg-shared", db=postgres_url)
    assert result.db.startswith("postgresql")
    _check_shared(result, postgres_url, "pg-shared", 6)


def test_workers_beyond_memory_or_cores_are_refused_with_the_figures() -> None:
    """Bounds from the machine (issue 47): the memory figure injected, the cores as given."""
    from proftune._machine import worker_bound

    gib = 1 << 30
    assert worker_bound(4, rss=400 << 20, available=6 * gib, n_cores=2) is None
    why = worker_bound(512, rss=400 << 20, available=6 * gib, n_cores=2)
    assert why is not None
    assert "512 workers need ~200 GiB" in why
    assert "6 GiB is available" in why
    assert "at most 15 fit" in why
    assert "valid: 1 to 8 (4 per core)" in why  # one range in every refusal: the smaller bound
    assert worker_bound(8, rss=400 << 20, available=6 * gib, n_cores=2) is None
    cores = worker_bound(9, rss=None, available=None, n_cores=2)  # memory unknown: the cores still bound
    assert cores is not None
    assert "valid: 1 to 8 (4 per core)" in cores


def test_the_memory_bound_reads_cgroup_v1_and_v2(tmp_path: Path) -> None:
    from proftune._machine import available_memory_bytes

    gib = 1 << 30
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text(f"MemAvailable: {60 * gib // 1024} kB\n")
    v1 = tmp_path / "sys" / "fs" / "cgroup" / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{4 * gib}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{gib}\n")
    (tmp_path / "proc" / "self" / "cgroup").write_text("12:cpu,cpuacct:/job\n11:memory:/job\n0::/\n")
    assert available_memory_bytes(root=str(tmp_path)) == 3 * gib  # before: 60 GiB, the v1 limit unread
    v2 = tmp_path / "sys" / "fs" / "cgroup" / "user.slice"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text(f"{2 * gib}\n")
    (v2 / "memory.current").write_text(f"{gib}\n")
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/user.slice\n")
    assert available_memory_bytes(root=str(tmp_path)) == gib


def test_tune_refuses_more_workers_than_this_machine_holds_before_any_trial(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from proftune.cli import app

    space = tmp_path / "s.yaml"
    space.write_text("params:\n  hidden: {type: int, low: 4, high: 32}\n")
    db = tmp_path / "t.db"
    result = CliRunner().invoke(app, ["tune", "wine-mlp", "--space", str(space), "--trials", "4", "--epochs", "1",
                                      "--workers", "100000", "--db", f"sqlite:///{db}"])
    assert result.exit_code == 2, result.output
    assert "--workers 100000 does not fit this machine: 100000 workers need ~" in result.stderr
    assert "is available" in result.stderr
    assert "valid: 1 to" in result.stderr
    assert not db.exists() or not Store(f"sqlite:///{db}").list_runs(kind="trial")  # refused before any trial


def test_two_tunes_of_one_study_do_not_draw_the_same_configurations(tmp_path: Path) -> None:
    """Each tune of a study after the first gets its own sampler seed (issue 47: two tunes started
    at once on one study both began with the same configuration; a continuation redrew the first
    ones). The later tune counts the earlier one's Run, whatever their timing."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    first = proftune.search("wine-mlp", SPACE, trials=3, epochs=1, sampler="random", study="s", db=db)
    again = proftune.search("wine-mlp", SPACE, trials=6, epochs=1, sampler="random", study="s", db=db)
    drawn = [tuple(sorted(t.params.items())) for t in again.trials]
    assert len(drawn) == 6
    assert len(set(drawn)) == 6  # the continuation did not draw the first tune's configurations again
    assert {tuple(sorted(t.params.items())) for t in first.trials} <= set(drawn)


def test_a_trial_another_worker_told_first_leaves_the_search_to_go_on(tmp_path: Path) -> None:
    # SQLite cannot lock a queued trial for one worker: two workers may take the same one, and the one
    # that tells it second is refused ("Cannot tell a COMPLETE trial."); that worker goes on, the
    # other's result stands. Here the objective plays the other worker: it tells its own trial first.
    import warnings

    db = f"sqlite:///{tmp_path / 'p.db'}"
    calls: list[float] = []

    def loss(params: dict[str, float]) -> float:
        calls.append(float(params["x"]))
        if len(calls) == 2:
            other = optuna.load_study(study_name="s", storage=db)
            running = [t for t in other.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.RUNNING]
            other.tell(running[0].number, 0.25)
        return float(params["x"]) ** 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = proftune.search(loss, {"params": {"x": {"type": "float", "low": -1.0, "high": 1.0}}},
                              trials=4, store=db, study="s", sampler="random", seed=0)
    study = optuna.load_study(study_name="s", storage=db)
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) >= 4
    assert study.trials[1].values == [0.25]  # the other worker's result stands
    assert len(res.trials) >= 4
