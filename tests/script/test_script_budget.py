"""A budget on a script is the user's wall clock: from the command's start (its imports and the
reading of the script's flags count), with a run still going at its end cut (its process group
ended, its Run interrupted) and the stop reason saying so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from proftune.exceptions import ProftuneError
from proftune.script import ScriptCut, ScriptTask, load_script, optimize_script
from proftune.track import Store

#: A script as users write it: slow imports (a sleep standing in for torch), argparse flags, a
#: ``val_acc=`` line per epoch; each process writes its pid into PIDS so a test can see it ended.
#: A seed of SLOW_SEED or more (2: the race's later rounds) sleeps SLOW s an epoch; others 0.3 s.
SCRIPT = textwrap.dedent('''
    import os, pathlib, time
    time.sleep(IMPORT_S)  # a slow import (torch, transformers)
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    pathlib.Path(PIDS, str(os.getpid())).touch()
    acc = 0.1
    for epoch in range(args.epochs):
        time.sleep(SLOW if args.seed >= SLOW_SEED else 0.3)
        acc = min(1.0, acc + min(args.lr, 0.05) * 10 + 0.001 * args.seed)
        print(f"epoch {epoch} val_acc={acc:.4f}", flush=True)
    print(f"test_acc={acc:.4f}")
''')


def _script(tmp_path: Path, *, import_s: float, slow: float, slow_seed: int = 2) -> tuple[Path, Path]:
    pids = tmp_path / "pids"
    pids.mkdir()
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.replace("IMPORT_S", repr(import_s)).replace("PIDS", repr(str(pids)))
                    .replace("SLOW_SEED", repr(slow_seed)).replace("SLOW", repr(slow)))
    return path, pids


def _alive(pids: Path) -> list[int]:
    out = []
    for f in pids.iterdir():
        try:
            os.kill(int(f.name), 0)
        except ProcessLookupError:
            continue
        out.append(int(f.name))
    return out


def test_a_run_still_going_at_the_deadline_is_cut_and_its_process_ended(tmp_path: Path) -> None:
    path, pids = _script(tmp_path, import_s=0.0, slow=30.0)
    task = ScriptTask([sys.executable, str(path)], metrics=["val_acc"])
    task.deadline = time.monotonic() + 2.0
    t0 = time.monotonic()
    with pytest.raises(ScriptCut, match="cut at the budget's end"):
        task.call({"lr": 0.01}, seed=3)  # 30 s an epoch
    assert time.monotonic() - t0 < 2.0 + 1.0 + 1.5  # the deadline, the kill's grace, slack for a loaded machine
    assert task.runs[-1].cut
    assert task.runs[-1].interrupted == "the budget's end"
    assert list(pids.iterdir())
    assert not _alive(pids)
    with pytest.raises(ScriptCut, match="not started"):  # past the deadline, none starts
        task.call({"lr": 0.01}, seed=0)
    assert len(task.runs) == 1


def test_the_race_run_at_the_budgets_end_is_cut_and_said(tmp_path: Path, db_url: str) -> None:
    """The race's runs at --seed 2 take 30 s an epoch: the budget's end cuts the first, the second
    never starts, the loop ends within its budget and says why."""
    path, pids = _script(tmp_path, import_s=0.0, slow=30.0)
    budget = 12.0
    started = time.monotonic()
    task, space, obj = load_script([sys.executable, str(path)], objective="val_acc:max")
    d = optimize_script(task, space, obj, budget_s=budget, seed=0, db=db_url, started=started)
    took = time.monotonic() - started
    assert took <= budget + 1.0, d["stages"]
    assert d["duration_s"] <= budget
    assert d["stop_reason"].startswith("the budget's end"), d["stop_reason"]
    assert "the race-best run" in d["stop_reason"]
    assert d["vs_baseline"]["rounds"] == 2
    final = next(s for s in d["stages"] if s["stage"] == "final")
    assert "over 2 seeds, 1 of them with both runs" in final["did"], final["did"]  # judged on the one pair
    assert not _alive(pids)
    runs = Store(db_url).list_runs(kind="train")
    cut = [r for r in runs if r.status == "interrupted"]
    assert [r.config["role"] for r in cut] == ["race-best"]  # the defaults' run after it never started
    assert "cut at the budget's end" in (cut[0].error or "")
    assert not [r for r in Store(db_url).list_runs() if r.status == "running"]


def test_optimize_on_a_script_ends_within_its_budget_from_the_commands_start(tmp_path: Path) -> None:
    """The command's wall clock, its imports and the script's (1.5 s, read once to take its flags)
    included, stays within the budget and a 3 s tolerance; what the JSON says of time is what ran."""
    path, pids = _script(tmp_path, import_s=1.5, slow=0.3)
    before = path.read_bytes()
    budget = 20.0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
           "PROFTUNE_DB": f"sqlite:///{tmp_path / 'runs.db'}"}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "proftune", "optimize", "--json", "--budget", f"{budget:g}s",
                           "--", "python", str(path), "--objective", "val_acc:max"],
                          env=env, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    assert wall <= budget + max(3.0, 0.05 * budget), (wall, done.stderr[-2000:])
    d = json.loads(done.stdout)
    assert d["duration_s"] <= budget
    assert d["duration_s"] >= 1.5  # counted from the process's start: the flags' reading is inside
    used = re.search(r"(\d+) s of (\d+) s", d["stop_reason"])
    assert used, d["stop_reason"]
    assert int(used.group(2)) == budget
    assert abs(int(used.group(1)) - d["duration_s"]) <= 1, d["stop_reason"]
    runs = Store(env["PROFTUNE_DB"]).list_runs(kind="train")
    cut = [r for r in runs if r.status == "interrupted"]
    assert not cut or d["stop_reason"].startswith("the budget's end"), d["stop_reason"]  # a cut run is said
    assert all("cut at the budget's end" in (r.error or "") for r in cut)
    assert not _alive(pids)
    assert path.read_bytes() == before


def test_a_budget_that_ends_during_the_defaults_run_says_to_give_more(tmp_path: Path, db_url: str) -> None:
    path, pids = _script(tmp_path, import_s=0.0, slow=30.0, slow_seed=0)
    task, space, obj = load_script([sys.executable, str(path)], objective="val_acc:max")
    t0 = time.monotonic()
    with pytest.raises(ProftuneError, match=r"ended before one run of the script's defaults did.*larger budget="):
        optimize_script(task, space, obj, budget_s=4.0, db=db_url, started=t0)
    assert time.monotonic() - t0 <= 4.0
    assert task.deadline is None
    assert not _alive(pids)
    assert Store(db_url).list_runs(kind="optimize")[0].status == "failed"
