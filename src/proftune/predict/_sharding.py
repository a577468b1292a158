"""The sharding arithmetic of data-parallel training: what each GPU holds and sends under DDP,
FSDP and ZeRO 1/2/3, with offload.

One class per strategy behind :class:`BaseStrategy`, registered in :data:`STRATEGIES`. A
strategy turns the single-device bytes of a traced step (parameters, gradients, optimizer
state, and the live bytes by kind at each phase's peak) into one GPU's bytes, adds the
communication buffers it allocates, and lists its collectives (bytes each GPU sends, and the
phase each overlaps with). :meth:`BaseStrategy.deepspeed` reproduces DeepSpeed's closed-form
estimators (``estimate_zero2_model_states_mem_needs``, ``estimate_zero3_model_states_mem_needs``
in DeepSpeed 0.19's ``runtime/zero``), so a figure can be checked against DeepSpeed's own.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import ClassVar

from .._records import JsonRecord

__all__ = ["OFFLOAD", "STRATEGIES", "BaseStrategy", "Collective", "DeepSpeedStates", "ModelSizes"]

#: What can be offloaded to the host.
OFFLOAD = ("none", "optimizer", "params")
#: DeepSpeed's default ``reduce_bucket_size`` and ``allgather_bucket_size`` (elements).
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000


@dataclass(frozen=True)
class ModelSizes:
    """Bytes of one replica's model states as the traced step holds them, and the units."""

    #: Parameters counted once (Ψ).
    n_params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    #: Parameter bytes of each FSDP unit (block), and those left to the root (embeddings, head).
    unit_bytes: tuple[int, ...] = ()
    root_bytes: int = 0
    #: DeepSpeed's "largest layer": the most parameters one module holds itself (not its children).
    largest_layer_params: int = 0

    @property
    def largest_unit_bytes(self) -> int:
        return max((*self.unit_bytes, 0))


@dataclass(frozen=True)
class Collective(JsonRecord):
    """One collective of a step: bytes each GPU sends (ring algorithms), how many times per step,
    the phase it can hide behind ("" when the step waits for it), and the launches each time
    sends those bytes in (buckets, units: each pays the link's latency)."""

    WHAT: ClassVar[str] = "a collective"

    name: str
    bytes_per_gpu: float
    times: int
    overlaps: str = ""
    calls: int = 1


@dataclass(frozen=True)
class DeepSpeedStates(JsonRecord):
    """DeepSpeed's estimator for this strategy: GPU and CPU bytes of model states, its formula."""

    WHAT: ClassVar[str] = "DeepSpeed's states"

    gpu_bytes: int
    cpu_bytes: int
    formula: str
    source: str


@dataclass(frozen=True)
class PhaseBytes:
    """One GPU's live bytes by kind at a phase's peak."""

    phase: str
    breakdown: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.breakdown.values())


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def _buckets(nbytes: float, bucket: float) -> int:
    return max(1, math.ceil(nbytes / bucket))


#: DDP's bucket cap (``bucket_cap_mb=25``) and its first, smaller bucket (1 MiB).
DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES = 25 * 2**20, 2**20


