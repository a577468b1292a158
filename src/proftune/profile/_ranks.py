"""Stragglers across DDP ranks: profile every rank's step and say which one holds the others up.

``profile_ranks(task, nprocs=N)`` starts N processes (gloo on CPU, NCCL on GPUs), each profiles
the task's DDP training step through the one profiler, and the per-rank phases are compared. In
DDP every rank waits for the slowest at the gradient all-reduce, so the step times come out
alike; what differs is the *busy* time (the step less the time waiting in the all-reduce). The
straggler is the rank with the most busy time; the phase where it loses the time is the one
where it exceeds the median of the ranks by the most.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict

import torch

from .._jsonsafe import json_dumps
from .._machine import free_port
from .._records import JsonRecord, Reader
from ..exceptions import ConfigError, RunFailedError
from ._records import CommProfile, StepProfile

__all__ = ["DDPPoint", "DDPScaling", "RankProfile", "RanksResult", "fit_scaling", "profile_ddp_batches",
           "profile_ranks"]

PHASES = ("data", "forward", "backward", "optimizer")
_ADVICE = {
    "data": ("its data loading: give it more DataLoader workers (num_workers), pinned memory and "
             "prefetching, and check the storage or preprocessing on that rank's node"),
    "forward": ("its forward pass: re-balance the batches (equal samples and, for sequences, "
                "bucket by length) and check that rank's device for other work or throttling"),
    "backward": ("its backward pass: re-balance the batches (equal samples and sequence lengths) "
                 "and check that rank's device for other work or throttling"),
    "optimizer": ("its optimizer step: check for per-rank work in the step (logging, "
                  "checkpointing on one rank) and that rank's device"),
}


@dataclass(frozen=True)
class RankProfile(JsonRecord):
    """One rank's step in ms: the phases, the all-reduce time and the busy time (step - wait)."""

    rank: int
    step_ms: float
    data_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    allreduce_ms: float
    busy_ms: float
    throughput: float
    #: Bytes all-reduced per step (the gradients, in DDP's buckets).
    allreduce_bytes: int = 0


