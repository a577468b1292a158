"""The store under concurrent writers and readers: nothing lost, the database intact.

Writers (each its own process): ``tune`` (``proftune.search`` of wine-mlp, ``--workers W``) and
``train`` loops (``proftune.run_train``, a fresh Store per run as every command opens one).
Readers (each its own process, in a loop): a plain ``sqlite3`` connection counting trials (SQLite
only), ``Store.list_runs`` (what ``runs list`` calls), Optuna's RDB storage reading every study's
trials (what optuna-dashboard reads). Each writer reports every run and trial it finished as it
goes; afterwards ``PRAGMA integrity_check`` must say ``ok`` and each of them must be in the store.

On main before the fix the tune died with ``disk I/O error`` and the trials were gone; with the
Store's plain ``open()``/``close()`` put back, ``--tune-workers 1`` dies within seconds
(``UnboundLocalError: ... 'updated_state'``, Optuna's write failing under it).
``tests/track/test_store_torture.py`` runs a bounded variant (counts of trials and runs, not time).

    python benchmarks/store_torture.py [--seconds 60] [--tune-workers 2] [--trainers 1] [--readers 3]
                                       [--db URL]  # default: a SQLite file in a temp folder
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SPACE = ("params:\n  hidden: {type: categorical, choices: [8, 16, 32]}\n"
         "  lr: {type: float, low: 0.0001, high: 0.1, log: true}\n")


def _report(out: str, **fields: Any) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(fields) + "\n")


def role_tune(url: str, seconds: float, out: str, workers: int, study: str, folder: str,
              trials: int = 100000) -> None:
    """``proftune tune`` as a user runs it in a terminal (its table, not ``--json``: the issue's case)."""
    space = Path(folder) / f"{study}.yaml"
    space.write_text(SPACE)
    cmd = [sys.executable, "-m", "proftune.cli", "tune", "wine-mlp", "--space", str(space), "--trials", str(trials),
           "--timeout", str(seconds), "--epochs", "1", "--sampler", "random", "--workers", str(workers),
           "--study", study, "--db", url]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-2000:])
        sys.exit(proc.returncode)
    said = [line.strip() for line in proc.stdout.splitlines() if line.startswith(("trials:", "stopped"))]
    _report(out, role="tune", study=study, said=said)


def role_train(url: str, seconds: float, out: str, runs: int | None = None) -> None:
    """``train`` runs one after another (``runs`` of them, or until ``seconds`` have passed)."""
    import proftune

    end, done = time.time() + seconds, 0
    while time.time() < end and (runs is None or done < runs):
        r = proftune.run_train("wine-mlp", max_steps=2, device="cpu", store=url)
        _report(out, role="train", run_id=r.run_id)
        done += 1


def role_read(url: str, seconds: float, out: str, how: str, stop: str | None = None) -> None:
    """Read in a loop until the writers are done (``stop`` exists), or ``seconds`` have passed."""
    end, reads = time.time() + seconds, 0
    errors: list[str] = []
    while time.time() < end and not (stop and os.path.exists(stop) and reads):
        try:
            if how == "sqlite3":
                import sqlite3

                import sqlalchemy as sa

                conn = sqlite3.connect(sa.make_url(url).database)
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                with_trials = conn.execute("SELECT count(*) FROM sqlite_master WHERE name='trials'").fetchone()
                if with_trials[0]:
                    conn.execute("SELECT count(*) FROM trials").fetchone()
                conn.close()
                time.sleep(0.05)
            elif how == "runs":
                from proftune.track import Store

                Store(url).list_runs(summary=True, limit=50)
                time.sleep(0.1)
            elif how == "optuna":
                import optuna

                storage = optuna.storages.RDBStorage(url)
                for s in storage.get_all_studies():
                    storage.get_all_trials(s._study_id, deepcopy=False)
                storage.engine.dispose()
                time.sleep(0.2)
            reads += 1
        except Exception as exc:  # noqa: BLE001 -- a reader counts whatever fails it, and says so
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            time.sleep(0.2)
    _report(out, role=f"read-{how}", reads=reads, errors=errors[:5], n_errors=len(errors))