class BaseStrategy(abc.ABC):
    """How one data-parallel strategy places model states and what it communicates."""

    name: ClassVar[str]
    title: ClassVar[str]
    shards_optimizer: ClassVar[bool] = False
    shards_grads: ClassVar[bool] = False
    shards_params: ClassVar[bool] = False
    #: The offload modes it supports.
    offloads: ClassVar[tuple[str, ...]] = ("none",)

    def model_states(self, s: ModelSizes, n: int, offload: str) -> dict[str, int]:
        """Bytes one GPU holds of parameters, gradients and optimizer state (and what goes to the host)."""
        params = math.ceil(s.params_bytes / n) if self.shards_params else s.params_bytes
        grads = math.ceil(s.grads_bytes / n) if self.shards_grads else s.grads_bytes
        opt = math.ceil(s.optimizer_bytes / n) if self.shards_optimizer else s.optimizer_bytes
        host = 0
        if offload in ("optimizer", "params"):
            host += opt
            opt = 0
        if offload == "params":
            host += params + grads
            params = grads = 0
        return {"params": params, "grads": grads, "optimizer_state": opt, "host": host}

    def phase_bytes(self, s: ModelSizes, n: int, offload: str, breakdowns: dict[str, dict[str, int]],
                    *, accumulating: bool = False,
                    moments: dict[int, dict[str, int]] | None = None) -> list[PhaseBytes]:
        """One GPU's live bytes at each phase's peak: the single-device breakdown with the model
        states sharded as this strategy shards them, its gradients as :meth:`grads_at` holds them,
        plus its communication buffers. ``moments`` (backward's breakdowns by the gradient bytes
        made so far) are priced too: where gradients are sharded as they are made, backward's
        peak moves earlier than the single device's, to where fewer gradients and more
        activations are live."""
        states = self.model_states(s, n, offload)
        out = []
        for phase, peak in breakdowns.items():
            candidates = [peak, *(moments.values() if (moments and phase == "backward") else ())]
            priced = [self._priced(s, n, offload, phase, full, states, accumulating) for full in candidates]
            out.append(max(priced, key=lambda p: p.total))
        return out

    def _priced(self, s: ModelSizes, n: int, offload: str, phase: str, full: dict[str, int],
                states: dict[str, int], accumulating: bool) -> PhaseBytes:
        b = {k: v for k, v in full.items() if k not in ("params", "grads", "optimizer_state")}
        b["params"] = states["params"]
        b.update(self.grads_at(s, n, offload, phase, full.get("grads", 0), accumulating=accumulating))
        b["optimizer_state"] = states["optimizer_state"]
        if "optimizer_temp" in b and (self.shards_optimizer or offload != "none"):
            b["optimizer_temp"] = 0 if offload != "none" else math.ceil(b["optimizer_temp"] / n)
        for kind, value in self.buffers(s, n, offload, phase).items():
            b[kind] = b.get(kind, 0) + value
        return PhaseBytes(phase, {k: int(v) for k, v in b.items() if v})

    def grads_at(self, s: ModelSizes, n: int, offload: str, phase: str, made: int, *,
                 accumulating: bool = False) -> dict[str, int]:
        """Gradient bytes one GPU holds, by kind, at a moment of ``phase`` when the single device
        holds ``made`` bytes of them: the one place that says how each strategy holds gradients.

        ``grads``: what the strategy keeps (all of them, or its shard once reduced);
        ``unsharded_grads``: full gradients waiting for their reduce-scatter (FSDP, ZeRO-3). With
        accumulation the earlier micro-batches' gradients are live in the next forward."""
        if accumulating and phase == "forward":
            made = s.grads_bytes
        if offload == "params":
            return {}
        return {"grads": math.ceil(made / n) if self.shards_grads else made}

    @abc.abstractmethod
    def buffers(self, s: ModelSizes, n: int, offload: str, phase: str) -> dict[str, int]:
        """Bytes of the communication buffers and gathered parameters live at ``phase``'s peak."""

    @abc.abstractmethod
    def collectives(self, s: ModelSizes, n: int, micro_batches: int) -> list[Collective]:
        """The step's collectives."""

    @abc.abstractmethod
    def deepspeed(self, n_params: int, largest_layer: int, gpus_per_node: int, nodes: int,
                  offload: str) -> DeepSpeedStates:
        """DeepSpeed's closed form of this strategy's model states (fp16 mixed precision, Adam)."""


class DDP(BaseStrategy):
    """PyTorch DistributedDataParallel: every state replicated; gradients all-reduced in
    buckets during backward. The Reducer allocates a flat bucket for every gradient at
    construction (``gradient_as_bucket_view=False``, the default): one more copy of the gradients."""

    name, title = "ddp", "DDP"

    def buffers(self, s: ModelSizes, n: int, offload: str, phase: str) -> dict[str, int]:
        return {"comm_buckets": s.grads_bytes}

    def collectives(self, s: ModelSizes, n: int, micro_batches: int) -> list[Collective]:
        rest = max(0, s.grads_bytes - DDP_FIRST_BUCKET_BYTES)
        calls = 1 + (_buckets(rest, DDP_BUCKET_BYTES) if rest else 0)
        # each micro-batch's backward all-reduces (the fit loop's step runs no ``no_sync``)
        return [Collective("all-reduce gradients", 2 * _ring(n) * s.grads_bytes, micro_batches, "backward", calls)]

    def deepspeed(self, n_params: int, largest_layer: int, gpus_per_node: int, nodes: int,
                  offload: str) -> DeepSpeedStates:
        return DeepSpeedStates(16 * n_params, 0, "16Ψ (2 fp16 params + 2 fp16 grads + 12 fp32 master and Adam)",
                               "ZeRO paper (Rajbhandari et al. 2020), baseline data parallelism")


