"""Target devices for predictions: memory, peak compute and bandwidth, and the roofline model.

The table holds datasheet numbers (dense, no sparsity) of a few common accelerators; ``cpu``
is this machine, its peak measured once per process (a matmul and a copy, a fraction of a
second). A device not in the table is given by its numbers (``peak_tflops``, ``bandwidth``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .._records import JsonRecord
from .._units import parse_memory
from ..exceptions import ConfigError, ProblemCollector
from ._trace import PHASES, MemoryTrace

__all__ = ["DEVICES", "DeviceSpec", "LayerCost", "price_phases", "resolve_target", "roofline_ms"]

_MIB = 1024**2


@dataclass(frozen=True)
class DeviceSpec(JsonRecord):
    """A device a step is predicted for: memory in bytes, peak TFLOP/s per compute dtype, bytes/s.

    ``op_overhead_us`` is the fixed cost of launching one op (kernel launch on a GPU, dispatch on
    a CPU): what makes a step of many tiny ops slower than its FLOPs and bytes say.
    """

    WHAT: ClassVar[str] = "a device"

    name: str
    memory_bytes: int | None
    #: TFLOP/s by compute dtype ("fp32", "bf16", "fp16"); tensor cores for the low precisions.
    peak_tflops: dict[str, float]
    bandwidth_bytes_s: float | None
    op_overhead_us: float = 0.0
    source: str = "datasheet"
    #: Bytes/s one GPU sends to another in its node (NVLink, else PCIe), per direction.
    intra_node_bytes_s: float | None = None
    #: Bytes/s one GPU sends to another node (its InfiniBand or Ethernet NIC), per direction.
    inter_node_bytes_s: float | None = None
    #: Bytes/s between the GPU and its host (PCIe), per direction: offload's link.
    host_bytes_s: float | None = None
    link_source: str = ""

    def tflops(self, compute: str) -> float | None:
        return self.peak_tflops.get(compute) or self.peak_tflops.get("fp32")


# Datasheet numbers, dense (NVIDIA's "with sparsity" figures are twice these); fp32 without TF32
# (PyTorch's default for matmul). V100 and T4 have no bf16 units: bf16 runs at their fp32 rate.
# Memory: the total nvidia-smi reports for the board (H200 141 GB: 143771 MiB).
DEVICES: dict[str, DeviceSpec] = {
    "h200": DeviceSpec("h200", 143771 * _MIB, {"fp32": 67.0, "bf16": 989.0, "fp16": 989.0}, 4.8e12, 4.0,
                       "NVIDIA H200 SXM datasheet",
                       450e9, 50e9, 64e9, "NVLink 4 900 GB/s bidirectional (H200 SXM datasheet); "
                       "1 ConnectX-7 NDR 400 Gb/s per GPU (DGX H200); PCIe Gen5 x16"),
    "h100": DeviceSpec("h100", 81559 * _MIB, {"fp32": 67.0, "bf16": 989.0, "fp16": 989.0}, 3.35e12, 4.0,
                       "NVIDIA H100 SXM datasheet",
                       450e9, 50e9, 64e9, "NVLink 4 900 GB/s bidirectional (H100 SXM datasheet); "
                       "1 ConnectX-7 NDR 400 Gb/s per GPU (DGX H100); PCIe Gen5 x16"),
    "a100": DeviceSpec("a100", 81920 * _MIB, {"fp32": 19.5, "bf16": 312.0, "fp16": 312.0}, 2.039e12, 4.0,
                       "NVIDIA A100 80GB SXM datasheet",
                       300e9, 25e9, 32e9, "NVLink 3 600 GB/s bidirectional (A100 SXM datasheet); "
                       "1 HDR 200 Gb/s per GPU (DGX A100); PCIe Gen4 x16"),
    "v100": DeviceSpec("v100", 32768 * _MIB, {"fp32": 15.7, "bf16": 15.7, "fp16": 125.0}, 0.9e12, 5.0,
                       "NVIDIA V100 SXM2 32GB datasheet",
                       150e9, 12.5e9, 16e9, "NVLink 2 300 GB/s bidirectional (V100 SXM2 datasheet); "
                       "EDR 100 Gb/s per GPU (DGX-1/2); PCIe Gen3 x16"),
    "l4": DeviceSpec("l4", 23034 * _MIB, {"fp32": 30.3, "bf16": 121.0, "fp16": 121.0}, 0.3e12, 5.0,
                     "NVIDIA L4 datasheet",
                       32e9, 12.5e9, 32e9, "no NVLink: PCIe Gen4 x16 64 GB/s bidirectional (L4 datasheet); "
                       "100 GbE per GPU assumed"),
    "t4": DeviceSpec("t4", 15360 * _MIB, {"fp32": 8.1, "bf16": 8.1, "fp16": 65.0}, 0.32e12, 5.0,
                     "NVIDIA T4 datasheet",
                       16e9, 12.5e9, 16e9, "no NVLink: PCIe Gen3 x16 32 GB/s bidirectional (T4 datasheet); "
                       "100 GbE per GPU assumed"),
}
TARGET_NAMES = (*DEVICES, "cpu")


def _best_seconds(fn: Any, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=1)
def _measured_cpu() -> DeviceSpec:
    """This machine's CPU: RAM, matmul TFLOP/s (fp32, bf16), copy bandwidth, per-op overhead."""
    n = 256
    peaks: dict[str, float] = {}
    for key, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        secs = _best_seconds(lambda a=a, b=b: torch.mm(a, b))
        peaks[key] = 2 * n**3 / secs / 1e12
    peaks["fp16"] = peaks["bf16"]
    src = torch.empty(8 * 2**20, dtype=torch.float32)
    dst = torch.empty_like(src)
    secs = _best_seconds(lambda: dst.copy_(src))
    bandwidth = 2 * src.numel() * 4 / secs  # read + write
    tiny = torch.ones(1)
    per_op = _best_seconds(lambda: [torch.add(tiny, tiny) for _ in range(200)]) / 200
    try:
        memory: int | None = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        memory = None
    threads = torch.get_num_threads()
    return DeviceSpec("cpu", memory, peaks, bandwidth, per_op * 1e6,
                      f"measured on this machine ({threads} thread{'s' if threads != 1 else ''})",
                      bandwidth / 4, bandwidth / 4, bandwidth,
                      "gloo over loopback between processes: assumed a quarter of the measured copy bandwidth")