def _check(url: str, reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Integrity and what is missing: every reported run finished, every reported trial complete."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    integrity = "server"
    lost: list[str] = []
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            integrity = "; ".join(r[0] for r in conn.execute(sa.text("PRAGMA integrity_check")))[:300]
        runs = {int(i): s for i, s in conn.execute(sa.text("SELECT id, status FROM proftune_runs"))}
        trials = 0
        for rep in reports:
            if rep["role"] == "train" and runs.get(rep["run_id"]) != "finished":
                lost.append(f"train run {rep['run_id']}: {runs.get(rep['run_id'])}")
            if rep["role"] == "tune":  # the tune Run's own tally of complete trials against the study's
                row = conn.execute(sa.text("SELECT status, result FROM proftune_runs WHERE kind = 'tune' "
                                           "AND study = :s"), {"s": rep["study"]}).first()
                if row is None or row[0] != "finished":
                    lost.append(f"tune run of {rep['study']}: {row[0] if row else 'missing'}")
                    continue
                claimed = conn.execute(sa.text("SELECT count(*) FROM proftune_runs WHERE kind = 'trial' "
                                               "AND study = :s AND status = 'finished'"),
                                       {"s": rep["study"]}).scalar_one()
                stored = conn.execute(sa.text(
                    "SELECT count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                    "WHERE s.study_name = :s AND t.state IN ('COMPLETE', 'PRUNED', 'FAIL')"),
                    {"s": rep["study"]}).scalar_one()
                trial_runs = claimed
                trials += claimed
                if stored < trial_runs:
                    lost.append(f"{rep['study']}: {claimed} finished trial runs, {stored} ended "
                                f"trials in the study")
    engine.dispose()
    return {"integrity": integrity, "lost": lost, "trials": trials,
            "runs": sum(r["role"] == "train" for r in reports)}


def torture(url: str, *, seconds: float, tune_workers: int = 1, trainers: int = 1,
            readers: tuple[str, ...] = ("sqlite3", "runs", "optuna"), tunes: int = 1,
            trials: int | None = None, train_runs: int | None = None) -> dict[str, Any]:
    """Run the writers on ``url`` for ``seconds`` (or until each tune has ``trials`` trials and
    each train loop ``train_runs`` runs, ``seconds`` then a cap) and the readers until the writers
    are done; what each did and what was lost."""
    folder = tempfile.mkdtemp(prefix="proftune-torture-")
    out = str(Path(folder) / "reports.jsonl")
    stop = str(Path(folder) / "writers-done")
    Path(out).touch()
    script = str(Path(__file__).resolve())
    if url.startswith("sqlite"):
        readers = tuple(readers)
    else:
        readers = tuple(r for r in readers if r != "sqlite3")
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    started = time.time()
    for i in range(tunes):
        procs.append(("tune", subprocess.Popen([sys.executable, script, "--role", "tune", "--db", url,
                                                "--seconds", str(seconds), "--out", out,
                                                "--tune-workers", str(tune_workers), "--study", f"torture-{i}",
                                                "--folder", folder, "--trials", str(trials or 100000)],
                                               stderr=subprocess.PIPE)))
    for _ in range(trainers):
        procs.append(("train", subprocess.Popen([sys.executable, script, "--role", "train", "--db", url,
                                                 "--seconds", str(seconds), "--out", out,
                                                 *(["--runs", str(train_runs)] if train_runs else [])],
                                                stderr=subprocess.PIPE)))
    writers = len(procs)
    for how in readers:  # until the writers are done, at most a while after their time is up
        procs.append((f"read-{how}", subprocess.Popen([sys.executable, script, "--role", f"read-{how}",
                                                        "--db", url, "--seconds", str(seconds + 300), "--out", out,
                                                        "--stop", stop], stderr=subprocess.PIPE)))
    failed = []
    for i, (name, p) in enumerate(procs):
        _, err = p.communicate(timeout=seconds + 300)
        if p.returncode != 0:
            failed.append(f"{name} exit {p.returncode}: {err.decode(errors='replace').strip()[-400:]}")
        if i == writers - 1:
            Path(stop).touch()
    elapsed = time.time() - started
    reports = [json.loads(line) for line in Path(out).read_text().splitlines() if line.strip()]
    result: dict[str, Any] = {"writers": tunes * tune_workers + trainers, "readers": len(readers),
                              "seconds": round(elapsed, 1), "failed": failed, "reports": reports}
    try:
        result.update(_check(url, reports))
    except Exception as exc:  # noqa: BLE001 -- the database cannot be read at all: that is the figure
        result.update({"integrity": f"{type(exc).__name__}: {exc}"[:300], "lost": ["everything"], "trials": 0})
    if not any(r["role"] == "tune" for r in reports):
        result["lost"].append("the tune reported nothing (it died)")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--tune-workers", type=int, default=2)
    ap.add_argument("--trainers", type=int, default=1)
    ap.add_argument("--readers", default="sqlite3,runs,optuna")
    ap.add_argument("--db", default=None)
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--study", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trials", type=int, default=100000, help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stop", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "tune":
        return role_tune(a.db, a.seconds, a.out, a.tune_workers, a.study, a.folder, a.trials)
    if a.role == "train":
        return role_train(a.db, a.seconds, a.out, a.runs)
    if a.role and a.role.startswith("read-"):
        return role_read(a.db, a.seconds, a.out, a.role[len("read-"):], a.stop)
    url = a.db or f"sqlite:///{Path(tempfile.mkdtemp(prefix='proftune-torture-db-')) / 'store.db'}"
    r = torture(url, seconds=a.seconds, tune_workers=a.tune_workers, trainers=a.trainers,
                readers=tuple(x for x in a.readers.split(",") if x))
    reads = {x["role"]: (x["reads"], x["n_errors"]) for x in r["reports"] if x["role"].startswith("read-")}
    print(f"backend    {url.split(':', 1)[0]}")
    print(f"writers    {r['writers']}  (tune workers {a.tune_workers}, train loops {a.trainers})")
    print(f"readers    {r['readers']}  reads/errors {reads}")
    print(f"trials     {r['trials']} complete reported, train runs {r.get('runs', 0)}")
    for x in r["reports"]:
        if x["role"] == "tune":
            print(f"tune said  {' | '.join(x.get('said') or [])}")
    print(f"seconds    {r['seconds']}")
    print(f"integrity  {r['integrity']}")
    print(f"lost       {len(r['lost'])} {r['lost'][:5]}")
    for f in r["failed"]:
        print(f"FAILED     {f}")
    sys.exit(0 if not r["lost"] and not r["failed"] and r["integrity"] in ("ok", "server") else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
