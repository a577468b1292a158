"""The health check: a fit-loop callback that records a run and names what is wrong with it.

:class:`HealthCheck` records cheap signals on every step (loss, global gradient norm, rate,
labels of the batch) and per-layer statistics (:class:`proftune.profile.LayerStats`) on sampled
steps: the first steps, every ``every``-th step, the step after a gradient spike, and the step
whose loss or gradients turned non-finite (re-run with forward hooks to find the layer that made
the first NaN), all into one :class:`History`. Its ``findings`` run every check of
``diagnose/checks/`` on that History and rank what they find. It works the same inside
:func:`proftune.train.fit` and inside :class:`proftune.Monitor`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
from collections import deque
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._tensors import global_grad_norm
from ..profile import LayerStatistics
from ..train import Callback, FitState
from ._findings import Finding, rank_findings
from ._history import History, NonFinite, StepRecord
from ._lrtest import RangeTest
from .checks import CHECKS

if TYPE_CHECKING:
    from ..profile import LayerStats

__all__ = ["HealthCheck"]

_log = logging.getLogger(__name__)

_WEIGHT_TYPES = ("Linear", "Conv1d", "Conv2d", "Conv3d", "LazyLinear")
_MAX_LABELS = 50_000
#: Saturating activations whose flat tails the check measures: the output range where the
#: derivative is below 1% of its peak (sigmoid: y < 0.01 or y > 0.99; tanh: |y| > 0.99).
_SATURATING = (nn.Sigmoid, nn.Tanh)


def _saturated_frac(module: nn.Module, y: torch.Tensor) -> float:
    y = y.detach().float()
    if isinstance(module, nn.Tanh):
        return float((y.abs() > 0.99).float().mean())
    return float(((y < 0.01) | (y > 0.99)).float().mean())


def _layer_stats_cls() -> type[LayerStats]:
    from ..profile import LayerStats

    return LayerStats


def _weight_norm(model: nn.Module) -> float:
    with torch.no_grad():
        total = sum(float(p.detach().float().pow(2).sum()) for p in model.parameters())
    return math.sqrt(total)


def _labels_of(batch: Any) -> torch.Tensor | None:
    """The integer class labels of an ``(inputs, labels)`` batch, else None."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        y = batch[1]
        if isinstance(y, torch.Tensor) and y.dim() == 1 and not y.is_floating_point() and y.numel() > 1:
            return y.detach().cpu()
    return None


def _batch_nonfinite(batch: Any) -> bool:
    """Whether a floating tensor of the batch (top level of a tuple/list/dict) holds NaN/Inf."""
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else [batch]
    return any(isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())
               for t in items)