class _ZeroBucketed(BaseStrategy):
    """ZeRO 1 and 2: DeepSpeed's reduce and all-gather buckets (500M elements by default, capped
    by the model)."""

    offloads: ClassVar[tuple[str, ...]] = ("none", "optimizer")

    def _bucket(self, s: ModelSizes) -> int:
        per = s.grads_bytes / max(s.n_params, 1)
        return int(min(s.grads_bytes, DEEPSPEED_BUCKET_ELEMENTS * per))

    def buffers(self, s: ModelSizes, n: int, offload: str, phase: str) -> dict[str, int]:
        if phase == "backward":
            return {"comm_buckets": self._bucket(s)}
        if phase == "optimizer":
            per = s.params_bytes / max(s.n_params, 1)
            return {"comm_buckets": int(min(s.params_bytes, DEEPSPEED_BUCKET_ELEMENTS * per))}
        return {}

    def collectives(self, s: ModelSizes, n: int, micro_batches: int) -> list[Collective]:
        """Gradients reduce-scattered (each micro-batch where they are sharded, else once per step),
        the updated parameters all-gathered after the step."""
        times = micro_batches if self.shards_grads else 1
        return [Collective("reduce-scatter gradients", _ring(n) * s.grads_bytes, times, "backward",
                           _buckets(s.grads_bytes, self._bucket(s))),
                Collective("all-gather parameters", _ring(n) * s.params_bytes, 1, "")]


class Zero1(_ZeroBucketed):
    """ZeRO stage 1: optimizer state sharded; gradients reduce-scattered once per step, the
    updated parameters all-gathered after the step."""

    name, title = "zero1", "ZeRO-1"
    shards_optimizer = True

    def deepspeed(self, n_params: int, largest_layer: int, gpus_per_node: int, nodes: int,
                  offload: str) -> DeepSpeedStates:
        n = gpus_per_node * nodes
        if offload == "optimizer":
            return DeepSpeedStates(4 * n_params, 0, "4Ψ (fp16 params and grads; optimizer on the host)",
                                   "ZeRO paper, P_os with ZeRO-Offload")
        return DeepSpeedStates(4 * n_params + int(12 * n_params / n), 0, "4Ψ + 12Ψ/N",
                               "ZeRO paper (P_os: 2Ψ + 2Ψ + KΨ/N, K = 12); DeepSpeed has no stage-1 estimator")


class Zero2(_ZeroBucketed):
    """ZeRO stage 2: optimizer state and gradients sharded; gradients reduce-scattered as backward
    produces them (each micro-batch), the parameters all-gathered after the step."""

    name, title = "zero2", "ZeRO-2"
    shards_optimizer = shards_grads = True

    def deepspeed(self, n_params: int, largest_layer: int, gpus_per_node: int, nodes: int,
                  offload: str) -> DeepSpeedStates:
        # deepspeed/runtime/zero/stage_1_and_2.py: estimate_zero2_model_states_mem_needs (factor 1.5)
        total_gpus = nodes * gpus_per_node
        if offload == "optimizer":
            gpu = 2 * n_params
            cpu = n_params * max(4 * total_gpus, 16) * 1.5
            formula = "2Ψ (GPU); Ψ·max(4N, 16)·1.5 (CPU)"
        else:
            gpu = 2 * n_params + int(18 * n_params / total_gpus)
            cpu = n_params * 4 * gpus_per_node * 1.5
            formula = "2Ψ + 18Ψ/N (GPU); 4Ψ·gpus_per_node·1.5 (CPU)"
        return DeepSpeedStates(int(gpu), int(cpu), formula,
                               "DeepSpeed 0.19 estimate_zero2_model_states_mem_needs")


