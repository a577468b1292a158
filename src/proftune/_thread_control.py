"""The fit loop's CPU threads: a callback that sets torch's thread count for each step as
:class:`proftune._threads.ThreadTuner` decides from the steps' times and the machine's load."""

from __future__ import annotations

import time
from typing import Any

import torch

from ._fit_state import Callback, FitState
from ._threads import (
    ThreadChoice,
    ThreadTuner,
    candidate_counts,
    machine_cores,
    max_threads,
    others_running,
    recall,
    remember,
    run_queue_ms,
)

__all__ = ["ThreadControl"]


class ThreadControl(Callback):
    """Sets torch's thread count for each step, as :class:`ThreadTuner` decides from the steps'
    times (or once, for a fixed count); :meth:`choice` is the record of what it did."""

    def __init__(self, fixed: int | None, given_by: str, key: tuple[str, ...]) -> None:
        self.fixed, self.given_by, self.key = fixed, given_by, key
        self.limit = max_threads()
        self.tuner: ThreadTuner | None = None
        self._armed = False
        self._grad_hooks: list[Any] = []
        self._deadline, self._fallback, self._cut = 0.0, 1, False
        self._wait0: float | None = None
        self._others0: int | None = None
        self._wall0 = 0.0
        if fixed is None:
            hit = recall(key)
            start, recheck, since = hit if hit is not None else (None, 64, 0)
            self.tuner = ThreadTuner(candidate_counts(self.limit), start=start, recheck=recheck, since=since,
                                     cores=machine_cores())
        self._apply()

    def _apply(self) -> None:
        want = self.fixed if self.fixed is not None else (self.tuner.threads if self.tuner else None)
        if want is not None and torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def on_step_start(self, state: FitState) -> None:
        if self.tuner is not None and self.tuner.wants_load():
            self._wait0, self._wall0 = run_queue_ms(), time.perf_counter()
            self._others0 = others_running(torch.get_num_threads())
        else:  # not read around this step (each read opens a file under /proc)
            self._wait0 = self._others0 = None
        # a candidate measured after a faster one: once its step has taken ``abort`` x the best
        # step, the rest of the step runs at the best count (checked as each module's forward
        # starts and each parameter's gradient is computed, through hooks on this model's own
        # modules and parameters, removed at the step's end; no global module hook: the one stack
        # of running modules is profile's), so a count that waits on busy cores costs about
        # ``abort`` good steps, not one of its own (2 threads of digits-cnn on 2 cores at load 9:
        # 0.55 s with the backward checked alone, 0.13-0.18 s with the forward too; 20 ms at 1)
        cut = self.tuner.cut_off() if self.tuner is not None else None
        if cut is not None and not self._armed:
            self._deadline, self._fallback = time.perf_counter() + cut[0] / 1e3, cut[1]
            self._cut = False
            self._armed = True
            self._grad_hooks = [p.register_hook(self._check_grad) for p in state.model.parameters()
                                if p.requires_grad]
            if not hasattr(state.model, "_orig_mod"):  # a compiled model would recompile for new hooks
                self._grad_hooks += [m.register_forward_pre_hook(self._check) for m in state.model.modules()]

    def _check(self, *_: Any) -> None:
        if not self._cut and time.perf_counter() > self._deadline:
            self._cut = True
            torch.set_num_threads(self._fallback)

    def _check_grad(self, grad: torch.Tensor) -> None:
        self._check()  # in the backward too, as each parameter's gradient is computed

    def on_after_backward(self, state: FitState) -> None:
        if self._armed:
            self._check()

    def _unhook(self) -> None:
        self._armed = False
        for h in self._grad_hooks:
            h.remove()
        self._grad_hooks = []

    def on_step_end(self, state: FitState) -> None:
        cut = self._armed and self._cut
        self._unhook()
        if self.tuner is not None:
            waited: float | None = None
            others: float | None = None
            if self._wait0 is not None:
                wait, wall = run_queue_ms(), (time.perf_counter() - self._wall0) * 1e3
                # the share of the step the training thread waited for a core, scaled to the step's time
                waited = (None if wait is None or wall <= 0 else
                          (wait - self._wait0) / wall * float(state.timing.get("step_ms", 0.0)))
            if self._others0 is not None:
                # other processes' runnable threads, sampled as the step began and as it ended
                after = others_running(torch.get_num_threads())
                others = None if after is None else (self._others0 + after) / 2
            self.tuner.observe(float(state.timing.get("step_ms", 0.0)), cut=cut, wait_ms=waited, others=others)
            self._apply()

    def on_fit_end(self, state: FitState) -> None:
        self._unhook()
        self._remember()

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self._unhook()

    def _remember(self) -> None:
        t = self.tuner
        if t is not None and (t.checks or t.remembered) and not t.measuring:
            remember(self.key, t.threads, t.recheck, t.since)

    def choice(self) -> ThreadChoice:
        t = self.tuner
        if t is None:
            assert self.fixed is not None
            return ThreadChoice(threads=self.fixed, source="user", max_threads=self.limit, given_by=self.given_by)
        return ThreadChoice(threads=t.threads, source="computed", max_threads=self.limit, candidates=t.candidates,
                            checks=list(t.checks), remembered=t.remembered,
                            steps_at={str(k): v for k, v in sorted(t.steps_at.items())})