@dataclass(frozen=True)
class RanksResult(JsonRecord):
    """Per-rank steps, the imbalance (max / median busy time), the straggler and what to do."""

    world_size: int
    backend: str
    ranks: list[RankProfile]
    imbalance: float
    step_imbalance: float
    slowest_rank: int
    phase: str | None
    excess_ms: float
    advice: str
    task: str = ""
    #: Figures by what they measure (``comm``: the per-rank batch, the median all-reduce ms, bytes
    #: and share of the step, and the busy ms per sample).
    extra: dict[str, dict[str, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class RankRow(JsonRecord):
    """One rank's profile at one per-rank batch size, as the rank hands it to the parent process."""

    WHAT: ClassVar[str] = "a rank's row"
    READERS: ClassVar[dict[str, Reader]] = {"step": lambda d: StepProfile(**d)}

    rank: int
    batch_size: int
    step: StepProfile
    allreduce_ms: float = 0.0
    allreduce_bytes: int = 0
    allreduce_calls: int = 0
    backend: str = ""
    task: str = ""


class _RankJob(TypedDict):
    """What every rank's :func:`profile` is given besides the batch size."""

    params: Mapping[str, Any] | None
    steps: int
    warmup: int
    device: str
    seed: int


def _rank_main(rank: int, world: int, port: int, spec: Any, kwargs: _RankJob, out_dir: str,
               threads: int, batch_sizes: Sequence[int | None]) -> None:
    import torch.distributed as dist

    from ._api import profile

    torch.set_num_threads(threads)
    use_cuda = kwargs.get("device") == "cuda"
    if use_cuda:
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    try:
        rows = []
        for b in batch_sizes:  # one process group, each batch size profiled in turn
            p = profile(spec, detail="step", batch_size=b, **kwargs)
            comm = p.comm or CommProfile()
            rows.append(asdict(RankRow(rank=rank, batch_size=p.batch_size, step=p.step, allreduce_ms=comm.allreduce_ms,
                                       allreduce_bytes=comm.allreduce_bytes, allreduce_calls=comm.allreduce_calls,
                                       backend=comm.backend, task=p.task or "")))
        Path(out_dir, f"rank{rank}.json").write_text(json_dumps(rows))
    finally:
        dist.destroy_process_group()


def _check(nprocs: int, device: str) -> None:
    if isinstance(nprocs, bool) or int(nprocs) < 2:
        raise ConfigError(f"ddp needs at least 2 processes, but got {nprocs=}.")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r} is not valid for a DDP profile; valid: cpu, cuda.")
    if device == "cuda" and torch.cuda.device_count() < int(nprocs):
        raise ConfigError(f"ddp={nprocs} on cuda needs {nprocs} GPUs, but this machine has "
                          f"{torch.cuda.device_count()}.")


def _run_ranks(task: Any, nprocs: int, kwargs: _RankJob, batch_sizes: Sequence[int | None],
               timeout_s: float) -> list[list[RankRow]]:
    """Start ``nprocs`` ranks that each profile every batch size; rows[batch][rank]."""
    import torch.multiprocessing as mp

    threads = max(1, (os.cpu_count() or 1) // int(nprocs))
    with tempfile.TemporaryDirectory(prefix="proftune-ddp-") as tmp:
        ctx = mp.get_context("spawn")
        port = free_port()
        procs = [ctx.Process(target=_rank_main,
                             args=(r, int(nprocs), port, task, kwargs, tmp, threads, list(batch_sizes)))
                 for r in range(int(nprocs))]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            stopped = [r for r, code in bad if code is not None and code < 0]
            late = f"; rank(s) {stopped} were stopped at timeout_s={timeout_s}" if stopped else ""
            raise RunFailedError(f"DDP ranks ended with errors: {bad} (rank, exit code){late}; a rank that "
                                 "raised printed its traceback to stderr, above.")
        per_rank = [[RankRow.from_dict(d) for d in json.loads(Path(tmp, f"rank{r}.json").read_text())]
                    for r in range(int(nprocs))]
    return [[per_rank[r][i] for r in range(int(nprocs))] for i in range(len(batch_sizes))]


def profile_ranks(task: Any, *, nprocs: int, params: Mapping[str, Any] | None = None,
                  batch_size: int | None = None, steps: int = 5, warmup: int = 2,
                  device: str = "cpu", seed: int = 0, timeout_s: float = 600.0) -> RanksResult:
    """Profile ``task``'s DDP step on ``nprocs`` ranks of this machine and find the straggler.

    ``task`` must be loadable in a fresh process: a spec (``file.py[:Class]``, ``pkg.mod:Class``,
    a built-in name) or a picklable Task. ``device``: ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU
    per rank).
    """
    _check(nprocs, device)
    kwargs = _RankJob(params=params, steps=steps, warmup=warmup, device=device, seed=seed)
    (rows,) = _run_ranks(task, nprocs, kwargs, [batch_size], timeout_s)
    return summarize_ranks(rows)


@dataclass(frozen=True)
class DDPPoint(JsonRecord):
    """The DDP step at one per-rank batch size: the slowest rank's step, the ranks' median
    all-reduce time and bytes, and the global throughput (samples of all ranks per second)."""

    batch_size: int
    step_ms: float
    busy_ms: float
    allreduce_ms: float
    allreduce_bytes: int
    allreduce_calls: int
    throughput: float
    allreduce_share: float


@dataclass(frozen=True)
class DDPScaling(JsonRecord):
    """DDP steps at several per-rank batch sizes and the line step_ms = fixed_ms + per_sample_ms·B
    fitted through them. The all-reduce moves the gradients, whose size does not depend on the
    batch: ``allreduce_ms`` and ``allreduce_bytes`` are the medians over the points."""

    world_size: int
    backend: str
    points: list[DDPPoint]
    fixed_ms: float
    per_sample_ms: float
    allreduce_ms: float
    allreduce_bytes: int
    task: str = ""

    def step_ms(self, batch_size: float) -> float:
        """Predicted ms of one DDP step at ``batch_size`` samples per rank."""
        return self.fixed_ms + self.per_sample_ms * batch_size

    def throughput(self, batch_size: float) -> float:
        """Predicted samples per second over all ranks at ``batch_size`` per rank."""
        return self.world_size * batch_size / self.step_ms(batch_size) * 1e3


def ddp_point(rows: list[RankRow]) -> DDPPoint:
    """One batch size's per-rank rows as a :class:`DDPPoint`."""
    b = rows[0].batch_size
    step = max(r.step.time_ms for r in rows)
    ar = statistics.median(r.allreduce_ms for r in rows)
    busy = statistics.median(max(0.0, r.step.time_ms - r.allreduce_ms) for r in rows)
    return DDPPoint(batch_size=b, step_ms=step, busy_ms=busy, allreduce_ms=ar,
                    allreduce_bytes=int(statistics.median(r.allreduce_bytes for r in rows)),
                    allreduce_calls=int(statistics.median(r.allreduce_calls for r in rows)),
                    throughput=len(rows) * b / step * 1e3 if step > 0 else 0.0,
                    allreduce_share=ar / step if step > 0 else 0.0)


def fit_scaling(points: list[DDPPoint], *, world_size: int, backend: str, task: str = "") -> DDPScaling:
    """The least-squares line of step time over per-rank batch size through ``points``."""
    if len({p.batch_size for p in points}) < 2:
        raise ConfigError(f"a DDP scaling fit needs two batch sizes or more, but got "
                          f"{sorted({p.batch_size for p in points})}.")
    xs = [float(p.batch_size) for p in points]
    ys = [p.step_ms for p in points]
    xm, ym = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - xm) * (y - ym) for x, y in zip(xs, ys, strict=True)) / sum((x - xm) ** 2 for x in xs)
    slope = max(slope, 0.0)
    fixed = max(ym - slope * xm, 0.0)
    return DDPScaling(world_size=world_size, backend=backend, points=points, fixed_ms=fixed, per_sample_ms=slope,
                      allreduce_ms=statistics.median(p.allreduce_ms for p in points),
                      allreduce_bytes=int(statistics.median(p.allreduce_bytes for p in points)), task=task)


