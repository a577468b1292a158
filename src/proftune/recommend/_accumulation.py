"""Gradient accumulation: reach a target batch with micro-batches that fit the memory budget.

Time cost from the measured step: data, forward and backward scale with the samples of a
micro-batch (per-sample cost measured at the profile's batch size), the optimizer step and the
rest of the step run once per optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..exceptions import ConfigError


@dataclass(frozen=True)
class AccumulationPlan:
    """Micro-batch size and count that reach ``effective_batch`` >= the target."""

    target_batch: int
    max_batch: int
    micro_batch: int
    steps: int
    effective_batch: int
    #: Predicted milliseconds of one optimizer step (all micro-batches) and samples per second.
    step_ms: float | None
    samples_per_s: float | None
    #: The same effective batch in one micro-batch, if memory allowed (for the overhead).
    single_step_ms: float | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "target_batch": self.target_batch, "max_batch": self.max_batch,
            "micro_batch": self.micro_batch, "grad_accumulation": self.steps,
            "effective_batch": self.effective_batch, "step_ms": self.step_ms,
            "samples_per_s": self.samples_per_s, "single_step_ms": self.single_step_ms,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class StepCost:
    """Measured costs of one step at ``batch_size`` (from the Profile), milliseconds."""

    batch_size: int
    per_batch_ms: float  # data + forward + backward at batch_size
    fixed_ms: float  # optimizer + other, once per optimizer step

    def predict(self, micro_batch: int, steps: int) -> float:
        return steps * self.per_batch_ms * micro_batch / self.batch_size + self.fixed_ms


def plan_accumulation(target_batch: int, max_batch: int, *, cost: StepCost | None = None) -> AccumulationPlan:
    """The fewest micro-batches of at most ``max_batch`` samples whose sum reaches ``target_batch``."""
    if target_batch < 1 or max_batch < 1:
        raise ConfigError(f"target_batch and max_batch must be >= 1, but got {target_batch=}, {max_batch=}.")
    steps = math.ceil(target_batch / max_batch)
    micro = math.ceil(target_batch / steps)
    effective = micro * steps
    step_ms = single = sps = None
    if cost is not None and cost.batch_size > 0:
        step_ms = cost.predict(micro, steps)
        single = cost.predict(effective, 1)
        sps = effective / step_ms * 1e3 if step_ms > 0 else None
    if steps == 1:
        reason = (f"the target batch {target_batch} fits the memory budget (largest batch "
                  f"{max_batch}): no accumulation needed.")
    else:
        reason = (f"the target batch {target_batch} exceeds the largest batch that fits "
                  f"({max_batch}): {steps} micro-batches of {micro} reach {effective}.")
        if step_ms is not None and single is not None and cost is not None:
            reason += (f" Predicted {step_ms:.1f} ms per optimizer step ({sps:.0f} samples/s): data, "
                       f"forward and backward scale with the samples, the optimizer step "
                       f"({cost.fixed_ms:.1f} ms) runs once.")
    return AccumulationPlan(target_batch=int(target_batch), max_batch=int(max_batch), micro_batch=micro,
                            steps=steps, effective_batch=effective, step_ms=step_ms,
                            samples_per_s=sps, single_step_ms=single, reason=reason)
