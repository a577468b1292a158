"""The gradient noise scale B_simple = tr(Σ)/|G|² and the critical batch size it predicts.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", appendix A): with the
squared norms of gradients taken at a small batch b and a big batch B,

    E|G_b|² = |G|² + tr(Σ)/b,        E|G_B|² = |G|² + tr(Σ)/B,

so |G|² = (B|G_B|² - b|G_b|²)/(B - b) and tr(Σ) = (|G_b|² - |G_B|²)/(1/b - 1/B) are unbiased.
The micro-batches of one accumulated step of the fit loop serve as the small batches
(|G_b|² is the mean of their squared norms) and their mean is the big batch. Both estimates
are smoothed with an EMA over steps before the ratio is taken; where the EMA of |G|² is not
positive (noise dominates) it is clipped to 1% of the big-batch |G_B|², B_simple is capped at
100·B, and the step is counted as clipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .._device import batch_size_of
from .._jsonsafe import finite_float
from .._records import JsonRecord
from ..exceptions import ProblemCollector
from ..task import Task, load_task
from ..train import Callback, FitState, fit
from ._evidence import int_or_none, row_evidence
from ._lr_ladder import fell_beyond_noise, loss_trend
from ._records import Recommendation

#: Where the smoothed |G|² is not positive it is clipped to this fraction of |G_B|².
CLIP_FRACTION = 0.01


@dataclass(frozen=True)
class NoiseScaleResult(JsonRecord):
    """The smoothed estimates after the last step and their history (one row per step); read back
    from a ``critical_batch_size`` row by :meth:`of`."""

    DERIVED: ClassVar[tuple[str, ...]] = ("critical_batch_size",)
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("lr",)

    b_simple: float | None
    trace_sigma: float | None
    grad_sq_norm: float | None
    small_batch: int
    big_batch: int
    steps: int
    used_steps: int
    clipped_steps: int
    ema: float
    history: tuple[dict[str, float], ...]
    #: The training loss of each step it measured (whether the model was learning there).
    losses: tuple[float, ...] = ()
    #: The learning rate it was measured at, where known (read back from a row; the row writes it).
    lr: float | None = None

    @classmethod
    def of(cls, rec: Recommendation | None) -> NoiseScaleResult | None:
        """The ``critical_batch_size`` row's measurement as its evidence holds it (no history nor
        losses: the run's ``noise_scale`` curve has the history); None where it was not measured."""
        ev = row_evidence(rec, "critical_batch_size")
        used = int_or_none(ev.get("used_steps"))
        if used is None:
            return None
        def num(k: str) -> int:
            return int_or_none(ev.get(k)) or 0

        f = {k: finite_float(ev.get(k)) for k in ("b_simple", "trace_sigma", "grad_sq_norm", "ema", "lr")}
        return cls(b_simple=f["b_simple"], trace_sigma=f["trace_sigma"], grad_sq_norm=f["grad_sq_norm"],
                   small_batch=num("small_batch"), big_batch=num("big_batch"), steps=num("steps"), used_steps=used,
                   clipped_steps=num("clipped_steps"), ema=f["ema"] or 0.0, history=(), lr=f["lr"])

    def learning(self) -> tuple[bool, str]:
        """Whether the loss fell beyond its noise over the measured steps, and the figures: a noise
        scale taken where the model does not learn (a plateau, a rate too low) is not the critical
        batch of its training."""
        trend = loss_trend(list(self.losses))
        if trend is None:
            return False, f"{len(self.losses)} step(s) with a finite loss, too few to see it fall"
        start, end, noise, window = trend
        fell = fell_beyond_noise(start, end, noise, window=window)
        return fell, (f"training loss {start:.4g} -> {end:.4g} over {len(self.losses)} steps "
                      f"(noise {noise:.2g}){'' if fell else ': no fall beyond noise'}")

    @property
    def critical_batch_size(self) -> int | None:
        """B_crit ≈ B_simple (McCandlish et al.: B_noise ≈ B_simple for well-conditioned problems)."""
        return None if self.b_simple is None else max(1, round(self.b_simple))