class HealthCheck(Callback):
    """Watches a training run and reports :class:`Finding` s, most likely cause first.

    ``every``: per-layer statistics every N optimizer steps (plus the first three and the steps
    after a spike). ``spike_factor``: a gradient norm this many times its running median (over
    ``window`` steps) is a spike. ``dead_threshold``: a ReLU layer whose outputs are zero more
    than this fraction of the time has dead units.
    """

    def __init__(self, *, every: int = 10, spike_factor: float = 10.0, window: int = 50,
                 dead_threshold: float = 0.9, layer_stats: bool = True) -> None:
        problems = []
        if every < 1:
            problems.append(f"every must be at least 1, but got {every=}.")
        if spike_factor <= 1:
            problems.append(f"spike_factor must be > 1, but got {spike_factor=}.")
        if window < 3:
            problems.append(f"window must be at least 3, but got {window=}.")
        if not 0 < dead_threshold < 1:
            problems.append(f"dead_threshold must be in (0, 1), but got {dead_threshold=}.")
        if problems:
            from ..exceptions import ConfigError

            raise ConfigError(problems)
        self.every, self.spike_factor, self.window = every, spike_factor, window
        self.dead_threshold = dead_threshold
        self._ls_cls = _layer_stats_cls() if layer_stats else None
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded (a new run)."""
        self.history = History(spike_factor=self.spike_factor, dead_threshold=self.dead_threshold)
        self._recent: deque[float] = deque(maxlen=self.window)
        self._ls: Any = None
        self._sample_next = False
        self._n_labels = 0
        self._pending_norm = math.nan  # the step's gradient norm, from on_after_backward
        self._sat_step: int | None = None  # the sampled step whose sigmoid/tanh outputs are measured
        self._sat_handles: list[Any] = []

    # -- hooks ------------------------------------------------------------------------------
    def on_fit_start(self, state: FitState) -> None:
        self._detach()
        self.reset()
        self.history.params = dict(state.params or {})
        self.history.optimizer = type(state.optimizer).__name__ if state.optimizer is not None else None
        for name, module in state.model.named_modules():
            self.history.types[name] = type(module).__name__
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                self.history.batchnorm.append(name)
            weight = getattr(module, "weight", None)
            if type(module).__name__ in _WEIGHT_TYPES and isinstance(weight, torch.Tensor) and weight.dim() >= 2:
                self.history.fan_in[name] = int(weight[0].numel())
            if isinstance(module, _SATURATING):
                self._sat_handles.append(module.register_forward_hook(self._saturation_hook(name)))

    def _saturation_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            step = self._sat_step
            if step is None or not isinstance(output, torch.Tensor) or not output.is_floating_point():
                return
            per_step = self.history.saturation.setdefault(step, {})
            if name not in per_step and output.numel():
                per_step[name] = {"type": type(module).__name__, "saturated_frac": _saturated_frac(module, output)}
        return hook

    def _step_no(self, state: FitState) -> int:
        """The 1-based number of the step being run."""
        return state.step + 1

    def on_step_start(self, state: FitState) -> None:
        step = self._step_no(state)
        labels = _labels_of(state.batch)
        if labels is not None:
            self.history.batch_sizes.append(int(labels.numel()))
            if self._n_labels < _MAX_LABELS:
                self.history.labels.append(labels)
                self._n_labels += int(labels.numel())
        elif isinstance(state.batch, (tuple, list)) and state.batch and isinstance(state.batch[0], torch.Tensor):
            self.history.batch_sizes.append(int(state.batch[0].shape[0]))
        sampled = self.history.nonfinite is None and (step <= 3 or step % self.every == 0 or self._sample_next)
        self._sat_step = step if sampled and self._sat_handles else None
        if self._ls_cls is not None and sampled:
            self._sample_next = False
            x = state.batch[0] if isinstance(state.batch, (tuple, list)) and state.batch else state.batch
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                self.history.input_rms[step] = float(x.detach().float().pow(2).mean().sqrt())
            self._ls = self._ls_cls(state.model, activations=True, gradients=True, weights=True)
            self._ls.attach()

    def on_after_backward(self, state: FitState) -> None:
        step = self._step_no(state)
        norm = global_grad_norm(state.model)
        loss_t = state.loss_tensor
        # inside a Monitor the loss of this step may not be known yet (it arrives at mon.step)
        loss = float(loss_t.detach()) if loss_t is not None else 0.0
        stats = None
        if self._ls is not None:
            stats = self._ls.collect(optimizer=state.optimizer)
            self._detach_stats()
            self.history.samples.append((step, stats))
        self._pending_norm = norm
        self._sat_step = None
        if self.history.nonfinite is None and (not math.isfinite(loss) or not math.isfinite(norm)):
            self._locate_nonfinite(state, step, loss, norm, stats)

    def on_step_end(self, state: FitState) -> None:
        step = state.step
        norm = self._pending_norm
        self._pending_norm = math.nan
        loss = float(state.loss) if state.loss is not None else math.nan
        median = statistics.median(self._recent) if len(self._recent) >= 3 else math.nan
        ratio = norm / median if math.isfinite(norm) and median > 0 else math.nan
        if math.isfinite(ratio) and ratio >= self.spike_factor:
            self._sample_next = True
        if math.isfinite(norm):
            self._recent.append(norm)
        self.history.steps.append({"step": step, "loss": loss, "grad_norm": norm, "lr": state.lr,
                           "median": median, "ratio": ratio})
        if self.history.nonfinite is None and not math.isfinite(loss):
            self.history.nonfinite = {"step": step, "phase": "loss", "layer": None, "type": None,
                              "inputs_finite": None, "loss": loss}

    def on_epoch_end(self, state: FitState) -> None:
        entry: dict[str, float] = (dict(state.curves["epoch"][-1]) if state.curves.get("epoch")
                                   else {"epoch": state.epoch})
        entry.update(state.metrics)
        entry["weight_norm"] = _weight_norm(state.model)
        entry["step"] = state.step
        self.history.epochs.append(entry)

    def on_fit_end(self, state: FitState) -> None:
        self._detach()

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self._detach()

    def _detach(self) -> None:
        for h in self._sat_handles:
            h.remove()
        self._sat_handles.clear()
        self._sat_step = None
        self._detach_stats()

    def _detach_stats(self) -> None:
        if self._ls is not None:
            with contextlib.suppress(Exception):
                self._ls.detach()
            self._ls = None

    # -- NaN / Inf --------------------------------------------------------------------------
    def _locate_nonfinite(self, state: FitState, step: int, loss: float, norm: float,
                          stats: dict[str, LayerStatistics] | None) -> None:
        """Find the first layer (forward order) whose output turned non-finite, re-running the
        failing step's forward with hooks when this step was not sampled."""
        if stats is None and state.task is not None and self._ls_cls is not None:
            stats = self._rerun_forward(state)
        record: NonFinite = {"step": step, "loss": loss, "grad_norm": norm, "layer": None,
                                  "type": None, "phase": "forward" if not math.isfinite(loss) else "backward",
                                  "inputs_finite": None,
                                  # the weights this step's forward ran on (the optimizer has not stepped)
                                  "weights_finite": all(bool(torch.isfinite(p.detach()).all())
                                                        for p in state.model.parameters())}
        if stats:
            # the forward is to blame when any activation is non-finite (the loss may not be
            # known yet inside a Monitor): the first such layer in forward order made it
            for name, s in stats.items():
                act = s.get("activation") or {}
                if act.get("nonfinite", 0):
                    record.update({"phase": "forward", "layer": name, "type": self.history.types.get(name),
                                   "inputs_finite": not _batch_nonfinite(state.batch),
                                   "nonfinite_values": act["nonfinite"]})
                    break
            if record["layer"] is None and record["phase"] == "forward":
                # every layer's output finite, on finite inputs: the loss computation made it
                record.update({"layers_finite": True, "inputs_finite": not _batch_nonfinite(state.batch)})
            if record["phase"] == "backward":
                for name in reversed(list(stats)):
                    grad = stats[name].get("grad") or {}
                    if grad.get("nonfinite", 0):
                        record.update({"layer": name, "type": self.history.types.get(name)})
                        break
        self.history.nonfinite = record

    def _rerun_forward(self, state: FitState) -> dict[str, LayerStatistics] | None:
        assert self._ls_cls is not None
        ls = self._ls_cls(state.model, activations=True, gradients=False, weights=True)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            ls.attach()
            try:
                state.task.loss(state.model, state.batch)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001, RUF100  (the forward may raise on bad values; stats so far tell)
                _log.debug("re-running the non-finite step's forward raised", exc_info=True)
            finally:
                ls.detach()
        try:
            return ls.collect()
        except Exception:  # noqa: BLE001, RUF100  (no statistics: the finding then names no layer)
            _log.debug("collecting the re-run's layer statistics failed", exc_info=True)
            return None

    # -- lr range test ----------------------------------------------------------------------
    @property
    def wants_lr_test(self) -> bool:
        """Whether a range test would confirm or refute an lr finding of this run (a rise, a
        plateau, slow progress or an oscillating loss)."""
        h = self.history
        return h.lr_test is None and bool(h.lr_rise() or h.plateau() or h.slow_progress() or h.oscillation())

    @property
    def wants_nan_probe(self) -> bool:
        """Whether the run's loss turned non-finite where the rate could be blamed (neither an op
        that makes NaN from finite inputs nor a NaN in the data): ``nan_probe`` tells."""
        nf = self.history.nonfinite
        if self.history.nan_probe is not None or nf is None or not self.history.lrs():
            return False
        named = nf.get("layer") is not None and nf.get("phase") == "forward"
        return not (named and nf.get("inputs_finite") is False)

    @property
    def wants_decay_probe(self) -> bool:
        """Whether the run sat on a noisy floor at a constant rate (``decay_probe`` tells why)."""
        h = self.history
        return h.decay_probe is None and h.nonfinite is None and h.constant_lr() is not None \
            and h.stalled_tail() is not None

    @property
    def wants_warmup_probe(self) -> bool:
        """Whether the run started at its full rate where warm-up is expected and went badly."""
        from .checks._schedule import warmup_suspected

        return self.history.warmup_probe is None and warmup_suspected(self.history)

    def add_lr_test(self, result: RangeTest) -> None:
        """Attach an LR range test of the same task and params (see :func:`lr_range_test`)."""
        self.history.lr_test = result

    # -- what was recorded (the History holds it all) ------------------------------------------
    @property
    def steps(self) -> list[StepRecord]:
        """One record per optimizer step (loss, gradient norm, lr, running median and ratio)."""
        return self.history.steps

    @property
    def epochs(self) -> list[dict[str, float]]:
        """The epoch curve rows with the evaluated metrics and the weight norm."""
        return self.history.epochs

    @property
    def lr_test(self) -> RangeTest | None:
        return self.history.lr_test

    # -- findings ---------------------------------------------------------------------------
    @property
    def findings(self) -> list[Finding]:
        """The findings so far, most likely cause first (every check of ``CHECKS`` runs)."""
        found = [f for f in (c.check(self.history) for c in CHECKS) if f is not None]
        return rank_findings(found)