def profile_ddp_batches(task: Any, *, nprocs: int, batch_sizes: list[int], params: Mapping[str, Any] | None = None,
                        steps: int = 5, warmup: int = 2, rounds: int = 2, device: str = "cpu", seed: int = 0,
                        timeout_s: float = 600.0) -> DDPScaling:
    """Profile ``task``'s DDP step at each per-rank batch size in ``batch_sizes`` (one set of
    ``nprocs`` ranks for all of them) and fit how the step grows with the batch.

    The sizes are profiled in ``rounds`` interleaved rounds and each size keeps its fastest
    round: the first profile in a fresh process pays for warming up, and a burst of load on a
    shared machine hits one round, not every one.
    """
    _check(nprocs, device)
    sizes = sorted({int(b) for b in batch_sizes})
    if len(sizes) < 2 or sizes[0] < 1:
        raise ConfigError(f"batch_sizes={batch_sizes!r} needs two different sizes >= 1.")
    if isinstance(rounds, bool) or int(rounds) < 1:
        raise ConfigError(f"rounds must be >= 1, but got {rounds=}.")
    kwargs = _RankJob(params=params, steps=steps, warmup=warmup, device=device, seed=seed)
    per_batch = _run_ranks(task, nprocs, kwargs, list(sizes) * int(rounds), timeout_s)
    measured = [ddp_point(rows) for rows in per_batch]
    points = [min((m for m in measured if m.batch_size == b), key=lambda m: m.step_ms) for b in sizes]
    first = per_batch[0][0]
    return fit_scaling(points, world_size=int(nprocs), backend=first.backend, task=first.task)


def summarize_ranks(rows: list[RankRow]) -> RanksResult:
    """The straggler analysis of per-rank step measurements (one row per rank)."""
    ranks = []
    for row in sorted(rows, key=lambda r: r.rank):
        s, wait = row.step, row.allreduce_ms
        ranks.append(RankProfile(
            rank=row.rank, step_ms=s.time_ms, data_ms=s.data_ms, forward_ms=s.forward_ms, backward_ms=s.backward_ms,
            optimizer_ms=s.optimizer_ms, allreduce_ms=wait, busy_ms=max(0.0, s.time_ms - wait),
            throughput=s.throughput, allreduce_bytes=row.allreduce_bytes))
    busy = [r.busy_ms for r in ranks]
    med = statistics.median(busy) or 1e-9
    slow = max(ranks, key=lambda r: r.busy_ms)
    phase, excess = _losing_phase(ranks, slow)
    imbalance = slow.busy_ms / med
    step_imb = max(r.step_ms for r in ranks) / (statistics.median([r.step_ms for r in ranks]) or 1e-9)
    if imbalance < 1.1 or phase is None:
        advice = (f"ranks are balanced: the busiest (rank {slow.rank}) is {imbalance:.2f}x the median "
                  "busy time; nothing to re-balance.")
    else:
        advice = (f"rank {slow.rank} is the straggler: {slow.busy_ms:.1f} ms busy per step against a "
                  f"median of {med:.1f} ms ({imbalance:.2f}x); it loses {excess:.1f} ms in "
                  f"{_ADVICE[phase]}. The other ranks wait for it in the all-reduce.")
    b = rows[0].batch_size
    comm = {"batch_size": b, "allreduce_ms": statistics.median(r.allreduce_ms for r in ranks),
            "allreduce_bytes": int(statistics.median(r.allreduce_bytes for r in ranks)),
            "allreduce_share": statistics.median(r.allreduce_ms / r.step_ms if r.step_ms > 0 else 0.0 for r in ranks),
            # the step less the all-reduce wait, per sample: an upper bound of the compute per sample
            # (the fixed part of the step, the optimizer's, is in it; profile_ddp_batches splits them)
            "busy_ms_per_sample": med / b if b else None}
    return RanksResult(world_size=len(ranks), backend=rows[0].backend, ranks=ranks,
                       imbalance=imbalance, step_imbalance=step_imb, slowest_rank=slow.rank,
                       phase=phase if imbalance >= 1.1 else None, excess_ms=excess, advice=advice,
                       task=rows[0].task, extra={"comm": comm})


def _losing_phase(ranks: list[RankProfile], slow: RankProfile) -> tuple[str | None, float]:
    """The phase where ``slow`` exceeds the other ranks' median by the most (ms).

    The backward phase of a waiting rank holds its all-reduce wait, so backward is compared net
    of the all-reduce time.
    """
    def value(r: RankProfile, phase: str) -> float:
        if phase == "backward":
            return max(0.0, r.backward_ms - r.allreduce_ms)
        return float(getattr(r, f"{phase}_ms"))

    others = [r for r in ranks if r.rank != slow.rank] or ranks
    best, best_excess = None, 0.0
    for phase in PHASES:
        excess = value(slow, phase) - statistics.median(value(r, phase) for r in others)
        if excess > best_excess:
            best, best_excess = phase, excess
    return best, best_excess