class _FullShard(BaseStrategy):
    """Parameters, gradients and optimizer state sharded; each unit's parameters all-gathered for
    its forward and again for its backward, its gradients reduce-scattered after its backward."""

    shards_optimizer = shards_grads = shards_params = True
    offloads: ClassVar[tuple[str, ...]] = ("none", "optimizer", "params")

    def buffers(self, s: ModelSizes, n: int, offload: str, phase: str) -> dict[str, int]:
        u = s.largest_unit_bytes
        if phase == "forward":
            # the root's parameters stay gathered from its forward to its backward
            return {"gathered_params": s.root_bytes + u}
        if phase == "backward":
            # the unit being run and the one prefetched (all-gathered again for backward)
            return {"gathered_params": s.root_bytes + 2 * u}
        return {}

    #: Units whose full gradients are live at once in backward: the one running (its
    #: gradients accumulating) and the one being reduce-scattered (its reduce-scatter input).
    UNITS_IN_FLIGHT: ClassVar[int] = 2

    def grads_at(self, s: ModelSizes, n: int, offload: str, phase: str, made: int, *,
                 accumulating: bool = False) -> dict[str, int]:
        # Each unit's gradients are reduce-scattered right after its backward and the full copy
        # freed: a GPU holds its shard of the units done, plus the full gradients of the units in
        # flight and of the root (embeddings, head: reduced when the whole backward ends). With
        # accumulation, FSDP2 reduce-scatters every micro-batch (its default): the earlier
        # micro-batches' gradients are a shard. (With ``set_requires_gradient_sync(False)``,
        # ``no_sync``, each GPU keeps every unsharded gradient across micro-batches instead.)
        if phase != "backward":
            return super().grads_at(s, n, offload, phase, made, accumulating=accumulating)
        per = s.grads_bytes / max(s.params_bytes, 1)
        in_flight = min(made, int(per * (s.root_bytes + self.UNITS_IN_FLIGHT * s.largest_unit_bytes)))
        held = {"unsharded_grads": in_flight}
        if offload != "params":
            held["grads"] = math.ceil((made - in_flight) / n)
        return held

    def collectives(self, s: ModelSizes, n: int, micro_batches: int) -> list[Collective]:
        # one all-gather and one reduce-scatter per unit and for the root; the root's parameters
        # stay gathered from its forward to its backward
        units = len(s.unit_bytes) + (1 if s.root_bytes else 0)
        return [Collective("all-gather parameters (forward)", _ring(n) * s.params_bytes, micro_batches, "forward",
                           units),
                Collective("all-gather parameters (backward)", _ring(n) * (s.params_bytes - s.root_bytes),
                           micro_batches, "backward", len(s.unit_bytes)),
                Collective("reduce-scatter gradients", _ring(n) * s.grads_bytes, micro_batches, "backward", units)]

    def deepspeed(self, n_params: int, largest_layer: int, gpus_per_node: int, nodes: int,
                  offload: str) -> DeepSpeedStates:
        # deepspeed/runtime/zero/stage3.py: estimate_zero3_model_states_mem_needs (zero_init, factor 1.5)
        total_gpus = nodes * gpus_per_node
        gpus_factor = 1 / nodes
        largest = 4 * largest_layer
        if offload == "params":
            gpu, cpu, formula = largest, n_params * 18 * gpus_factor * 1.5, "4L (GPU); 18Ψ/nodes·1.5 (CPU)"
        elif offload == "optimizer":
            gpu = largest + int(2 * n_params / total_gpus)
            cpu = n_params * 16 * gpus_factor * 1.5
            formula = "4L + 2Ψ/N (GPU); 16Ψ/nodes·1.5 (CPU)"
        else:
            gpu = largest + int(18 * n_params / total_gpus)
            cpu = largest_layer * 4 * gpus_per_node * 1.5
            formula = "4L + 18Ψ/N (GPU); 4L·gpus_per_node·1.5 (CPU)"
        return DeepSpeedStates(int(gpu), int(cpu), formula, "DeepSpeed 0.19 estimate_zero3_model_states_mem_needs")


class Zero3(_FullShard):
    name, title = "zero3", "ZeRO-3"


class FSDP(_FullShard):
    """PyTorch FSDP2 (``fully_shard`` on each block, then the root). Its offload
    (``CPUOffloadPolicy``) moves parameters, gradients and the optimizer step to the host
    together: ``params``. DeepSpeed's figure is ZeRO-3's, the same partitioning."""

    name, title = "fsdp", "FSDP"
    offloads: ClassVar[tuple[str, ...]] = ("none", "params")


class FSDPNoReshard(FSDP):
    """FSDP2 with ``reshard_after_forward=False`` (FSDP1's ``SHARD_GRAD_OP``): each unit keeps
    its gathered parameters from its forward to its backward, so no all-gather in backward, and
    at the end of forward every unit's full parameters are live on every GPU."""

    name, title = "fsdp-no-reshard", "FSDP (no reshard after forward)"

    def buffers(self, s: ModelSizes, n: int, offload: str, phase: str) -> dict[str, int]:
        if phase in ("forward", "backward"):
            return {"gathered_params": s.root_bytes + sum(s.unit_bytes)}
        return {}

    def collectives(self, s: ModelSizes, n: int, micro_batches: int) -> list[Collective]:
        units = len(s.unit_bytes) + (1 if s.root_bytes else 0)
        return [Collective("all-gather parameters (forward)", _ring(n) * s.params_bytes, micro_batches, "forward",
                           units),
                Collective("reduce-scatter gradients", _ring(n) * s.grads_bytes, micro_batches, "backward", units)]


#: The strategies by name.
STRATEGIES: dict[str, BaseStrategy] = {s.name: s for s in (DDP(), Zero1(), Zero2(), Zero3(), FSDP(),
                                                           FSDPNoReshard())}