def resolve_target(target: str | None = None, *, memory: int | str | None = None,
                   peak_tflops: float | None = None, bandwidth: float | str | None = None) -> DeviceSpec:
    """The device a prediction is for: a name from :data:`DEVICES` or ``cpu`` (this machine),
    with its memory, peak TFLOP/s (every precision) and bandwidth (bytes/s or e.g. '3.35TB')
    overridden when given; no name and only numbers: a custom device."""
    problems = ProblemCollector()
    mem: int | None = None
    if memory is not None:
        if isinstance(memory, (int, float)) and not isinstance(memory, bool) and memory <= 0:
            problems.add(f"device_memory={memory!r} must be positive (e.g. 80GiB).")
        else:
            try:
                mem = parse_memory(memory, name="device_memory")
            except ConfigError as exc:
                problems.add(str(exc))
    if peak_tflops is not None and not (isinstance(peak_tflops, (int, float)) and peak_tflops > 0):
        problems.add(f"peak_tflops={peak_tflops!r} must be a positive number of TFLOP/s.")
    bw: float | None = None
    if bandwidth is not None:
        try:
            bw = float(parse_memory(bandwidth, name="bandwidth"))
        except ConfigError as exc:
            problems.add(f"{exc} (bytes per second, e.g. 3.35TB)")
    name = (target or "").strip().lower()
    if name and name not in TARGET_NAMES:
        problems.add(f"target={target!r} is not a known device; valid: {', '.join(TARGET_NAMES)} "
                     "(or give device_memory=, peak_tflops= and bandwidth= for another one).")
    problems.raise_if_any()
    if name == "cpu":
        spec = _measured_cpu()
    elif name:
        spec = DEVICES[name]
    else:
        spec = DeviceSpec("custom", None, {}, None, 0.0, "given")
    changes: dict[str, Any] = {}
    if mem is not None:
        changes["memory_bytes"] = mem
    if peak_tflops is not None:
        changes["peak_tflops"] = {k: float(peak_tflops) for k in ("fp32", "bf16", "fp16")}
    if bw is not None:
        changes["bandwidth_bytes_s"] = bw
    if changes:
        changes["source"] = spec.source + " (overridden: " + ", ".join(sorted(changes)) + ")"
        spec = dataclasses.replace(spec, **changes)
    return spec


