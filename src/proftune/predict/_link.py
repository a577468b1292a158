"""The link between data-parallel ranks, measured: a short all-reduce, all-gather and
reduce-scatter sweep on the ranks at hand, each collective's time as a line in the bytes one
rank sends (a latency per call plus bytes over a bandwidth).

A prediction's collectives are priced with it instead of a datasheet's link figure where the
ranks are this machine's (``target="cpu"``: gloo between processes, where the link is whatever
loopback and the load give). :func:`sweep_collectives` runs inside ranks that already have a
process group (a benchmark's own); :func:`measure_link` starts the ranks for it.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from .._machine import free_port
from .._records import JsonRecord
from ..exceptions import ConfigError, RunFailedError

__all__ = ["COLLECTIVES", "LinkFigures", "Replayed", "ReplayedCall", "collective_kind", "measure_link",
           "replay_collectives", "replayed_calls", "sweep_collectives"]

#: The collectives a strategy runs, by the name a :class:`~proftune.predict.Collective` starts with.
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter")
#: Elements (fp32) of each sweep's tensors: 16 KiB to 4 MiB.
SWEEP_ELEMENTS = (4096, 65536, 1 << 20)


def collective_kind(name: str) -> str:
    """``all-gather`` of ``all-gather parameters (forward)``: the collective a step's entry runs."""
    for kind in COLLECTIVES:
        if name.startswith(kind):
            return kind
    raise ConfigError(f"collective name={name!r} starts with none of {', '.join(COLLECTIVES)}.")


def _ring_factor(kind: str, n: int) -> float:
    """Bytes one rank sends per byte of the full tensor (ring algorithms)."""
    share = (n - 1) / n if n > 1 else 0.0
    return 2 * share if kind == "all-reduce" else share


@dataclass(frozen=True)
class LinkFigures(JsonRecord):
    """Each collective's latency (s per call) and bandwidth (bytes one rank sends per s),
    measured on ``ranks`` ranks over ``backend``; ``overlaps``: whether collectives run beside
    compute (a GPU's own streams) rather than on the cores that compute (gloo on CPU)."""

    WHAT: ClassVar[str] = "a link's figures"

    backend: str
    ranks: int
    collectives: dict[str, dict[str, float]]
    overlaps: bool
    source: str

    def seconds(self, name: str, bytes_per_gpu: float, calls: int = 1) -> float:
        """Seconds of ``calls`` launches of collective ``name`` sending ``bytes_per_gpu`` in all."""
        fig = self.collectives[collective_kind(name)]
        return calls * fig["latency_s"] + bytes_per_gpu / fig["bytes_s"]

    @property
    def bytes_s(self) -> float:
        """The slowest collective's bandwidth (the one figure a summary line shows)."""
        return min(c["bytes_s"] for c in self.collectives.values())

    @classmethod
    def from_dict(cls, d: Any) -> LinkFigures:
        missing = [k for k in ("backend", "ranks", "collectives") if k not in d]
        kinds = [k for k in COLLECTIVES if k not in (d.get("collectives") or {})]
        if missing or kinds:
            raise ConfigError(f"link={d!r} is not a measured link: it lacks {', '.join(missing + kinds)}; "
                              "valid: LinkFigures.to_dict()'s keys, with all of " + ", ".join(COLLECTIVES) + ".")
        return cls(str(d["backend"]), int(d["ranks"]), {k: dict(v) for k, v in d["collectives"].items()},
                   bool(d.get("overlaps", False)), str(d.get("source", "")))


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(latency s, bytes/s) of the least-squares line t = latency + bytes / bandwidth."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    if slope <= 0:  # flat in the bytes: all latency; the bandwidth from the largest size alone
        return min(ys), max(xs) / max(max(ys), 1e-9)
    return max(0.0, my - slope * mx), 1.0 / slope


def sweep_collectives(*, elements: tuple[int, ...] = SWEEP_ELEMENTS, repeats: int = 5,
                      device: torch.device | str = "cpu") -> dict[str, dict[str, float]]:
    """Time each collective at each size on the process group of this rank (every rank calls
    it); per collective its latency and bandwidth (the median of ``repeats`` at each size)."""
    import torch.distributed as dist

    n = dist.get_world_size()
    gather, scatter = _gather_scatter()
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    out: dict[str, dict[str, float]] = {}
    for kind in COLLECTIVES:
        points = []
        for size in elements:
            size -= size % n
            full = torch.ones(size, device=device)
            shard = torch.empty(size // n, device=device)

            def once(kind: str = kind, full: torch.Tensor = full, shard: torch.Tensor = shard) -> None:
                if kind == "all-reduce":
                    dist.all_reduce(full)
                elif kind == "all-gather":
                    gather(full, shard)
                else:
                    scatter(shard, full)

            once()
            times = []
            for _ in range(repeats):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                once()
                sync()
                times.append(time.perf_counter() - t0)
            points.append((_ring_factor(kind, n) * size * full.element_size(), statistics.median(times)))
        latency, bw = _line(points)
        out[kind] = {"latency_s": latency, "bytes_s": bw}
    return out


class ReplayedCall(NamedTuple):
    """One of a step's collectives as its ranks launch it: ``launches`` calls per step of a
    tensor of ``elements`` (fp32; the full tensor, each rank's share of it for the gathers)."""

    name: str
    kind: str
    elements: int
    launches: int


def replayed_calls(collectives: Any, ranks: int) -> list[ReplayedCall]:
    """The calls that send a strategy's ``collectives`` (:class:`~proftune.predict.Collective`,
    bytes each rank sends by the ring) on ``ranks`` ranks: each launch's full tensor, in fp32."""
    out = []
    for c in collectives:
        kind = collective_kind(c.name)
        launches = max(1, c.calls) * c.times
        full = c.bytes_per_gpu / max(_ring_factor(kind, ranks), 1e-9) / max(1, c.calls) / 4
        out.append(ReplayedCall(c.name, kind, max(ranks, int(full) - int(full) % ranks), launches))
    return out


def _gather_scatter() -> tuple[Any, Any]:
    import torch.distributed as dist

    # torch 2.14 renamed the tensor forms (the old names warn); older releases have only those
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor,
            getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)


