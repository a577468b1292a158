"""The health checks: a fit-loop callback that watches training and names what is wrong.

:class:`HealthCheck` records cheap signals on every step (loss, global gradient norm, rate,
labels of the batch) and per-layer statistics (:class:`proftune.profile.LayerStats`) on sampled
steps: the first steps, every ``every``-th step, the step after a gradient spike, and the step
whose loss or gradients turned non-finite (re-run with forward hooks to find the layer that made
the first NaN). Its ``findings`` turn these into ranked :class:`Finding` s. It works the same
inside :func:`proftune.train.fit` and inside :class:`proftune.Monitor`.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._tensors import global_grad_norm
from ..train import Callback, FitState
from ._findings import Finding, rank_findings
from ._lrtest import RangeTest

__all__ = ["HealthCheck"]

_RELU_TYPES = ("ReLU", "ReLU6")
_WEIGHT_TYPES = ("Linear", "Conv1d", "Conv2d", "Conv3d", "LazyLinear")
#: std * sqrt(fan_in) of PyTorch's default init of Linear/Conv (kaiming_uniform, a=sqrt(5)).
_DEFAULT_INIT_SCALE = 1.0 / math.sqrt(3.0)
_MAX_LABELS = 50_000


def _layer_stats_cls() -> Any:
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


def _fmt(x: float) -> str:
    return f"{x:.3g}"


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
        self.steps: list[dict[str, Any]] = []
        self.samples: list[tuple[int, dict[str, dict[str, Any]]]] = []
        self.epochs: list[dict[str, Any]] = []
        self.labels: list[torch.Tensor] = []
        self.nonfinite: dict[str, Any] | None = None
        self.lr_test: RangeTest | None = None
        self.batchnorm: list[str] = []
        self.batch_sizes: list[int] = []
        self.fan_in: dict[str, int] = {}
        self.types: dict[str, str] = {}
        self.input_rms: dict[int, float] = {}
        self._recent: deque[float] = deque(maxlen=self.window)
        self._ls: Any = None
        self._sample_next = False
        self._n_labels = 0
        self._current_lr: float | None = None
        self._params: dict[str, Any] = {}
        self._pending_norm = math.nan  # the step's gradient norm, from on_after_backward

    # -- hooks ------------------------------------------------------------------------------
    def on_fit_start(self, state: FitState) -> None:
        self.reset()
        self._params = dict(state.params or {})
        for name, module in state.model.named_modules():
            self.types[name] = type(module).__name__
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                self.batchnorm.append(name)
            weight = getattr(module, "weight", None)
            if type(module).__name__ in _WEIGHT_TYPES and isinstance(weight, torch.Tensor) and weight.dim() >= 2:
                self.fan_in[name] = int(weight[0].numel())

    def _step_no(self, state: FitState) -> int:
        """The 1-based number of the step being run."""
        return state.step + 1

    def on_step_start(self, state: FitState) -> None:
        step = self._step_no(state)
        labels = _labels_of(state.batch)
        if labels is not None:
            self.batch_sizes.append(int(labels.numel()))
            if self._n_labels < _MAX_LABELS:
                self.labels.append(labels)
                self._n_labels += int(labels.numel())
        elif isinstance(state.batch, (tuple, list)) and state.batch and isinstance(state.batch[0], torch.Tensor):
            self.batch_sizes.append(int(state.batch[0].shape[0]))
        if self._ls_cls is not None and self.nonfinite is None and (
            step <= 3 or step % self.every == 0 or self._sample_next
        ):
            self._sample_next = False
            x = state.batch[0] if isinstance(state.batch, (tuple, list)) and state.batch else state.batch
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                self.input_rms[step] = float(x.detach().float().pow(2).mean().sqrt())
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
            self._detach()
            self.samples.append((step, stats))
        self._pending_norm = norm
        if self.nonfinite is None and (not math.isfinite(loss) or not math.isfinite(norm)):
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
        self.steps.append({"step": step, "loss": loss, "grad_norm": norm, "lr": state.lr,
                           "median": median, "ratio": ratio})
        if self.nonfinite is None and not math.isfinite(loss):
            self.nonfinite = {"step": step, "phase": "loss", "layer": None, "type": None,
                              "inputs_finite": None, "loss": loss}

    def on_epoch_end(self, state: FitState) -> None:
        entry: dict[str, Any] = (dict(state.curves["epoch"][-1]) if state.curves.get("epoch")
                                 else {"epoch": state.epoch})
        entry.update(state.metrics)
        entry["weight_norm"] = _weight_norm(state.model)
        entry["step"] = state.step
        self.epochs.append(entry)

    def on_fit_end(self, state: FitState) -> None:
        self._detach()

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self._detach()

    def _detach(self) -> None:
        if self._ls is not None:
            with contextlib.suppress(Exception):
                self._ls.detach()
            self._ls = None

    # -- NaN / Inf --------------------------------------------------------------------------
    def _locate_nonfinite(self, state: FitState, step: int, loss: float, norm: float,
                          stats: dict[str, dict[str, Any]] | None) -> None:
        """Find the first layer (forward order) whose output turned non-finite, re-running the
        failing step's forward with hooks when this step was not sampled."""
        if stats is None and state.task is not None and self._ls_cls is not None:
            stats = self._rerun_forward(state)
        record: dict[str, Any] = {"step": step, "loss": loss, "grad_norm": norm, "layer": None,
                                  "type": None, "phase": "forward" if not math.isfinite(loss) else "backward",
                                  "inputs_finite": None}
        if stats:
            # the forward is to blame when any activation is non-finite (the loss may not be
            # known yet inside a Monitor): the first such layer in forward order made it
            for name, s in stats.items():
                act = s.get("activation") or {}
                if act.get("nonfinite", 0):
                    record.update(phase="forward", layer=name, type=self.types.get(name),
                                  inputs_finite=not _batch_nonfinite(state.batch),
                                  nonfinite_values=act.get("nonfinite"))
                    break
            if record["phase"] == "backward":
                for name in reversed(list(stats)):
                    grad = stats[name].get("grad") or {}
                    if grad.get("nonfinite", 0):
                        record.update(layer=name, type=self.types.get(name))
                        break
        self.nonfinite = record

    def _rerun_forward(self, state: FitState) -> dict[str, dict[str, Any]] | None:
        assert self._ls_cls is not None
        ls = self._ls_cls(state.model, activations=True, gradients=False, weights=True)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            ls.attach()
            try:
                state.task.loss(state.model, state.batch)  # type: ignore[union-attr]
            except Exception:  # the forward itself may raise on bad values; stats so far still tell
                pass
            finally:
                ls.detach()
        try:
            return ls.collect()
        except Exception:
            return None

    # -- lr range test ----------------------------------------------------------------------
    @property
    def wants_lr_test(self) -> bool:
        """Whether a range test would confirm or refute an lr finding of this run."""
        return self.lr_test is None and bool(self._lr_rise() or self._plateau())

    def add_lr_test(self, result: RangeTest) -> None:
        """Attach an LR range test of the same task and params (see :func:`lr_range_test`)."""
        self.lr_test = result

    # -- findings ---------------------------------------------------------------------------
    @property
    def findings(self) -> list[Finding]:
        """The findings so far, most likely cause first."""
        found: list[Finding] = []
        roots: list[str] = []
        for check in (self._check_lr_high, self._check_unshuffled, self._check_exploding,
                      self._check_vanishing, self._check_dead, self._check_nonfinite,
                      self._check_overfitting, self._check_lr_low, self._check_batchnorm):
            result = check()
            if result is None:
                continue
            finding, is_root = result
            found.append(finding)
            if is_root:
                roots.append(finding.cause)
        return rank_findings(found, roots=roots)

    def _losses(self) -> list[tuple[int, float]]:
        return [(r["step"], r["loss"]) for r in self.steps]

    def _lr(self) -> float | None:
        for r in reversed(self.steps):
            if r["lr"] is not None:
                return float(r["lr"])
        lr = self._params.get("lr")
        return float(lr) if lr is not None else None

    def _smoothed(self, beta: float = 0.8) -> list[tuple[int, float]]:
        out, avg = [], 0.0
        finite = [(s, v) for s, v in self._losses() if math.isfinite(v)]
        for i, (s, v) in enumerate(finite):
            avg = beta * avg + (1 - beta) * v
            out.append((s, avg / (1 - beta ** (i + 1))))
        return out

    def _lr_rise(self) -> dict[str, Any] | None:
        """The loss rose back by more than half of the progress made (or blew up)."""
        curve = self._smoothed()
        if len(curve) < 5:
            return None
        start = statistics.fmean(v for _, v in curve[:3])
        low, low_step, onset, peak, peak_step = math.inf, 0, None, -math.inf, 0
        low_before, low_before_step = math.nan, 0
        for s, v in curve:
            if onset is None:
                progress = max(start - low, 0.1 * start) if math.isfinite(low) else 0.1 * start
                if math.isfinite(low) and v > low + 0.5 * progress and v > 1.2 * low:
                    onset, low_before, low_before_step = s, low, low_step
            if v > peak and onset is not None:
                peak, peak_step = v, s
            if v < low:
                low, low_step = v, s
        blew_up = self.nonfinite is not None and len(curve) >= 5
        if onset is None and not blew_up:
            return None
        final = curve[-1][1]
        tail = [v for s, v in self._losses()[-max(len(curve) // 5, 5):] if math.isfinite(v)]
        if onset is None:
            low_before, low_before_step = low, low_step
            assert self.nonfinite is not None
            peak, peak_step = math.inf, int(self.nonfinite["step"])
        return {"start_loss": start, "min_loss": low_before, "min_step": low_before_step,
                "min_loss_overall": low,
                "peak_loss": peak, "peak_step": peak_step,
                "final_loss": final, "onset": onset if onset is not None else self.nonfinite["step"],  # type: ignore[index]
                "ended_above_start": final > start,
                "tail_cv": statistics.pstdev(tail) / max(statistics.fmean(tail), 1e-12) if len(tail) > 1 else None}

    def _check_lr_high(self) -> tuple[Finding, bool] | None:
        rise = self._lr_rise()
        if rise is None:
            return None
        lr = self._lr()
        evidence: dict[str, Any] = {**rise, "lr": lr}
        peak = "a non-finite value" if not math.isfinite(rise["peak_loss"]) else _fmt(rise["peak_loss"])
        summary = (f"loss rose from its low of {_fmt(rise['min_loss'])} (step {rise['min_step']}) "
                   f"to {peak} (step {rise['peak_step']})")
        confidence, severity = 0.5, "warning"
        test = self.lr_test
        if test is not None and lr is not None:
            evidence["range_test"] = test.to_dict()
            if lr > test.best_lr:
                confidence = 0.9
                severity = "error" if rise["ended_above_start"] else "warning"
                summary += (f"; a range test puts the safe maximum at lr {_fmt(test.best_lr)}, "
                            f"below the current {_fmt(lr)}")
            else:
                confidence, severity = 0.3, "info"
                summary += f"; a range test finds the current lr {_fmt(lr)} at or below the safe maximum {_fmt(test.best_lr)}"
        safe = test.best_lr if test is not None and lr is not None and lr > test.best_lr else None
        fix = (f"lower the learning rate to about {_fmt(safe / 3)} (a third of the range test's "
               "safe maximum), or add warm-up; proftune.AdaptiveLR lowers it online"
               if safe else "lower the learning rate (3-10x) or add warm-up; proftune.AdaptiveLR lowers it online")
        return Finding("lr_too_high", severity, summary, fix, evidence, confidence, step=rise["onset"]), False

    def _check_unshuffled(self) -> tuple[Finding, bool] | None:
        if len(self.labels) < 4:
            return None
        seq = torch.cat(self.labels)
        classes, counts = torch.unique(seq, return_counts=True)
        if classes.numel() < 2:
            return None
        p = counts.double() / counts.sum()
        expected_same = float((p**2).sum())
        same = float((seq[1:] == seq[:-1]).double().mean())
        per_batch = [int(torch.unique(y).numel()) for y in self.labels]
        bs = statistics.median(int(y.numel()) for y in self.labels)
        expected_unique = float((1 - (1 - p) ** bs).sum())
        unique = statistics.fmean(per_batch)
        ys = seq.double()
        autocorr = float(torch.corrcoef(torch.stack([ys[1:], ys[:-1]]))[0, 1]) if ys.std() > 0 else 0.0
        excess = (same - expected_same) / max(1 - expected_same, 1e-9)
        diversity = unique / max(expected_unique, 1e-9)
        if excess < 0.3 and diversity > 0.7:
            return None
        strong = excess > 0.6 or diversity < 0.4
        evidence = {"adjacent_same_label": same, "expected_if_shuffled": expected_same,
                    "label_autocorrelation": autocorr, "labels_per_batch": unique,
                    "expected_labels_per_batch": expected_unique, "batches_seen": len(self.labels),
                    "classes": int(classes.numel())}
        summary = (f"consecutive samples share a label {same:.0%} of the time (shuffled: {expected_same:.0%}); "
                   f"batches hold {unique:.1f} distinct labels (shuffled: {expected_unique:.1f})")
        fix = "shuffle the training data every epoch (DataLoader(shuffle=True) or a sampler)"
        return Finding("unshuffled_data", "error" if strong else "warning", summary, fix, evidence,
                       0.95 if strong else 0.7, step=1), strong

    def _spikes(self) -> list[dict[str, Any]]:
        return [r for r in self.steps if math.isfinite(r["ratio"]) and r["ratio"] >= self.spike_factor]

    def _culprit(self) -> dict[str, Any] | None:
        """A Linear/Conv layer whose weights are far off the default init scale at the first sample,
        and the activation gain it brings."""
        if not self.samples:
            return None
        step, stats = self.samples[0]
        scales: dict[str, float] = {}
        for name, s in stats.items():
            w = s.get("weight") or {}
            if name in self.fan_in and "std" in w and math.isfinite(w["std"]):
                scales[name] = float(w["std"]) * math.sqrt(self.fan_in[name])
        if not scales:
            return None
        for name, scale in scales.items():
            others = [v for k, v in scales.items() if k != name]
            ref = statistics.median(others) if others else _DEFAULT_INIT_SCALE
            if scale >= 10 * _DEFAULT_INIT_SCALE and scale >= 10 * ref:
                return {"layer": name, "type": self.types.get(name), "weight_scale": scale,
                        "reference_scale": ref, "times_reference": scale / ref,
                        "activation_gain": self._gain(stats, name, step), "sampled_step": step}
        return None

    def _gain(self, stats: dict[str, dict[str, Any]], layer: str, step: int) -> float | None:
        """RMS of ``layer``'s output over the RMS of the layer before it in forward order."""
        prev: float | None = self.input_rms.get(step)
        for name, s in stats.items():
            act = s.get("activation") or {}
            if "std" not in act:
                continue
            rms = math.sqrt(float(act["std"]) ** 2 + float(act.get("mean", 0.0)) ** 2)
            if name == layer:
                return rms / prev if prev else None
            prev = rms
        return None

    def _first_layer_of_spike(self, spike_step: int) -> dict[str, Any] | None:
        """At the first sampled step at or after the spike, the first layer (forward order) whose
        gradient norm grew most against its own earlier median."""
        before = [(s, st) for s, st in self.samples if s < spike_step]
        after = [(s, st) for s, st in self.samples if s >= spike_step]
        if not before or not after:
            return None
        step, stats = after[0]
        best: dict[str, Any] | None = None
        for name, s in stats.items():
            g = (s.get("grad") or {}).get("norm")
            base = [float((st.get(name, {}).get("grad") or {}).get("norm", math.nan)) for _, st in before]
            base = [b for b in base if math.isfinite(b) and b > 0]
            if g is None or not base or not math.isfinite(float(g)):
                continue
            ratio = float(g) / statistics.median(base)
            if ratio >= self.spike_factor:
                return {"layer": name, "grad_norm": float(g), "baseline": statistics.median(base),
                        "ratio": ratio, "sampled_step": step}
            if best is None or ratio > best["ratio"]:
                best = {"layer": name, "grad_norm": float(g), "baseline": statistics.median(base),
                        "ratio": ratio, "sampled_step": step}
        return best

    def _check_exploding(self) -> tuple[Finding, bool] | None:
        spikes = self._spikes()
        culprit = self._culprit()
        grads_nonfinite = self.nonfinite is not None and self.nonfinite.get("phase") == "backward"
        if not spikes and not grads_nonfinite:
            return None
        if not culprit and len(spikes) < 2 and not grads_nonfinite and max(r["ratio"] for r in spikes) < 3 * self.spike_factor:
            return None
        first = spikes[0] if spikes else {"step": self.nonfinite["step"], "grad_norm": math.inf,  # type: ignore[index]
                                          "median": math.nan, "ratio": math.inf}
        peak = max(spikes, key=lambda r: r["ratio"]) if spikes else first
        evidence: dict[str, Any] = {"spikes": len(spikes), "first_spike_grad_norm": first["grad_norm"],
                                    "running_median": first["median"], "first_spike_ratio": first["ratio"],
                                    "max_ratio": peak["ratio"], "max_ratio_step": peak["step"],
                                    "spike_factor": self.spike_factor}
        layer = None
        if culprit:
            evidence["culprit"] = culprit
            layer = culprit["layer"]
            summary = (f"gradient norm spiked to {_fmt(peak['ratio'])}x its running median (step {peak['step']}); "
                       f"layer {layer} ({culprit['type']}) has weights {_fmt(culprit['times_reference'])}x the scale "
                       f"of the other layers (std*sqrt(fan_in) {_fmt(culprit['weight_scale'])})")
            fix = (f"re-initialise {layer} at the default scale (e.g. nn.init.kaiming_uniform_); "
                   "clip gradients (grad_clip, proftune.GradGuard) as a guard")
        else:
            where = self._first_layer_of_spike(first["step"])
            if where:
                evidence["first_layer"] = where
                layer = where["layer"]
            summary = (f"{len(spikes)} gradient norm spikes, up to {_fmt(peak['ratio'])}x the running median "
                       f"(first at step {first['step']}{', starting in layer ' + layer if layer else ''})")
            fix = "clip gradients (param grad_clip or proftune.GradGuard), lower the learning rate, or add normalisation"
        severity = "error" if culprit or grads_nonfinite or peak["ratio"] >= 100 else "warning"
        confidence = 0.9 if culprit else 0.6
        return Finding("exploding_gradients", severity, summary, fix, evidence, confidence,
                       step=first["step"], layer=layer), bool(culprit)

    def _layer_grad_norms(self) -> dict[str, float]:
        """Median gradient norm of each weight layer over the sampled steps, forward order."""
        out: dict[str, list[float]] = {}
        for _, stats in self.samples:
            norms = {name: float((s.get("grad") or {}).get("norm", math.nan))
                     for name, s in stats.items() if name in self.fan_in}
            # a layer with exactly zero gradient is dead (no signal at all), not vanishing
            if not norms or not all(math.isfinite(g) and g > 0 for g in norms.values()):
                continue
            for name, g in norms.items():
                out.setdefault(name, []).append(g)
        return {k: statistics.median(v) for k, v in out.items()}

    def _check_vanishing(self) -> tuple[Finding, bool] | None:
        norms = self._layer_grad_norms()
        if len(norms) < 3:
            return None
        names = list(norms)
        k = max(1, len(names) // 3)
        early = statistics.fmean(norms[n] for n in names[:k])
        late = statistics.fmean(norms[n] for n in names[-k:])
        if late <= 0:
            return None
        ratio = early / late
        if ratio >= 1e-2:
            return None
        severity = "warning" if ratio < 1e-3 else "info"
        evidence = {"early_grad_norm": early, "late_grad_norm": late, "ratio": ratio,
                    "early_layers": names[:k], "late_layers": names[-k:], "per_layer": norms}
        summary = (f"early layers' gradient norms are {_fmt(ratio)} of the late layers' "
                   f"({_fmt(early)} vs {_fmt(late)})")
        fix = ("use ReLU-family activations instead of saturating ones, residual connections, "
               "normalisation layers, or a variance-preserving init (kaiming/xavier)")
        step = self.samples[0][0] if self.samples else None
        return Finding("vanishing_gradients", severity, summary, fix, evidence,
                       0.8 if ratio < 1e-3 else 0.4, step=step, layer=names[0]), False

    def _check_dead(self) -> tuple[Finding, bool] | None:
        """ReLU layers whose outputs are zero over ``dead_threshold`` of the time, or half of
        whose units are (``dead_frac`` of LayerStats: units zero on >90% of a step's samples)."""
        per_layer: dict[str, list[tuple[int, float, float]]] = {}
        for step, stats in self.samples:
            for name, s in stats.items():
                if self.types.get(name) not in _RELU_TYPES:
                    continue
                act = s.get("activation") or {}
                z = act.get("zero_frac")
                if z is None or act.get("nonfinite", 0) or not math.isfinite(float(z)):
                    continue
                dead = act.get("dead_frac")
                per_layer.setdefault(name, []).append(
                    (step, float(z), float(dead) if dead is not None else math.nan))

        def bad(z: float, d: float) -> bool:
            return z > self.dead_threshold or (math.isfinite(d) and d >= 0.5)

        worst: dict[str, Any] | None = None
        for name, rows in per_layer.items():
            tail = rows[len(rows) // 2:]
            zero = statistics.fmean(z for _, z, _ in tail)
            deads = [d for _, _, d in tail if math.isfinite(d)]
            dead = statistics.fmean(deads) if deads else math.nan
            if not bad(zero, dead):
                continue
            onset = next(step for step, z, d in rows if bad(z, d))
            key = (zero, dead if math.isfinite(dead) else 0.0)
            if worst is None or key > worst["key"]:
                worst = {"layer": name, "zero_frac": zero, "dead_frac": dead, "onset": onset,
                         "samples": len(rows), "key": key}
        if worst is None:
            return None
        at_init = worst["onset"] == self.samples[0][0]
        evidence = {"zero_frac": worst["zero_frac"], "dead_unit_frac": worst["dead_frac"],
                    "threshold": self.dead_threshold, "sampled_steps": worst["samples"],
                    "per_layer": {k: statistics.fmean(z for _, z, _ in v[len(v) // 2:])
                                  for k, v in per_layer.items()},
                    "dead_from_init": at_init}
        dead_txt = (f", {worst['dead_frac']:.0%} of its units are zero on >90% of samples"
                    if math.isfinite(worst["dead_frac"]) else "")
        summary = (f"ReLU outputs of {worst['layer']} are zero {worst['zero_frac']:.0%} of the time{dead_txt} "
                   f"(from step {worst['onset']}{', i.e. at init' if at_init else ''})")
        fix = ("check the biases and init of the layer before it (biases near 0, kaiming init), lower "
               "the learning rate, or use LeakyReLU/GELU")
        severe = worst["zero_frac"] > 0.99 or (math.isfinite(worst["dead_frac"]) and worst["dead_frac"] > 0.9)
        return Finding("dead_units", "error" if severe else "warning", summary, fix, evidence,
                       0.95 if at_init else 0.7, step=worst["onset"], layer=worst["layer"]), at_init

    def _check_nonfinite(self) -> tuple[Finding, bool] | None:
        nf = self.nonfinite
        if nf is None:
            return None
        evidence = {k: v for k, v in nf.items() if k not in ("step", "layer")}
        layer = nf.get("layer")
        produced = nf.get("phase") == "forward" and layer is not None and nf.get("inputs_finite")
        earlier_spike = any(r["step"] < nf["step"] for r in self._spikes())
        if produced:
            summary = (f"layer {layer} ({nf.get('type')}) produced non-finite outputs from finite inputs at "
                       f"step {nf['step']}")
            fix = (f"guard the op in {layer} (clamp its input, add an epsilon, use a numerically stable "
                   "form such as log1p/logsumexp)")
        elif nf.get("phase") == "forward" and layer is not None and nf.get("inputs_finite") is False:
            summary = f"the input batch of step {nf['step']} holds NaN/Inf; {layer} passed it on"
            fix = "clean the data (check the loader and the preprocessing for NaN/Inf, e.g. division by a zero std)"
        elif nf.get("phase") == "backward":
            summary = f"gradients became non-finite at step {nf['step']}" + (f" in {layer}" if layer else "")
            fix = "clip gradients (grad_clip, proftune.GradGuard), check ops with unbounded derivatives"
        else:
            summary = f"loss became {nf.get('loss')} at step {nf['step']}" + (f", first in {layer}" if layer else "")
            fix = "lower the learning rate, clip gradients, or guard the op that overflows"
        root = bool(produced or nf.get("inputs_finite") is False) and not earlier_spike
        return Finding("nan_inf", "error", summary, fix, evidence, 0.95 if root else 0.6,
                       step=nf["step"], layer=layer), root

    def _check_overfitting(self) -> tuple[Finding, bool] | None:
        ep = [e for e in self.epochs if math.isfinite(float(e.get("val_loss", math.nan)))
              and math.isfinite(float(e.get("train_loss", math.nan)))]
        if len(ep) < 3:
            return None
        vals = [float(e["val_loss"]) for e in ep]
        best = min(range(len(vals)), key=vals.__getitem__)
        if best >= len(vals) - 1:
            return None
        gap_best = vals[best] - float(ep[best]["train_loss"])
        gap_end = vals[-1] - float(ep[-1]["train_loss"])
        rise = vals[-1] / max(vals[best], 1e-12) - 1
        train_fell = float(ep[-1]["train_loss"]) < float(ep[best]["train_loss"])
        if not (train_fell and gap_end > gap_best and rise > 0.05):
            return None
        w0, w1 = ep[best].get("weight_norm"), ep[-1].get("weight_norm")
        evidence = {"best_epoch": ep[best].get("epoch", best + 1), "best_val_loss": vals[best],
                    "final_val_loss": vals[-1], "val_loss_rise": rise, "gap_at_best": gap_best,
                    "gap_at_end": gap_end, "weight_norm_at_best": w0, "weight_norm_at_end": w1}
        severity = "warning" if rise > 0.25 and len(vals) - 1 - best >= 2 else "info"
        summary = (f"validation loss rose {rise:.0%} since epoch {evidence['best_epoch']} while the train loss kept "
                   f"falling; the gap grew from {_fmt(gap_best)} to {_fmt(gap_end)}"
                   + (f", weight norm {_fmt(w0)} -> {_fmt(w1)}" if w0 and w1 else ""))
        fix = ("stop early (proftune.EarlyStopping with restore_best), add weight decay or dropout, "
               "or use more data/augmentation")
        return Finding("overfitting", severity, summary, fix, evidence, 0.8 if severity == "warning" else 0.4,
                       step=int(ep[best].get("step", 0)) or None), False

    def _plateau(self) -> dict[str, Any] | None:
        curve = self._smoothed()
        if len(curve) < 30:
            return None
        n = max(len(curve) // 10, 3)
        start = statistics.fmean(v for _, v in curve[:n])
        end = statistics.fmean(v for _, v in curve[-n:])
        drop = (start - end) / max(abs(start), 1e-12)
        if drop >= 0.1:
            return None
        return {"start_loss": start, "final_loss": end, "relative_drop": drop, "steps": len(curve)}

    def _check_lr_low(self) -> tuple[Finding, bool] | None:
        plateau = self._plateau()
        if plateau is None:
            return None
        lr = self._lr()
        evidence: dict[str, Any] = {**plateau, "lr": lr}
        summary = (f"loss went from {_fmt(plateau['start_loss'])} to {_fmt(plateau['final_loss'])} "
                   f"({-plateau['relative_drop']:+.1%}) over {plateau['steps']} steps")
        confidence, severity, fix = 0.4, "warning", "raise the learning rate (run an LR range test)"
        test = self.lr_test
        if test is not None and lr is not None:
            evidence["range_test"] = test.to_dict()
            if test.improved and test.best_lr >= 30 * lr:
                confidence = 0.85
                summary += (f"; a range test finds the loss still falling at lr {_fmt(test.best_lr)}, "
                            f"{_fmt(test.best_lr / lr)}x the current {_fmt(lr)}")
                fix = f"raise the learning rate to about {_fmt(test.best_lr / 3)} (a third of the range test's safe maximum)"
            else:
                confidence, severity = 0.2, "info"
                summary += "; a range test does not find a much larger rate that trains faster"
                fix = "look at the model and data (dead or saturated units, labels) before the learning rate"
        return Finding("lr_too_low", severity, summary, fix, evidence, confidence,
                       step=self.steps[0]["step"] if self.steps else None), False

    def _check_batchnorm(self) -> tuple[Finding, bool] | None:
        if not self.batchnorm or not self.batch_sizes:
            return None
        bs = statistics.median(self.batch_sizes)
        if bs >= 16:
            return None
        severity = "warning" if bs <= 8 else "info"
        evidence = {"batch_size": bs, "batchnorm_layers": self.batchnorm}
        if self.epochs:
            e = self.epochs[-1]
            if "train_loss" in e and "val_loss" in e:
                evidence["train_loss"], evidence["val_loss_eval_mode"] = e["train_loss"], e["val_loss"]
        summary = (f"{len(self.batchnorm)} batch-norm layer(s) normalise over batches of {bs:g} samples: "
                   "the batch statistics are noisy and differ from the running ones used at eval")
        fix = ("use a batch of 16 or more (grad accumulation does not help batch norm), or GroupNorm/LayerNorm, "
               "or freeze batch-norm statistics")
        return Finding("batchnorm_small_batch", severity, summary, fix, evidence,
                       0.7 if severity == "warning" else 0.3, step=1, layer=self.batchnorm[0]), False


def summarize(findings: Sequence[Finding]) -> str:
    """One line per finding, for logs."""
    return "\n".join(f"[{f.severity}] {f.cause}: {f.summary}" for f in findings)
