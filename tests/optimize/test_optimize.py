"""The optimize loop end to end on tiny tasks: stages, resume after SIGKILL, health stop,
yellow flags, auto-stop, bad input.

The whole-loop tests take 5-25 s each on 2 cores (a subprocess for the SIGKILL, imports of
torch-pruning and torchao for the compress stage); the parts they rest on have unit tests in
``test_parts.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import proftune
from proftune.cli import app
from proftune.optimize import OPTIMIZE_STAGES, FinalOutputs, SearchStageOutputs
from proftune.track import Store

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks.py"
SRC = HERE.parents[1] / "src"


def _spec(cls: str) -> str:
    return f"{TASKS}:{cls}"


def _stage_runs(db: str) -> list[Any]:
    return [r for r in Store(db).list_runs(kind="optimize") if r.config.get("stage")]


def _records_hold_every_output(out: Path) -> None:
    """Each stage's outputs in state.json read back as its record with nothing lost or added:
    the record is what the stage produced and what the stages after it read."""
    from proftune.optimize import STAGE_RECORDS

    state = json.loads((out / "state.json").read_text())
    for name, stage in state["stages"].items():
        if stage.get("status") not in ("finished", "skipped"):
            continue
        outputs = stage["outputs"]
        assert outputs["schema_version"] == 1, name
        assert STAGE_RECORDS[name].from_dict(outputs).to_dict() == outputs, name


def _stored(out: Path, name: str, record: Any) -> Any:
    """A stage's whole record as state.json holds it (the result's rows are compacted)."""
    return record.from_dict(json.loads((out / "state.json").read_text())["stages"][name]["outputs"])


def _trial_numbers(db: str, study: str) -> list[int]:
    return sorted(int(r.config["trial"]) for r in Store(db).list_runs(kind="trial", study=study)
                  if r.status == "finished")


def test_runs_every_stage_on_a_user_task_file(tmp_path: Path, db_url: str) -> None:
    """The "chosen beats the defaults" path: defaults 1000x too slow, a searched rate wins beyond
    noise, on validation and on the held-out part of the validation data."""
    out = tmp_path / "out"
    result = proftune.optimize(_spec("TooSlowLR"), budget=60, out=str(out), db=db_url, goal="none", seeds=3)
    assert [s.name for s in result.stages] == list(OPTIMIZE_STAGES)
    assert {s.status for s in result.stages} <= {"finished", "skipped"}
    assert result.stages[-1].status == "skipped"  # --goal none
    runs = _stage_runs(db_url)
    assert sorted(r.config["stage"] for r in runs) == sorted(OPTIMIZE_STAGES)
    assert all(r.parent_id == result.run_id for r in runs)
    vs = result.vs_baseline
    assert vs.decision == "chosen", (vs.summary, [(s.name, s.duration_s, s.share_s) for s in result.stages])
    assert vs.beyond_noise is True
    assert "beats the defaults beyond noise" in vs.summary
    assert result.final.params["lr"] > 1e-4
    # paired: the defaults and the result trained with the same seeds, at least --seeds of them
    cmp = vs.leader_vs_defaults.val
    assert cmp is not None
    assert len(cmp.seeds) >= 3
    assert cmp.lower is not None
    assert cmp.lower > 0
    # the defaults have at least the result's runs: where they train in a third of its time, more
    # of them train alone in the time a pair does not fit, for the rank test (a loaded machine)
    assert vs.defaults.val.n >= vs.final.val.n >= 3
    # every arm raced at the task's own protocol (its 2 epochs), whatever the trials ran
    race = _stored(out, "final", FinalOutputs).race
    assert race is not None
    assert {r.epochs for a in race.arms for r in a.runs if not r.cut} == {2}
    assert result.stages[4].record(SearchStageOutputs).budget_plan is not None
    # held-out figures: the task has no test_data and no resplit, so selection used all of its 96
    # validation samples and the held-out figure is the gain corrected for the winner's curse
    assert vs.held_out is not None
    assert vs.held_out.source == "estimate"
    assert vs.held_out.val_samples == 96
    assert "winner's curse" in vs.held_out_source
    assert vs.gain is not None
    assert vs.gain_test is not None
    assert 0.1 < vs.gain_test < vs.gain
    assert (result.final.test.mean or 0) > (vs.defaults.test.mean or 1)
    assert vs.defaults.test.mean == pytest.approx(vs.defaults.val.mean)  # nothing selected the defaults
    # the search's estimate of the chosen configuration predicts its final mean
    gap = vs.search_gap
    assert gap is not None
    assert gap.gap is not None
    assert abs(gap.gap) <= 0.15, gap
    assert result.stop_reason
    for name in ("config.yaml", "summary.json", "model.pt", "state.json"):
        assert (out / name).is_file(), name
    _records_hold_every_output(out)
    # the final model is a state dict that the task rebuilds (safe to load), the seed best on validation's
    import torch

    from proftune.train import evaluate_model

    task = proftune.load_task(_spec("TooSlowLR"))
    model = task.build_model(result.final.params)
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    val = evaluate_model(task, model, torch.device("cpu"), 32)["accuracy"]
    assert any(abs(val - v) < 1e-9 for v in result.final.metrics["accuracy"].values if v is not None)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final"]["params"] == result.final.params
    assert summary["stop_reason"] == result.stop_reason
    assert summary["vs_baseline"]["final"]["test"]["mean"] == pytest.approx(result.final.test.mean)
    assert proftune.OptimizeResult.from_dict(summary).to_dict() == summary  # --json reads back as the record


def test_a_flat_search_keeps_the_defaults_and_says_why(tmp_path: Path, db_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The "kept the defaults" path: nothing beats them beyond noise, so they are the result; the
    flat search stops itself and the run says why it ended early.

    The flat search may stop itself from 0.3 of its time here, not 0.75: the re-evaluations of its
    leaders then have most of its time to run in, at the pace of any load (at 0.75 a loaded machine
    spent the time on them and the search timed out). That a flat search waits for
    ``STALL_AFTER`` of its time is held exactly, on an injected clock, by
    test_winners_curse.py::test_a_flat_search_stops_itself_late_in_its_time_once_its_leaders_are_re_evaluated."""
    from proftune.optimize import _search

    monkeypatch.setattr(_search, "STALL_AFTER", 0.3)
    res = CliRunner().invoke(app, ["optimize", _spec("Flat"), "--budget", "50", "--out", str(tmp_path / "o"),
                                   "--db", db_url, "--goal", "none", "--seeds", "2", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert list(d)[:3] == ["stages", "final", "vs_baseline"]
    assert [s["name"] for s in d["stages"]] == list(OPTIMIZE_STAGES)
    assert {"name", "status", "duration_s", "outputs", "compares"} <= set(d["stages"][0])
    assert {"params", "metrics", "model", "latency_ms", "size_bytes", "test", "decision"} <= set(d["final"])
    vs = d["vs_baseline"]
    assert vs["decision"] == "defaults"
    assert "kept them" in vs["summary"]
    assert d["final"]["params"] == {"lr": 0.01, "batch_size": 32, "optimizer": "adamw"}
    assert all(e.startswith("task default (kept") for e in d["final"]["evidence"].values())
    search = next(s for s in d["stages"] if s["name"] == "search")
    # ended by the auto-stop, early in trials (not in seconds: how fast trials run is the machine's)
    assert search["outputs"]["stop_reason"].startswith("auto-stop"), search["outputs"]["stop_reason"]
    # it had the time the planned race and compression leave (about its share or more), and
    # stopped itself before it was spent (how far before is the load's)
    assert search["outputs"]["seconds"] >= 0.8 * search["share_s"]
    assert search["outputs"]["early"] is True
    assert search["duration_s"] < search["outputs"]["seconds"]
    assert "ended early" in d["stop_reason"]


def test_a_budget_too_short_for_the_defaults_own_protocol_returns_them_with_proposals(
        tmp_path: Path, db_url: str) -> None:
    """The defaults' own protocol (30 slowed epochs) does not fit a race: nothing is compared at a
    shortened protocol; the search's best alone races the defaults at their own 30 epochs in the
    time left (cut by the budget's end here), the defaults are the result, trained at their own 30
    epochs, the search's best are listed as proposals, and the budget that would decide is printed."""
    out = tmp_path / "o"
    result = proftune.optimize(_spec("SlowDefaults"), budget=20, out=str(out), db=db_url, goal="none", seeds=2)
    srch = _stored(out, "search", SearchStageOutputs)
    fin = _stored(out, "final", FinalOutputs)
    assert srch.budget_plan is not None
    assert srch.budget_plan.race_fits is False
    assert srch.epochs_per_trial is not None
    assert srch.epochs_per_trial < 30  # the search ran at a low fidelity, for proposals
    assert result.vs_baseline.decision == "defaults"
    assert result.final.params == proftune.load_task(_spec("SlowDefaults")).default_params
    race = fin.race
    assert race is not None
    # no challenger at a protocol nobody uses: at most the search's best, at the defaults' own
    assert [a.name for a in race.arms][:1] == ["defaults"]
    assert len(race.arms) <= 2
    assert all(r.epochs == 30 for a in race.arms for r in a.runs if not r.cut)
    assert result.final.epochs == 30
    assert not any(c.param == "epochs" and c.changed for c in result.final.changes)
    note = result.vs_baseline.race_note
    assert "needs --budget >=" in note, note
    assert "own 30 epochs" in note
    if srch.top:
        assert fin.proposals
        assert result.vs_baseline.leader_changes  # proposed, not adopted
    plan_min = srch.budget_plan.min_budget_s
    assert plan_min > 20


@pytest.mark.parametrize("slowed_from", [pytest.param("search", marks=pytest.mark.slow), "final"])
def test_a_loop_slowed_mid_run_never_hands_back_less_than_the_defaults(tmp_path: Path, db_url: str,
                                                                       slowed_from: str) -> None:
    """The baseline measures a fast pace; from ``slowed_from`` on every batch waits 0.2 s (about 50x
    slower: a machine that became loaded), so the plan made from the baseline's pace is wrong and
    the budget runs out. The model handed back is still a whole training at the task's own
    protocol, never below the defaults trained at it (within their seeds' noise and one held-out
    sample): a training cut by the budget's end would be (one at 2 steps scores ~0.4, the
    defaults ~0.76)."""
    import statistics

    import torch

    from proftune._holdout import with_test_split
    from proftune.train import evaluate_model, fit

    from .tasks import LoadedMidRun

    task = LoadedMidRun()
    judge, info = with_test_split(task, batch_size=32)
    ref = [evaluate_model(judge, fit(judge, dict(task.default_params), seed=s, device="cpu").model,
                          torch.device("cpu"), 32, split="test")["accuracy"] for s in range(5)]
    bar = statistics.fmean(ref) - 3 * statistics.stdev(ref) - 1 / (info.test_samples or 1)

    def progress(event: str, data: dict[str, Any]) -> None:
        if event == "stage_start" and data["stage"] == slowed_from:
            LoadedMidRun.DELAY = 0.2

    out = tmp_path / "o"
    try:
        result = proftune.optimize(task, budget=18, out=str(out), db=db_url, goal="none", seeds=2,
                                   device="cpu", progress=progress)
    finally:
        LoadedMidRun.DELAY = 0.0
    fin = _stored(out, "final", FinalOutputs)
    race = fin.race
    assert race is not None
    picked = race.model_run()
    assert picked is not None
    assert not picked.cut, race.note  # the model handed back is a whole training
    own = task.default_epochs
    assert picked.epochs == (race.arm(race.chosen).epochs if race.decision == "shorter" else own)
    assert result.final.epochs == picked.epochs
    assert all(r.epochs == own for r in race.arm("defaults").runs if not r.cut)
    assert any(not r.cut for r in race.arm("defaults").runs)  # the reference was measured
    model = judge.build_model(result.final.params)
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    test = evaluate_model(judge, model, torch.device("cpu"), 32, split="test")["accuracy"]
    assert test >= bar, (test, ref, race.decision, race.note)
    if race.decision == "defaults":
        assert result.final.params == task.default_params


def test_the_task_s_own_test_data_gives_the_held_out_figures(tmp_path: Path, db_url: str) -> None:
    res = CliRunner().invoke(app, ["optimize", _spec("WithTestSplit"), "--budget", "30", "--out",
                                   str(tmp_path / "o"), "--db", db_url, "--goal", "none", "--seeds", "2"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "the task's test_data (128 samples)" in text
    assert "what changed" in text
    assert "held out" in text
    assert re.search(r"stopped +\S", text)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    vs = summary["vs_baseline"]
    assert vs["held_out"] == {"source": "task.test_data", "fraction": None, "val_samples": 96,
                              "test_samples": 128, "note": ""}
    assert vs["final"]["test"]["mean"] is not None


def test_yellow_flag_pauses_a_region_of_nan_trials(tmp_path: Path, db_url: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  lr: {type: float, low: 1.0e-3, high: 1.0, log: true}\n"
                     "  hidden: {type: int, low: 4, high: 32}\n")
    result = proftune.optimize(_spec("NaNAboveLR"), budget=45, out=str(tmp_path / "o"), db=db_url,
                               goal="none", seeds=1, space=str(space), flag_min=2, max_trials=14,
                               patience=20)
    flags = [f for f in result.flags if f.cause == "nan"]
    assert flags, result.stages[4].outputs
    region = flags[0].region["lr"]
    assert region["low"] > 0.05 * 0.999
    assert region["high"] == pytest.approx(1.0)
    assert flags[0].evidence
    assert "non-finite" in flags[0].evidence[0]
    assert result.final.params["lr"] <= 0.05


def test_health_stops_a_broken_task_with_its_finding(tmp_path: Path, db_url: str) -> None:
    res = CliRunner().invoke(app, ["optimize", _spec("AlwaysNaN"), "--budget", "60", "--out",
                                   str(tmp_path / "o"), "--db", db_url, "--goal", "none"])
    assert res.exit_code == 1, res.output
    assert "nan_inf" in res.output
    assert "fix:" in res.output
    assert "evidence:" in res.output
    stages = {r.config["stage"]: r.status for r in _stage_runs(db_url)}
    assert stages == {"baseline": "finished", "health": "failed"}  # no search ran
    assert not Store(db_url).list_runs(kind="trial")


def test_bad_input_exits_2_naming_every_problem(tmp_path: Path, db_url: str) -> None:
    foreign = tmp_path / "taken"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    res = CliRunner().invoke(app, ["optimize", _spec("TinyTask"), "--budget", "0", "--objective", "bleu",
                                   "--goal", "fast", "--seeds", "0", "--memory-budget", "3Q",
                                   "--out", str(foreign), "--db", db_url])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    for needle in ("--budget '0' must be", "--objective 'bleu': task", "--goal 'fast' is unknown",
                   "--seeds 0 must", "--memory-budget '3Q' is not", f"--out {str(foreign)!r} is not empty"):
        assert needle in text, needle
    assert "=" not in text  # the library's goal='fast', seeds=0, out=... read as the flags
    assert (foreign / "notes.txt").read_text() == "mine"
    assert not Store(db_url).list_runs()


def test_an_existing_run_is_not_overwritten_without_resume(tmp_path: Path, db_url: str) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "state.json").write_text(json.dumps({"task": "tiny", "study": "s1", "stages": {}}))
    res = CliRunner().invoke(app, ["optimize", _spec("TinyTask"), "--budget", "30", "--out", str(out),
                                   "--db", db_url])
    assert res.exit_code == 2
    assert ("pass --resume (or the same --study) to continue it, or choose another --out."
            in " ".join(res.output.split()))
    with pytest.raises(proftune.ConfigError) as err:  # the same call in Python names its arguments
        proftune.optimize(_spec("TinyTask"), 30, out=str(out), db=db_url)
    assert "pass resume=True (or the same study=) to continue it, or choose another out=." in str(err.value)


def test_space_contradicting_the_computed_values_exits_2(tmp_path: Path, db_url: str) -> None:
    space = tmp_path / "space.yaml"
    # without a memory budget the compute stage measures grad_accumulation 1 whatever the load
    # (the precision it computes depends on the measured matmul share, which load can move)
    space.write_text("params:\n  lr: {type: float, low: 1.0e-3, high: 1.0, log: true}\n"
                     "fixed: {grad_accumulation: 4}\n")
    res = CliRunner().invoke(app, ["optimize", _spec("TinyTask"), "--budget", "30", "--out",
                                   str(tmp_path / "o"), "--db", db_url, "--space", str(space), "--device", "cpu"])
    assert res.exit_code == 2, res.output
    assert "--space fixes grad_accumulation=4, but the compute stage measured grad_accumulation=1" in res.output


# -- one run owns its --out and its study --------------------------------------------------------------
_PAUSED = textwrap.dedent("""
    import sys
    import proftune
    def progress(event, data):
        if event == "stage_start" and data["stage"] == "baseline":
            print("running", flush=True)
            sys.stdin.readline()   # paused inside the loop until the test kills it
    proftune.optimize(sys.argv[1], budget=60, out=sys.argv[2], db=sys.argv[3], study=sys.argv[4],
                      goal="none", seeds=1, max_trials=2, progress=progress)
""")


def test_a_second_optimize_on_the_same_out_or_study_is_refused_naming_the_first(tmp_path: Path,
                                                                                  db_url: str) -> None:
    out, other = tmp_path / "o", tmp_path / "o2"
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED, _spec("TinyTask"), str(out), db_url, "shared"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running", proc.communicate()[1]
        holder = f"optimize (pid {proc.pid} on "
        for argv in (["--out", str(out), "--resume"], ["--out", str(out), "--study", "shared"],
                     ["--out", str(other), "--study", "shared"]):
            res = CliRunner().invoke(app, ["optimize", _spec("TinyTask"), "--budget", "30", "--db", db_url, *argv])
            assert res.exit_code == 2, (argv, res.output)
            assert holder in " ".join(res.output.split()), (argv, res.output)
            assert re.search(r"choose another --out\.|give another --study\.", " ".join(res.output.split())), res.output
        assert not other.exists()  # refused before anything was written
        space = tmp_path / "space.yaml"
        space.write_text("params:\n  lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}\n")
        res = CliRunner().invoke(app, ["tune", _spec("TinyTask"), "--space", str(space), "--study", "shared",
                                       "--trials", "1", "--db", db_url])
        assert res.exit_code == 2, res.output
        assert holder in " ".join(res.output.split()), res.output
        assert "give another --study." in " ".join(res.output.split()), res.output
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    # killed: its locks pass to the next run (the resume tests below run the whole loop after a kill)
    from proftune.track import FolderLock, StudyLock

    assert FolderLock(out, command="optimize").holder() is None
    with StudyLock(Store(db_url), "shared", command="optimize") as lock:
        assert lock.holders() == []


# -- resume after SIGKILL ---------------------------------------------------------------------------
_KILLER = textwrap.dedent("""
    import os, signal, sys
    import proftune
    stage, after = sys.argv[1], int(sys.argv[2])
    def progress(event, data):
        if stage == "search" and event == "search_chunk" and data["finished"] >= after:
            os.kill(os.getpid(), signal.SIGKILL)
        if stage != "search" and event == "stage_start" and data["stage"] == stage:
            os.kill(os.getpid(), signal.SIGKILL)
    proftune.optimize(sys.argv[3], budget=float(sys.argv[4]), out=sys.argv[5], db=sys.argv[6],
                      goal=sys.argv[7], seeds=1, max_trials=int(sys.argv[8]), progress=progress)
""")


def _killed_run(stage: str, after: int, task: str, budget: float, out: Path, db: str, goal: str,
                max_trials: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _KILLER, stage, str(after), task, str(budget), str(out), db,
                           goal, str(max_trials)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-3000:]


def test_resume_after_sigkill_in_the_search_stage(tmp_path: Path, db_url: str) -> None:
    out = tmp_path / "o"
    # max_trials above the warm start's ten points, which a fast task's first chunk may hold all of
    _killed_run("search", 3, _spec("TinyTask"), 150, out, db_url, "none", 16)
    state = json.loads((out / "state.json").read_text())
    assert state["stages"]["layer_value"]["status"] == "finished"
    assert "search" not in state["stages"]
    before = _trial_numbers(db_url, state["study"])
    assert len(before) >= 3
    result = proftune.optimize(_spec("TinyTask"), budget=150, out=str(out), db=db_url, goal="none", seeds=1,
                               max_trials=16, resume=True)
    after = _trial_numbers(db_url, state["study"])
    assert after[: len(before)] == before
    assert len(after) == len(set(after)) > len(before)
    # stages finished before the kill were reused, not run again; the killed search has its own Run
    stages = [r.config["stage"] for r in _stage_runs(db_url) if r.status == "finished"]
    assert sorted(stages) == sorted(OPTIMIZE_STAGES)
    assert result.stages[4].status == "finished"
    trials = Store(db_url).list_runs(kind="trial", study=state["study"])
    assert len({r.config["trial"] for r in trials}) == len(trials)  # every trial ran once
    _records_hold_every_output(out)


def test_resume_after_sigkill_in_the_compress_stage(tmp_path: Path, db_url: str) -> None:
    out = tmp_path / "o"
    _killed_run("compress", 0, _spec("TinyTask"), 150, out, db_url, "size", 4)
    state = json.loads((out / "state.json").read_text())
    assert state["stages"]["final"]["status"] == "finished"
    trials_before = _trial_numbers(db_url, state["study"])
    final_runs = len(Store(db_url).list_runs(kind="train"))
    assert final_runs >= 2  # the final race: the defaults and a searched configuration, paired
    result = proftune.optimize(_spec("TinyTask"), budget=150, out=str(out), db=db_url, goal="size", seeds=1,
                               max_trials=4, resume=True)
    assert _trial_numbers(db_url, state["study"]) == trials_before  # no trial repeated
    assert result.stages[-1].status == "finished", result.stages[-1]
    stage_runs = [r for r in _stage_runs(db_url) if r.config["stage"] != "compress" and r.status == "finished"]
    assert len(stage_runs) == len(OPTIMIZE_STAGES) - 1
    assert len(Store(db_url).list_runs(kind="train")) == final_runs  # the final race, not repeated
    # a compressed file exactly when a candidate beat the uncompressed model on the goal (which of
    # TinyTask's layers the layer-value stage keeps is measured, so either may happen)
    _records_hold_every_output(out)
    outputs = result.stages[-1].outputs
    assert (out / "model_compressed.pt").is_file() == (outputs["selected"] is not None), json.dumps(outputs)
    if outputs["selected"] is not None:
        assert "HeldOutTask" not in outputs["load"]
        assert ":TinyTask" in outputs["load"]  # the task file (or its module, in a package)


def test_resume_trusts_files_not_a_flag_and_refuses_a_newer_state(tmp_path: Path, db_url: str) -> None:
    """A finished stage whose file is gone runs again (and says so); a state.json of a newer
    version is refused (exit 2) before anything is written."""
    out = tmp_path / "o"
    proftune.optimize(_spec("TinyTask"), budget=20, out=str(out), db=db_url, goal="none", seeds=1, max_trials=3)
    (out / "model.pt").unlink()
    events: list[tuple[str, dict[str, Any]]] = []
    result = proftune.optimize(_spec("TinyTask"), budget=20, out=str(out), db=db_url, goal="none", seeds=1,
                               max_trials=3, resume=True, progress=lambda e, d: events.append((e, d)))
    assert ("stage_rerun", {"stage": "final", "missing": ["model.pt"]}) in events
    assert Path(result.final.model).is_file()
    # a state.json of another store: refused before anything in the folder changes
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    other = f"sqlite:///{tmp_path / 'other.db'}"
    res = CliRunner().invoke(app, ["optimize", _spec("TinyTask"), "--budget", "20", "--out", str(out),
                                   "--db", other, "--goal", "none", "--resume"])
    assert res.exit_code == 2, res.output
    assert "belongs to another store" in res.output
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    state = json.loads((out / "state.json").read_text())
    state["version"] = 99
    (out / "state.json").write_text(json.dumps(state))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    res = CliRunner().invoke(app, ["optimize", _spec("TinyTask"), "--budget", "20", "--out", str(out),
                                   "--db", db_url, "--goal", "none", "--resume"])
    assert res.exit_code == 2, res.output
    assert "version 99" in res.output
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