def _busy(ms: float, a: torch.Tensor) -> None:
    """``ms`` of this thread's CPU time spent on matmuls (a step's compute between its collectives)."""
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        torch.mm(a, a)


class Replayed(NamedTuple):
    """What :func:`replay_collectives` measured per step (medians of its rounds): ms inside each
    call, and the wall and CPU ms of the work spent between them (the share of a core the rank's
    compute gets while it waits on its collectives between its pieces of compute)."""

    collectives_ms: dict[str, float]
    work_wall_ms: float
    work_cpu_ms: float


def replay_collectives(calls: list[ReplayedCall], *, repeats: int = 3, work_ms: float = 0.0) -> Replayed:
    """Milliseconds per step inside each call (its ``launches``, each after ``work_ms`` of CPU
    work as the step computes between them, so a rank that the cores' time slicing holds back
    keeps the others waiting as in the step; the median of ``repeats`` after one warm-up round)
    on the process group of this rank (every rank calls it), and that work's wall and CPU ms."""
    import torch.distributed as dist

    n = dist.get_world_size()
    gather, scatter = _gather_scatter()
    tensors = {c.name: (torch.ones(c.elements), torch.empty(c.elements // n)) for c in calls}
    a = torch.rand(64, 64)

    def once(call: ReplayedCall) -> None:
        full, shard = tensors[call.name]
        if call.kind == "all-reduce":
            dist.all_reduce(full)
        elif call.kind == "all-gather":
            gather(full, shard)
        else:
            scatter(shard, full)

    per: dict[str, list[float]] = {c.name: [] for c in calls}
    work: list[tuple[float, float]] = []
    for r in range(repeats + 1):
        dist.barrier()
        spent = dict.fromkeys(per, 0.0)
        wall = cpu = 0.0
        for call in calls:
            for _ in range(call.launches):
                w0, c0 = time.perf_counter(), time.thread_time()
                _busy(work_ms, a)
                t0 = time.perf_counter()
                wall += (t0 - w0) * 1e3
                cpu += (time.thread_time() - c0) * 1e3
                once(call)
                spent[call.name] += (time.perf_counter() - t0) * 1e3
        if r:  # the first round warms gloo's buffers up
            for name, ms in spent.items():
                per[name].append(ms)
            work.append((wall, cpu))
    return Replayed({name: statistics.median(v) for name, v in per.items()},
                    statistics.median(w for w, _ in work), statistics.median(c for _, c in work))


def _rank(rank: int, world: int, port: int, backend: str, queue: Any) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        figures = sweep_collectives(device=device)
        if rank == 0:
            queue.put(figures)
    finally:
        dist.destroy_process_group()


@functools.lru_cache(maxsize=8)
def measure_link(ranks: int, *, backend: str = "gloo") -> LinkFigures:
    """Start ``ranks`` processes on this machine (gloo on CPU, or nccl on as many CUDA GPUs) and
    measure each collective's latency and bandwidth between them (about a second or two, plus
    the processes' start); cached per process."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ConfigError(f"a measured link needs ranks >= 2, but got {ranks=}.")
    if backend not in ("gloo", "nccl"):
        raise ConfigError(f"backend={backend!r} is unknown; valid: gloo, nccl.")
    if backend == "nccl" and torch.cuda.device_count() < ranks:
        raise ConfigError(f"backend='nccl' on ranks={ranks} needs {ranks} CUDA GPUs, but this machine has "
                          f"{torch.cuda.device_count()}; valid: backend='gloo' (CPU ranks).")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    try:
        mp.start_processes(_rank, args=(ranks, free_port(), backend, queue), nprocs=ranks, join=True,
                           start_method="spawn")
    except mp.ProcessRaisedException as exc:
        raise RunFailedError(f"measuring the link on {ranks} {backend} ranks failed: {exc}") from exc
    figures = queue.get()
    where = "CPU processes over loopback" if backend == "gloo" else "GPUs of this machine"
    sizes = ", ".join(f"{4 * e // 1024} KiB" for e in SWEEP_ELEMENTS)
    return LinkFigures(backend, ranks, figures, overlaps=backend == "nccl",
                       source=f"measured: {backend} between {ranks} {where}, all-reduce/all-gather/reduce-scatter "
                              f"at {sizes}, median of 5 each, a line in the bytes each rank sends")
