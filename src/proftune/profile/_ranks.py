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
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..exceptions import ConfigError, RunFailedError

__all__ = ["RankProfile", "RanksResult", "profile_ranks"]

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
class RankProfile:
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


@dataclass(frozen=True)
class RanksResult:
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
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = [asdict(r) for r in self.ranks]
        return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, spec: Any, kwargs: dict[str, Any], out_dir: str,
               threads: int) -> None:
    import torch.distributed as dist

    from ._api import profile

    torch.set_num_threads(threads)
    use_cuda = kwargs.get("device") == "cuda"
    if use_cuda:
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    try:
        p = profile(spec, detail="step", **kwargs)
        comm = p.comm
        d = {"rank": rank, "step": asdict(p.step), "allreduce_ms": comm.allreduce_ms if comm else 0.0,
             "backend": comm.backend if comm else "", "task": p.task or ""}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(d))
    finally:
        dist.destroy_process_group()


def profile_ranks(task: Any, *, nprocs: int, params: dict[str, Any] | None = None,
                  batch_size: int | None = None, steps: int = 5, warmup: int = 2,
                  device: str = "cpu", seed: int = 0, timeout_s: float = 600.0) -> RanksResult:
    """Profile ``task``'s DDP step on ``nprocs`` ranks of this machine and find the straggler.

    ``task`` must be loadable in a fresh process: a spec (``file.py[:Class]``, ``pkg.mod:Class``,
    a built-in name) or a picklable Task. ``device``: ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU
    per rank).
    """
    import torch.multiprocessing as mp

    if isinstance(nprocs, bool) or int(nprocs) < 2:
        raise ConfigError(f"ddp needs at least 2 processes, but got {nprocs=}.")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r} is not valid for a DDP profile; valid: cpu, cuda.")
    if device == "cuda" and torch.cuda.device_count() < int(nprocs):
        raise ConfigError(f"ddp={nprocs} on cuda needs {nprocs} GPUs, but this machine has "
                          f"{torch.cuda.device_count()}.")
    kwargs = {"params": params, "batch_size": batch_size, "steps": steps, "warmup": warmup,
              "device": device, "seed": seed}
    threads = max(1, (os.cpu_count() or 1) // int(nprocs))
    with tempfile.TemporaryDirectory(prefix="proftune-ddp-") as tmp:
        ctx = mp.get_context("spawn")
        port = _free_port()
        procs = [ctx.Process(target=_rank_main, args=(r, int(nprocs), port, task, kwargs, tmp, threads))
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
            raise RunFailedError(f"DDP ranks ended with errors: {bad} (rank, exit code); run with "
                                 "--debug to see their output.")
        rows = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(int(nprocs))]
    return summarize_ranks(rows)


def summarize_ranks(rows: list[dict[str, Any]]) -> RanksResult:
    """The straggler analysis of per-rank step measurements (one dict per rank)."""
    ranks = []
    for row in sorted(rows, key=lambda r: int(r["rank"])):
        s = row["step"]
        wait = float(row.get("allreduce_ms") or 0.0)
        ranks.append(RankProfile(
            rank=int(row["rank"]), step_ms=float(s["time_ms"]), data_ms=float(s["data_ms"]),
            forward_ms=float(s["forward_ms"]), backward_ms=float(s["backward_ms"]),
            optimizer_ms=float(s["optimizer_ms"]), allreduce_ms=wait,
            busy_ms=max(0.0, float(s["time_ms"]) - wait), throughput=float(s.get("throughput", 0.0))))
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
    return RanksResult(world_size=len(ranks), backend=str(rows[0].get("backend", "")), ranks=ranks,
                       imbalance=imbalance, step_imbalance=step_imb, slowest_rank=slow.rank,
                       phase=phase if imbalance >= 1.1 else None, excess_ms=excess, advice=advice,
                       task=str(rows[0].get("task", "")))


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
