"""The CPU thread count as a computed parameter: measured on the fit's own steps, re-checked when
the step time drifts, a user's fixed value kept, torch's count put back after the fit."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from proftune import _thread_control, _threads, train
from proftune._api import TrainResult
from proftune._threads import (
    ThreadChoice,
    ThreadTuner,
    candidate_counts,
    fixed_threads,
    share_cores,
)
from proftune.task import Task
from proftune.train import Callback, FitState, fit

#: Virtual seconds added to the fit loop's clock: a step made slow costs no real time.
_VIRTUAL = [0.0]


class _Tiny(Task):
    """A linear model on made-up data: a step costs about the same at any thread count, so the
    only slow count is the one the test makes slow, by ``extra_ms`` on the fit loop's clock."""

    name = "tiny-threads"
    default_epochs = 1

    def __init__(self) -> None:
        self.extra_ms: dict[int, float] = {}
        self.seen: list[int] = []
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(2048, 8, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Linear(8, 1)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterator[Any]:
        for i in range(0, len(self.x), batch_size):
            yield self.x[i:i + batch_size], self.y[i:i + batch_size]

    def val_data(self, batch_size: int) -> Iterator[Any]:
        yield self.x[:64], self.y[:64]

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        _VIRTUAL[0] += self.extra_ms.get(torch.get_num_threads(), 0.0) / 1e3  # the injected load
        x, y = batch
        return nn.functional.mse_loss(model(x), y)


@pytest.fixture(autouse=True)
def _two_candidates(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Candidates 1 and 2 on any machine, no choice remembered from another test, the fit loop's
    clock with the injected load, and no run-queue wait read from the (shared) machine."""
    monkeypatch.setenv(_threads.MAX_THREADS_ENV, "2")
    monkeypatch.delenv(_threads.THREADS_ENV, raising=False)
    monkeypatch.setattr(train, "clock", lambda device=None: time.perf_counter() + _VIRTUAL[0])
    monkeypatch.setattr(_thread_control, "run_queue_ms", lambda: None)
    monkeypatch.setattr(_thread_control, "others_running", lambda own=1: None)
    _threads.forget()
    yield
    _threads.forget()


class _Load(Callback):
    """The machine's load changes at given steps: from each, the extra milliseconds per step at
    each count (``{30: {1: 200.0, 2: 400.0}}``: from step 30 a step at 2 threads takes 400 ms more)."""

    def __init__(self, task: _Tiny, phases: dict[int, dict[int, float]]) -> None:
        self.task, self.phases = task, phases

    def on_step_end(self, state: FitState) -> None:
        if state.step in self.phases:
            self.task.extra_ms = self.phases[state.step]


def test_the_choice_follows_a_change_of_load() -> None:
    task = _Tiny()
    task.extra_ms = {1: 100.0}  # at first one thread is slow (others would run beside it)
    load = _Load(task, {30: {1: 200.0, 2: 400.0},  # busier: both slower, two threads the most
                        70: {1: 60.0}})  # quieter: one thread faster, two faster still (by 60 ms: a busy
    # machine's spikes in the real step reach 20 ms, and at +20 the quieter check chose one thread at load 6)
    result = fit(task, {"batch_size": 8}, max_steps=120, evaluate=False, callbacks=[load])
    choice = result.threads
    assert choice is not None
    assert choice.source == "computed"
    assert choice.candidates == [1, 2]
    checks = [(c.reason, c.chosen) for c in choice.checks]
    assert checks[:3] == [("start", 2), ("drift", 1), ("drift", 2)]
    # a busy machine's own spikes in the real steps (a few ms) may ask again after the last change of
    # load: such a check keeps two threads (CI beside benchmark processes saw one more ("drift", 2))
    assert all(chosen == 2 for _, chosen in checks[3:])
    start, busier, quieter = choice.checks[:3]
    assert start.step == 0
    # one thread's step holds the injected 100 ms; two threads' is the real tiny step (6 ms on a machine
    # at load 6, where a ratio of 50 failed): compared by the difference, which load does not shrink
    assert start.step_ms["1"] >= 100.0
    assert start.step_ms["1"] > start.step_ms["2"] + 50.0
    assert busier.step >= 30
    assert busier.drift_ms[0] > 100 * busier.drift_ms[1]  # the window's median against the choice's time
    assert busier.step_ms["2"] > 1.5 * busier.step_ms["1"] > 250  # measured under the new load
    assert 70 <= quieter.step
    assert quieter.drift_ms[0] < 0.5 * quieter.drift_ms[1]  # faster: the larger count is measured again
    assert choice.threads == 2
    assert task.seen[-1] == 2  # the last steps ran at the new count
    assert choice.steps_at["1"] >= 30  # from the busier check to the quieter one, at one thread


def test_a_slower_step_at_one_thread_measures_nothing_more() -> None:
    """A step slower at the smallest count means others hold the cores: more threads would wait
    for them, so no check is spent on it (the periodic re-check still comes)."""
    tuner = ThreadTuner([1, 2], recheck=1000, window=4)
    ms = {1: 10.0, 2: 20.0}
    for _ in range(10):
        tuner.observe(ms[tuner.threads])
    assert [c.chosen for c in tuner.checks] == [1]
    ms = {1: 30.0, 2: 90.0}  # busier
    for _ in range(40):
        tuner.observe(ms[tuner.threads])
    assert len(tuner.checks) == 1
    assert tuner.steps_at == {1: 47, 2: 3}
    ms = {1: 8.0, 2: 4.0}  # quieter than ever: the larger count is measured again
    for _ in range(20):
        tuner.observe(ms[tuner.threads])
    assert [(c.reason, c.chosen) for c in tuner.checks] == [("start", 1), ("drift", 2)]


def test_a_choice_made_on_a_lucky_moment_is_measured_again() -> None:
    """The probe saw two threads fast; their steps since are slow: the first windows show it."""
    tuner = ThreadTuner([1, 2], recheck=1000, window=4)
    probe = iter([10.0, 10.0, 10.0, 5.0, 5.0, 5.0])  # warm-up, 3 at one thread, 3 at two
    tuner.observe(10.0)
    for ms in probe:
        tuner.observe(ms)
    assert tuner.checks[0].chosen == 2
    for _ in range(30):
        tuner.observe(40.0 if tuner.threads == 2 else 10.0)
    assert [(c.reason, c.chosen) for c in tuner.checks] == [("start", 2), ("drift", 1)]
    assert tuner.checks[1].drift_ms == [40.0, 5.0]
    assert tuner.threads == 1


def test_steps_that_wait_for_cores_skip_the_larger_counts() -> None:
    """At one thread the training thread waited half of each step for a core held by others:
    two threads are not tried (on a busy machine they are many times slower), and the record says why."""
    tuner = ThreadTuner([1, 2, 4], recheck=16, window=4)
    for _ in range(30):
        tuner.observe(10.0, wait_ms=5.0)
    assert tuner.steps_at == {1: 30}
    first = tuner.checks[0]
    assert (first.chosen, first.skipped, first.step_ms, first.wait_share) == (1, [2, 4], {"1": 10.0}, {"1": 0.5})
    assert len(tuner.checks) >= 2
    assert all(c.skipped == [2, 4] for c in tuner.checks[1:])  # the periodic re-checks too
    quiet = ThreadTuner([1, 2, 4], window=4)
    for _ in range(12):
        quiet.observe({1: 10.0, 2: 6.0, 4: 7.0}[quiet.threads], wait_ms=0.1)
    assert quiet.checks[0].chosen == 2
    assert set(quiet.checks[0].step_ms) == {"1", "2", "4"}


def test_counts_above_the_cores_others_leave_free_are_not_tried() -> None:
    """On 4 cores, with 3 of other processes' threads runnable around the one-thread steps, no
    larger count is tried (each would wait for a core at every parallel region); with one, two
    threads are tried but not four; with none, all; the record says what the others held."""
    held = ThreadTuner([1, 2, 4], window=4, cores=4)
    for _ in range(12):
        held.observe(10.0, others=3)
    assert held.steps_at == {1: 12}
    assert (held.checks[0].skipped, held.checks[0].others) == ([2, 4], {"1": 3.0})
    some = ThreadTuner([1, 2, 4], window=4, cores=4)
    for _ in range(12):
        some.observe({1: 10.0, 2: 6.0, 4: 4.0}[some.threads], others=1)
    assert (some.checks[0].chosen, some.checks[0].skipped) == (2, [4])
    free = ThreadTuner([1, 2, 4], window=4, cores=4)
    for _ in range(12):
        free.observe({1: 10.0, 2: 6.0, 4: 4.0}[free.threads], others=0)
    assert free.checks[0].chosen == 4
    unknown = ThreadTuner([1, 2, 4], window=4)  # the machine's cores not known: the signal is unused
    for _ in range(12):
        unknown.observe({1: 10.0, 2: 6.0, 4: 4.0}[unknown.threads], others=3)
    assert unknown.checks[0].chosen == 4


def test_a_fit_beside_other_runnable_threads_trains_at_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit loop samples other processes' runnable threads around each step (faked: one, on a
    machine of two cores): two threads are never tried."""
    monkeypatch.setattr(_thread_control, "others_running", lambda own=1: 1)
    monkeypatch.setattr(_thread_control, "machine_cores", lambda: 2)
    task = _Tiny()
    result = fit(task, {"batch_size": 8}, max_steps=20, evaluate=False)
    assert result.threads is not None
    assert result.threads.steps_at == {"1": 20}
    assert result.threads.checks[0].others == {"1": 1.0}


def test_a_fit_that_waits_for_cores_trains_at_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit loop reads the run-queue wait around each step (faked: half of every step)."""
    monkeypatch.setattr(_thread_control, "run_queue_ms", lambda: time.perf_counter() * 1e3 / 2)
    task = _Tiny()
    result = fit(task, {"batch_size": 8}, max_steps=20, evaluate=False)
    assert result.threads is not None
    assert result.threads.steps_at == {"1": 20}
    assert set(task.seen) == {1}
    assert result.threads.checks[0].wait_share["1"] == pytest.approx(0.5, abs=0.1)


def test_a_slow_count_is_not_chosen_at_the_start() -> None:
    task = _Tiny()
    task.extra_ms = {1: 50.0}
    result = fit(task, {"batch_size": 8}, max_steps=20, evaluate=False)
    assert result.threads is not None
    assert result.threads.checks[0].chosen == 2
    assert result.threads.checks[0].step_ms["1"] > result.threads.checks[0].step_ms["2"]


def test_a_fixed_value_is_kept_and_recorded_as_the_users() -> None:
    task = _Tiny()
    task.extra_ms = {1: 50.0}  # slow at the user's count: it is kept all the same
    before = torch.get_num_threads()
    result = fit(task, {"batch_size": 8}, max_steps=30, evaluate=False, threads=1)
    assert set(task.seen) == {1}
    assert result.threads == ThreadChoice(threads=1, source="user", max_threads=2, given_by="threads=")
    assert torch.get_num_threads() == before
    task.seen.clear()
    with fixed_threads(1):  # the CLI's --threads
        by_env = fit(task, {"batch_size": 8}, max_steps=5, evaluate=False)
    assert set(task.seen) == {1}
    assert by_env.threads is not None
    assert (by_env.threads.source, by_env.threads.given_by) == ("user", "$PROFTUNE_THREADS")


def test_torch_threads_are_put_back_after_a_computed_fit_and_a_failed_one() -> None:
    task = _Tiny()
    task.extra_ms = {2: 50.0}
    torch.set_num_threads(2)
    try:
        fit(task, {"batch_size": 8}, max_steps=12, evaluate=False)
        assert torch.get_num_threads() == 2

        class Boom(Callback):
            def on_step_end(self, state: FitState) -> None:
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            fit(task, {"batch_size": 8}, max_steps=12, evaluate=False, threads=1, callbacks=[Boom()])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(2)


def test_bad_thread_values_are_named() -> None:
    from proftune.exceptions import ConfigError

    with pytest.raises(ConfigError, match="threads=0"):
        fit(_Tiny(), {"batch_size": 8}, max_steps=2, threads=0)


def test_a_later_fit_starts_at_the_remembered_choice() -> None:
    task = _Tiny()
    task.extra_ms = {1: 50.0}
    first = fit(task, {"batch_size": 8}, max_steps=20, evaluate=False)
    second = fit(task, {"batch_size": 8}, max_steps=20, evaluate=False)
    assert first.threads is not None
    assert second.threads is not None
    assert second.threads.remembered
    assert second.threads.checks == []
    assert second.threads.steps_at == {"2": 20}


def test_the_tuner_stops_climbing_at_a_slower_count_and_rechecks_periodically() -> None:
    ms = {1: 10.0, 2: 5.0, 4: 8.0, 8: 30.0}
    tuner = ThreadTuner([1, 2, 4, 8], recheck=16, window=4, cost_share=1.0)
    for _ in range(60):
        tuner.observe(ms[tuner.threads])
    first = tuner.checks[0]
    assert first.chosen == 2
    assert first.skipped == [8]
    assert set(first.step_ms) == {"1", "2", "4"}
    assert [c.reason for c in tuner.checks[1:]]
    assert all(c.reason == "periodic" for c in tuner.checks[1:])
    assert tuner.threads == 2
    assert tuner.recheck > 16  # the choice held: the next re-check is later
    thrifty = ThreadTuner([1, 2, 4, 8], recheck=16, window=4)  # re-checks within 2% of the training
    for _ in range(60):
        thrifty.observe(ms[thrifty.threads])
    assert len(thrifty.checks) == 1
    assert thrifty.recheck == 240  # its steps at 1 and 4 took 3 x 5 + 3 x 3 ms more: 24 ms = 2% of 240 steps


def test_candidates_and_shares() -> None:
    assert candidate_counts(1) == [1]
    assert candidate_counts(6) == [1, 2, 4, 6]
    assert candidate_counts(8) == [1, 2, 4, 8]
    assert share_cores(10**6) == 1


def test_a_train_record_without_threads_still_reads() -> None:
    old = {"epochs": 1, "steps": 3, "samples": 96, "throughput": 10.0, "stop_reason": None}
    assert TrainResult.from_dict(old).threads is None
    choice = fit(_Tiny(), {"batch_size": 8}, max_steps=12, evaluate=False).threads
    rec = TrainResult(epochs=1, steps=12, samples=96, throughput=1.0, stop_reason=None, threads=choice)
    back = TrainResult.from_dict(rec.to_dict())
    assert back.threads == choice


def test_the_cli_threads_option_is_kept_and_recorded(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from proftune.cli import app

    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = CliRunner().invoke(app, ["train", "digits-cnn", "--max-steps", "3", "--threads", "1", "--json",
                                   "--db", db, "--device", "cpu"])
    assert res.exit_code == 0, res.output
    threads = json.loads(res.stdout)["threads"]
    assert (threads["threads"], threads["source"], threads["given_by"]) == (1, "user", "$PROFTUNE_THREADS")
    assert _threads.THREADS_ENV not in os.environ  # the command put the environment back
    bad = CliRunner().invoke(app, ["train", "digits-cnn", "--threads", "0", "--db", db])
    assert bad.exit_code == 2
    assert "--threads" in bad.output


def test_a_candidate_cut_off_mid_step_is_measured_once() -> None:
    tuner = ThreadTuner([1, 2], warmup=0)
    assert tuner.cut_off() is None  # nothing faster measured yet
    for _ in range(3):
        tuner.observe(10.0)
    assert tuner.threads == 2
    assert tuner.cut_off() == (30.0, 1)  # after 30 ms the step goes on at 1 thread
    tuner.observe(31.0, cut=True)
    assert not tuner.measuring
    assert tuner.checks[0].step_ms == {"1": 10.0, "2": 31.0}
    assert tuner.threads == 1


def test_the_load_is_read_around_one_step_in_four_between_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read of the load opens a file under /proc (about a tenth of a millisecond, a small
    model's whole step): between checks it is read around one step in ``load_every``."""
    reads = {"queue": 0, "others": 0}

    def queue() -> float:
        reads["queue"] += 1
        return 0.0

    def others(own: int = 1) -> int:
        reads["others"] += 1
        return 0

    monkeypatch.setattr(_thread_control, "run_queue_ms", queue)
    monkeypatch.setattr(_thread_control, "others_running", others)
    result = fit(_Tiny(), {"batch_size": 8}, max_steps=120, evaluate=False)
    assert result.threads is not None
    checked = sum(len(c.step_ms) for c in result.threads.checks) * 3 + len(result.threads.checks)
    assert reads["queue"] == reads["others"]
    assert reads["queue"] <= 2 * (checked + 120 // 4 + 1) < 2 * 120 * 0.5


def test_a_sampled_load_still_keeps_the_larger_counts_untried() -> None:
    """With the wait read around one step in four, a machine whose cores are held still keeps
    the periodic re-checks at one thread."""
    tuner = ThreadTuner([1, 2, 4], recheck=16, window=8, load_every=4)
    sampled = 0
    for _ in range(80):
        read = tuner.wants_load()
        sampled += read
        tuner.observe(10.0, wait_ms=5.0 if read else None)
    assert tuner.steps_at == {1: 80}
    assert len(tuner.checks) >= 2
    assert all(c.skipped == [2, 4] and c.chosen == 1 for c in tuner.checks)
    assert sampled < 40


# -- the work outside the fit loop ---------------------------------------------------------------
def test_work_outside_the_fit_loop_runs_at_one_thread_on_busy_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluations, probes, range tests and gradient samples run outside the fit loop's steps: on a
    machine whose cores the others hold but one they run at one thread (torch's thread per core
    waits at every parallel region: 5-20x slower at load 8 on 2 cores), at the fit loop's last
    choice for the workload where it made one, at ``$PROFTUNE_THREADS`` where set; torch's count
    is put back after."""
    monkeypatch.setattr(_threads, "machine_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(_threads, "others_running", lambda own=1: 3)
        with _threads.work_threads(("w", "cpu")):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(_threads, "others_running", lambda own=1: 0)  # a quiet machine: torch's own
        assert _threads.threads_for_work(("w", "cpu")) is None
        _threads.remember(("w", "cpu"), 2, 64, 0)  # the fit loop measured 2 best for this workload
        monkeypatch.setattr(_threads, "others_running", lambda own=1: 3)
        assert _threads.threads_for_work(("w", "cpu")) == 2
        assert _threads.threads_for_work(("other", "cpu")) == 1
        monkeypatch.setenv(_threads.THREADS_ENV, "1")  # --threads 1
        assert _threads.threads_for_work(("w", "cpu")) == 1
    finally:
        torch.set_num_threads(before)


def test_diagnose_evaluates_outside_the_fit_loop_at_the_threads_the_load_leaves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """diagnose evaluates the trained model on its training data after the fit: at one thread
    where the others hold the cores (faked), and torch's count is put back after."""
    import proftune

    monkeypatch.setattr(_threads, "machine_cores", lambda: 2)
    monkeypatch.setattr(_threads, "others_running", lambda own=1: 3)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        task = _Tiny()
        proftune.diagnose(task, {"batch_size": 256}, epochs=1, record=False, probes=False)
        after_fit = task.seen[-1]  # the last loss: the evaluation of the training data, after the fit
        assert after_fit == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
