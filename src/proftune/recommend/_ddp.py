"""The per-rank batch size under DDP, from communication against compute: ``ddp_batch_size``.

Each DDP step all-reduces the gradients, whose size does not depend on the batch; the compute
grows with it. ``profile_ddp_batches`` measures the DDP step at a few per-rank batch sizes on N
ranks and fits step_ms(B) = fixed + per_sample·B; with the all-reduce time A measured per step,
the all-reduce's share of the step is A / step_ms(B). The recommendation is the smallest
per-rank batch (a multiple of 8) at which that share is at most ``share``, within the memory
budget, within the data, and with the global batch N·B not above the critical batch (past it a
bigger batch saves no steps); the lr is scaled with the global batch by the optimizer's rule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError
from ..profile import DDPScaling, fit_scaling, profile_ddp_batches
from ._records import MeasuredEffect, Recommendation, keep_unless_better
from ._scaling import scale_lr

__all__ = ["DDP_SHARE", "DDPPlan", "measure_and_plan", "plan_ddp_batch"]

#: Default largest share of the step the all-reduce may take.
DDP_SHARE = 0.10


@dataclass(frozen=True)
class DDPPlan:
    """The per-rank batch for a target all-reduce share, the caps it met and the prediction."""

    current: int
    batch_size: int
    needed: float
    caps: dict[str, int]
    limited_by: str | None
    share: float
    current_share: float
    predicted_share: float
    current_throughput: float
    predicted_throughput: float

    def to_dict(self) -> dict[str, object]:
        return {"current_batch_size": self.current, "batch_size": self.batch_size, "needed": self.needed,
                "caps": dict(self.caps), "limited_by": self.limited_by, "target_share": self.share,
                "current_share": self.current_share, "predicted_share": self.predicted_share,
                "current_throughput": self.current_throughput, "predicted_throughput": self.predicted_throughput}


def plan_ddp_batch(scaling: DDPScaling, *, current: int, share: float = DDP_SHARE,
                   max_batch: int | None = None, critical_batch: int | None = None,
                   samples: int | None = None) -> DDPPlan:
    """The smallest per-rank batch whose all-reduce share of the step is at most ``share``.

    ``max_batch``: the largest per-rank batch the memory budget holds; ``critical_batch``: the
    global critical batch (per rank: ``critical_batch // world_size``); ``samples``: training
    samples, the most one batch can hold.
    """
    if not 0.0 < share < 1.0:
        raise ConfigError(f"share={share!r} must be in (0, 1): the largest share of the step the all-reduce may take.")
    a, b, ar = scaling.fixed_ms, scaling.per_sample_ms, scaling.allreduce_ms
    if b <= 0:  # the step did not grow with the batch: noise, no line to solve
        return DDPPlan(current=current, batch_size=current, needed=math.nan, caps={}, limited_by="noise",
                       share=share, current_share=ar / scaling.step_ms(current) if scaling.step_ms(current) else 0.0,
                       predicted_share=math.nan, current_throughput=scaling.throughput(current),
                       predicted_throughput=math.nan)
    needed = (ar / share - a) / b
    caps = {k: int(v) for k, v in (("memory", max_batch), ("data", samples),
                                   ("critical_batch", critical_batch // scaling.world_size
                                    if critical_batch else None)) if v}
    upper = min(caps.values()) if caps else None
    limited = None
    if needed <= current:
        batch = current
    else:
        batch = 8 * math.ceil(needed / 8)
        if upper is not None and batch > upper:
            batch = max(current, upper)
            limited = min(caps, key=lambda k: caps[k])

    def at(bs: int) -> float:
        return ar / scaling.step_ms(bs) if scaling.step_ms(bs) > 0 else 0.0

    return DDPPlan(current=current, batch_size=int(batch), needed=needed, caps=caps, limited_by=limited,
                   share=share, current_share=at(current), predicted_share=at(batch),
                   current_throughput=scaling.throughput(current), predicted_throughput=scaling.throughput(batch))


def measure_and_plan(spec: Any, *, nprocs: int, current: int, params: Mapping[str, Any], share: float = DDP_SHARE,
                     max_batch: int | None = None, critical_batch: int | None = None, samples: int | None = None,
                     device: str = "cpu", seed: int = 0, rounds: int = 2, steps: int = 5) -> tuple[DDPScaling, DDPPlan]:
    """Profile the DDP step at 1x, 2x and 4x ``current`` per rank, plan the batch, and where the
    plan lands past twice the largest batch measured, measure there too and plan again from all
    the points (a line fitted on small batches need not hold far beyond them)."""
    top = samples or 4 * current
    sizes = sorted({b for b in (current, 2 * current, 4 * current) if b <= max(top, current)})
    if len(sizes) < 2:
        sizes = [max(1, current // 2), current]
    measure = functools.partial(profile_ddp_batches, spec, nprocs=nprocs, params=params, device=device, seed=seed,
                                rounds=rounds, steps=steps)
    scaling = measure(batch_sizes=sizes)
    plan = plan_ddp_batch(scaling, current=current, share=share, max_batch=max_batch,
                          critical_batch=critical_batch, samples=samples)
    if plan.batch_size > 2 * max(sizes):
        extra = measure(batch_sizes=[current, plan.batch_size])
        points = [*scaling.points, *(q for q in extra.points if q.batch_size == plan.batch_size)]
        scaling = fit_scaling(points, world_size=scaling.world_size, backend=scaling.backend, task=scaling.task)
        plan = plan_ddp_batch(scaling, current=current, share=share, max_batch=max_batch,
                              critical_batch=critical_batch, samples=samples)
    return scaling, plan


def ddp_recommendation(scaling: DDPScaling, plan: DDPPlan, *, lr: float | None, optimizer: str,
                       critical_batch: int | None) -> Recommendation:
    """The ``ddp_batch_size`` row from the measured scaling and the plan."""
    n = scaling.world_size
    evidence: dict[str, object] = {**plan.to_dict(), "world_size": n, "backend": scaling.backend,
                                   "allreduce_ms": scaling.allreduce_ms, "allreduce_bytes": scaling.allreduce_bytes,
                                   "fixed_ms": scaling.fixed_ms, "per_sample_ms": scaling.per_sample_ms,
                                   "points": scaling.to_dict()["points"]}
    lr_text = ""
    if lr is not None and plan.batch_size != plan.current:
        rule = scale_lr(lr, from_batch=n * plan.current, to_batch=n * plan.batch_size, optimizer=optimizer,
                        critical_batch=critical_batch)
        evidence["lr"] = rule.lr
        evidence["lr_scaling"] = rule.to_dict()
        lr_text = (f"; lr {lr:.3g} -> {rule.lr:.3g} ({rule.rule} rule for the global batch "
                   f"{n * plan.current} -> {n * plan.batch_size})")
    measured = (f"all-reduce {scaling.allreduce_bytes / 2**20:.2f} MiB per step in {scaling.allreduce_ms:.2f} ms "
                f"({scaling.backend}, {n} ranks); step {scaling.fixed_ms:.2f} ms + {scaling.per_sample_ms:.3f} ms "
                f"per sample (fitted through batches {', '.join(str(p.batch_size) for p in scaling.points)})")
    if plan.limited_by == "noise":
        return keep_unless_better(
            Recommendation("ddp_batch_size", plan.current, f"{measured}.", evidence, "low", ""), plan.current,
            inconclusive=(f"the measured DDP step did not grow with the batch (slope {scaling.per_sample_ms:.3g} "
                          "ms per sample), so the load on this machine hides the compute"),
            would_decide="the DDP step profiled again on an idle machine")
    if plan.batch_size == plan.current and plan.needed <= plan.current:
        reason = (f"keep {plan.current} per rank: the all-reduce takes {plan.current_share:.0%} of the step, "
                  f"within the {plan.share:.0%} target. {measured}.")
    else:
        reason = (f"at {plan.current} per rank the all-reduce takes {plan.current_share:.0%} of the step; "
                  f"it falls to {plan.share:.0%} from {plan.needed:.0f} per rank")
        if plan.limited_by is not None:
            reason += (f", above the {plan.limited_by} cap of {plan.caps[plan.limited_by]}: {plan.batch_size} "
                       f"per rank, where it takes {plan.predicted_share:.0%}")
        reason += f". {measured}{lr_text}."
    gain = plan.predicted_throughput / plan.current_throughput - 1 if plan.current_throughput > 0 else 0.0
    effect = (f"predicted {plan.predicted_throughput:.0f} samples/s over {n} ranks at {plan.batch_size} per rank, "
              f"against {plan.current_throughput:.0f} at {plan.current} ({gain:+.0%}); all-reduce "
              f"{plan.current_share:.0%} -> {plan.predicted_share:.0%} of the step")
    row = Recommendation("ddp_batch_size", plan.batch_size, reason, evidence, "medium", effect)
    return keep_unless_better(row, plan.current, effect=MeasuredEffect(
        "throughput", plan.current_throughput, plan.predicted_throughput, True))