def roofline_ms(flops: float, nbytes: float, *, tflops: float | None, bandwidth: float | None,
                ops: int = 0, overhead_us: float = 0.0) -> tuple[float | None, str]:
    """Milliseconds of work with ``flops`` and ``nbytes`` moved: max(compute, memory) time plus
    the ops' launch overhead; and the bound ("compute", "memory" or "overhead")."""
    if not tflops or not bandwidth:
        return None, "unknown"
    compute = flops / (tflops * 1e12)
    memory = nbytes / bandwidth
    overhead = ops * overhead_us * 1e-6
    bound = "compute" if compute >= memory else "memory"
    if overhead > max(compute, memory):
        bound = "overhead"
    return (max(compute, memory) + overhead) * 1e3, bound


@dataclass
class LayerCost:
    """One layer's ops priced on a target: FLOPs and bytes of one micro-batch, estimated ms of the
    whole step per phase (forward, backward), and its compute, memory and launch seconds."""

    flops: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})
    ms: dict[str, float] = field(default_factory=lambda: {"forward": 0.0, "backward": 0.0})
    bytes: int = 0
    compute_s: float = 0.0
    memory_s: float = 0.0
    overhead_s: float = 0.0

    @property
    def bound(self) -> str:
        """What bounds its estimated time: "compute", "memory", "overhead" or "unknown"."""
        c, m, o = self.compute_s, self.memory_s, self.overhead_s
        if c == m == o == 0:
            return "unknown"
        if o > max(c, m):
            return "overhead"
        return "compute" if c >= m else "memory"


def price_phases(trace: MemoryTrace,
                 spec: DeviceSpec) -> tuple[dict[str, LayerCost], dict[str, float | None], str]:
    """Per layer and per phase: FLOPs, bytes, estimated ms, and the bound."""
    layers: dict[str, LayerCost] = {}
    phases: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in PHASES}  # compute s, memory s, ms
    known = bool(spec.bandwidth_bytes_s) and bool(spec.peak_tflops)
    for op in trace.ops:
        tflops = spec.tflops(op.compute)
        ms, _ = roofline_ms(op.flops, op.nbytes, tflops=tflops, bandwidth=spec.bandwidth_bytes_s,
                            ops=1, overhead_us=spec.op_overhead_us)
        w = trace.weight(op)  # FLOPs and bytes of one micro-batch; ms of the whole step
        cost = layers.setdefault(op.layer, LayerCost())
        if op.phase in ("forward", "backward"):
            if op.micro == 0:
                cost.flops[op.phase] += op.flops
                cost.bytes += op.nbytes
            cost.ms[op.phase] += w * (ms or 0.0)
        if known and tflops:
            c, m = op.flops / (tflops * 1e12), op.nbytes / float(spec.bandwidth_bytes_s or 1)
            cost.compute_s += w * c
            cost.memory_s += w * m
            cost.overhead_s += w * spec.op_overhead_us * 1e-6
            acc = phases[op.phase]
            acc[0] += w * c
            acc[1] += w * m
            acc[2] += w * (ms or 0.0)
    phase_ms: dict[str, float | None] = {p: (phases[p][2] if known else None) for p in PHASES}
    comp = sum(v[0] for v in phases.values())
    mem = sum(v[1] for v in phases.values())
    bound = "unknown" if not known else ("compute" if comp >= mem else "memory")
    return layers, phase_ms, bound
