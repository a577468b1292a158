"""What the built-in stages measure and compare with, beside the public API they call: the fit
callback that keeps the model and the metric's curve, a task's steps and samples per epoch, the
final model's latency, a compress candidate's figures, and params compared as values.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .._holdout import count_samples
from .._jsonsafe import finite_float
from .._train_params import TrainParams
from ..compress import Candidate
from ..exceptions import ConfigError
from ..profile import task_latencies
from ..task import Task
from ..train import Callback, FitState
from ._records import ModelFigures

__all__ = ["ModelCapture", "figures_of", "model_latency_ms", "params_key", "profile_steps", "same_value", "step_s",
           "steps_per_epoch", "too_few_steps", "train_samples"]

log = logging.getLogger(__name__)


class ModelCapture(Callback):
    """Keeps the fit loop's model at the end (diagnose returns findings, not the model), and the
    metric ``metric`` after each epoch (the defaults' own learning curve)."""

    def __init__(self, metric: str | None = None) -> None:
        self.model: nn.Module | None = None
        self.metric = metric
        self.curve: list[float | None] = []

    def on_epoch_end(self, state: FitState) -> None:
        if self.metric is not None:
            self.curve.append(finite_float(state.metrics.get(self.metric)))

    def on_fit_end(self, state: FitState) -> None:
        self.model = state.model


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return bool(a == b)


def params_key(params: Mapping[str, object]) -> str:
    return repr(sorted((k, round(float(v), 12) if isinstance(v, float) else v) for k, v in params.items()))


def figures_of(c: Candidate, *, method: bool = True, format: bool = False, within_budget: bool = False,
             test_metric: float | None = None) -> ModelFigures:
    """A compress candidate as the stage keeps it: its figures (``method=False``: the
    uncompressed model), with its file format, budget verdict or held-out metric where asked."""
    return ModelFigures(method=c.method if method else None, ratio=c.ratio if method else None, metric=c.metric,
                        metric_drop=c.metric_drop if method else None, test_metric=test_metric,
                        latency_ms=c.latency_ms, latency_batch_ms=c.latency_batch_ms, size_bytes=c.size_bytes,
                        params=c.params, macs=c.macs, batch_size=c.batch_size, format=c.format if format else None,
                        within_budget=c.within_budget if within_budget else None)


def steps_per_epoch(task: Task, params: TrainParams) -> int:
    data = task.train_data(params.batch_size or 32, params.params)
    n = getattr(data, "__len__", None)
    return int(n()) if callable(n) else 1


#: Up to this many (batches x batch size), the training samples are counted in one pass of the data.
def step_s(epoch_s: float, task: Task, params: TrainParams) -> float:
    """Seconds of one training step of the defaults, as a training pays it (an epoch's wall clock over its steps)."""
    return max(epoch_s / max(1, steps_per_epoch(task, params)), 1e-4)


#: The health stage's profile: at most this many measured steps (``profile``'s default), and the
#: steps it runs besides them (a warm-up, the memory and statistics steps, the static count).
PROFILE_STEPS = 3
PROFILE_FIXED_STEPS = 4


def profile_steps(share_s: float, step_s: float) -> int:
    """The profile's measured steps (1-3) for a stage of ``share_s`` seconds: the full profile runs
    each twice (timed, then per layer); at a whole-set batch its nine steps were nine epochs."""
    return int(min(PROFILE_STEPS, max(1, (share_s / step_s - PROFILE_FIXED_STEPS) // 2)))


#: The compute stage measures only where its share holds this many training steps (the range test's
#: ten at least, the rest for the noise scale and the batch's cost check).
COMPUTE_MIN_STEPS = 24


def too_few_steps(share_s: float, step_s: float) -> str | None:
    """Why the compute stage measures nothing in ``share_s`` seconds (None: it measures). A range
    test of fewer than ten steps reads noise, and its check and the batch's cost check cost more
    trainings again: over 40 generated tasks at 8 trainings such a stage took up to 69% of the
    budget, and its centre was the search's best on 1 task of 17."""
    steps = share_s / step_s
    if steps >= COMPUTE_MIN_STEPS:
        return None
    return (f"its share, {share_s:.2f} s, holds {steps:.0f} training steps of {step_s * 1e3:.3g} ms, fewer than the "
            f"{COMPUTE_MIN_STEPS} a range test and its check need: the search centres on the task's defaults")


COUNT_SAMPLES_UP_TO = 200_000


def train_samples(task: Task, params: TrainParams) -> int | None:
    """Training samples per epoch, when the data has a length: counted in one pass where that is
    cheap, else the upper bound batches x batch size (a batch of 4096 on 1,097 samples gave 4096,
    and the search's batches then never went below 128)."""
    bs = params.batch_size or 32
    data = task.train_data(bs, params.params)
    n = getattr(data, "__len__", None)
    if not callable(n):
        return None
    bound = int(n()) * bs
    return count_samples(data) if bound <= COUNT_SAMPLES_UP_TO else bound


def model_latency_ms(task: Task, model: nn.Module, device: torch.device) -> float | None:
    """``latency_ms`` of the model at batch 1 on ``device``, the run's (its one producer,
    :func:`proftune.profile.task_latencies`); None when the task's loss does not feed the model
    inputs that can be sliced to one sample."""
    try:
        return task_latencies(task, model.to(device), (1,), device=device, rounds=5)[1].ms
    except (ConfigError, RuntimeError, TypeError, ValueError) as exc:
        log.info("no latency for the final model: %s", exc)
        return None