class NoiseScaleCallback(Callback):
    """Measures |G_b|² of each micro-batch and |G_B|² of the step; keeps the EMAs.

    Per-micro-batch gradients come from post-accumulate-grad hooks: after micro-batch j the
    loop's ``.grad`` holds the sum of the first j scaled gradients, so the difference to the
    previous value, times the number of micro-batches, is micro-batch j's own gradient.
    """

    def __init__(self, *, micro_batches: int, small_batch: int, ema: float = 0.9, warmup_steps: int = 0) -> None:
        self.k = micro_batches
        self.b = small_batch
        self.ema = ema
        self.warmup_steps = warmup_steps
        self.history: list[dict[str, float]] = []
        self.used = 0
        self.clipped = 0
        self._g2 = self._s = self._gbig = 0.0
        self._prev: dict[int, torch.Tensor] = {}
        self._count: dict[int, int] = {}
        self._sq: list[float] = []
        self._handles: list[Any] = []
        self._scale = 1.0
        self.losses: list[float] = []

    # -- hooks ---------------------------------------------------------------------------------
    def on_fit_start(self, state: FitState) -> None:
        for p in state.model.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook))

    def on_step_start(self, state: FitState) -> None:
        self._prev.clear()
        self._count.clear()
        self._sq = [0.0] * self.k
        self._scale = float(state.scaler.get_scale()) if state.scaler is not None else 1.0

    @torch.no_grad()
    def _grad_hook(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        key = id(p)
        j = self._count.get(key, 0)
        self._count[key] = j + 1
        grad = p.grad.detach().float()
        prev = self._prev.get(key)
        delta = grad if prev is None else grad - prev
        self._prev[key] = grad.clone()
        if j < len(self._sq):
            self._sq[j] += float((delta * (self.k / self._scale)).pow(2).sum())

    @torch.no_grad()
    def on_after_backward(self, state: FitState) -> None:
        batches = state.batch if isinstance(state.batch, list) else [state.batch]
        sizes = [batch_size_of(b) for b in batches]
        if len(sizes) != self.k or any(s != self.b for s in sizes) or state.step < self.warmup_steps:
            return  # a partial group at the end of an epoch, or still warming up
        g_big = sum(float(p.grad.detach().float().pow(2).sum())
                    for p in state.model.parameters() if p.grad is not None)
        g_small = sum(self._sq) / self.k
        b, big = float(self.b), float(self.b * self.k)
        g2 = (big * g_big - b * g_small) / (big - b)
        s = (g_small - g_big) / (1.0 / b - 1.0 / big)
        beta = self.ema
        self.used += 1
        self._g2 = beta * self._g2 + (1 - beta) * g2
        self._s = beta * self._s + (1 - beta) * s
        self._gbig = beta * self._gbig + (1 - beta) * g_big
        g2_hat, s_hat, gbig_hat = self.estimates()
        floor = CLIP_FRACTION * gbig_hat
        clipped = g2_hat <= floor
        if clipped:
            self.clipped += 1
        self.history.append({
            "step": float(state.step), "g_small_sq": g_small, "g_big_sq": g_big,
            "grad_sq_norm": g2, "trace_sigma": s,
            "b_simple": self._ratio(s_hat, g2_hat, gbig_hat),
            "clipped": float(clipped),
        })

    def on_step_end(self, state: FitState) -> None:
        if state.step > self.warmup_steps:
            self.losses.append(float(state.loss) if state.loss is not None else math.nan)

    def on_fit_end(self, state: FitState) -> None:
        self._remove()

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self._remove()

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._prev.clear()

    # -- results ---------------------------------------------------------------------------------
    def estimates(self) -> tuple[float, float, float]:
        """Bias-corrected EMAs of |G|², tr(Σ) and |G_B|²."""
        if self.used == 0:
            return math.nan, math.nan, math.nan
        corr = 1 - self.ema ** self.used
        return self._g2 / corr, self._s / corr, self._gbig / corr

    def _ratio(self, s: float, g2: float, gbig: float) -> float:
        """tr(Σ)/|G|² with |G|² clipped to 1% of |G_B|², and so at most 100 x the big batch."""
        if not gbig > 0:
            return math.nan
        cap = self.b * self.k / CLIP_FRACTION
        return min(max(s, 0.0) / max(g2, CLIP_FRACTION * gbig), cap)

    def result(self, steps: int) -> NoiseScaleResult:
        g2, s, gbig = self.estimates()
        b_simple = None if self.used == 0 or not gbig > 0 else self._ratio(s, g2, gbig)
        return NoiseScaleResult(
            b_simple=b_simple, trace_sigma=None if self.used == 0 else s,
            grad_sq_norm=None if self.used == 0 else g2, small_batch=self.b,
            big_batch=self.b * self.k, steps=steps, used_steps=self.used,
            clipped_steps=self.clipped, ema=self.ema, history=tuple(self.history), losses=tuple(self.losses),
        )


def noise_scale(
    task: Task | str,
    params: Mapping[str, Any] | None = None,
    *,
    small_batch: int = 16,
    micro_batches: int = 4,
    steps: int = 30,
    ema: float = 0.9,
    warmup_steps: int = 0,
    device: str | torch.device = "auto",
    seed: int = 0,
) -> NoiseScaleResult:
    """Gradient noise scale B_simple = tr(Σ)/|G|² from ``steps`` accumulated steps of the fit loop:
    the ``micro_batches`` micro-batches of ``small_batch`` samples are the small batches, their
    mean the big one. B_simple estimates the critical batch size."""
    problems = ProblemCollector()
    if isinstance(small_batch, bool) or not isinstance(small_batch, int) or small_batch < 1:
        problems.add(f"small_batch={small_batch!r} must be an integer >= 1.")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 2:
        problems.add(f"micro_batches={micro_batches!r} must be an integer >= 2 (two batch sizes are needed).")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        problems.add(f"steps={steps!r} must be an integer >= 1.")
    if not 0.0 <= float(ema) < 1.0:
        problems.add(f"ema={ema!r} must be in [0, 1).")
    problems.raise_if_any()
    task_obj = load_task(task)
    merged = {**task_obj.default_params, **(params or {}),
              "batch_size": small_batch, "grad_accumulation": micro_batches}
    callback = NoiseScaleCallback(micro_batches=micro_batches, small_batch=small_batch, ema=ema,
                                  warmup_steps=warmup_steps)
    fit(task_obj, merged, max_steps=steps + warmup_steps, device=device, seed=seed,
        callbacks=[callback], evaluate=False)
    return callback.result(steps + warmup_steps)
