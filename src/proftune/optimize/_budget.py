"""The wall-clock budget of one optimize run: each stage's share, carried forward when unspent."""

from __future__ import annotations

import math
import time

from ..train import Callback, FitState
from ._stages import OPTIMIZE_STAGES, SHARES

__all__ = ["Budget", "Deadline"]

#: Kept back for writing the outputs (config, summary, plots) after the last stage.
RESERVE = 0.03


class Budget:
    """Seconds left to the run and to each stage, from one total.

    ``spent`` holds seconds already spent by earlier processes (a resumed run), so that a
    resume continues the same clock rather than starting a new budget.
    """

    def __init__(self, total_s: float, *, spent_s: float = 0.0, skip: tuple[str, ...] = ()) -> None:
        self.total_s = float(total_s)
        self.started = time.monotonic() - float(spent_s)
        #: Stages that will not run (``--goal none``: compress); their share goes to the others.
        self.skip = tuple(skip)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def end(self) -> float:
        """``time.monotonic()`` by which the stages must be done (the output reserve excluded)."""
        return self.started + self.total_s * (1.0 - RESERVE)

    @property
    def left_s(self) -> float:
        return max(0.0, self.total_s * (1.0 - RESERVE) - self.elapsed_s)

    def stage_s(self, stage: str) -> float:
        """Seconds for ``stage`` now: its share of what is left among it and the stages after it."""
        if stage in self.skip:
            return 0.0
        idx = OPTIMIZE_STAGES.index(stage)
        rest = sum(SHARES[s] for s in OPTIMIZE_STAGES[idx:] if s not in self.skip)
        return self.left_s * SHARES[stage] / rest if rest > 0 else 0.0


class Deadline(Callback):
    """Stop the fit loop after the step that passes ``seconds`` since the fit started.

    Counted from ``on_fit_start`` (after the model and data are built), so a slow first data
    load does not eat the training. At least ``min_steps`` steps run.
    """

    def __init__(self, seconds: float, *, min_steps: int = 1) -> None:
        self.seconds, self.min_steps = max(0.0, float(seconds)), int(min_steps)
        self.deadline = math.inf
        self.hit = False

    def on_fit_start(self, state: FitState) -> None:
        self.deadline = time.monotonic() + self.seconds

    def on_step_end(self, state: FitState) -> None:
        if state.step >= self.min_steps and time.monotonic() >= self.deadline:
            self.hit = True
            state.request_stop("optimize: the stage's time budget is spent")
