"""The compute part of a data-parallel step, measured where it can be: a few of the fit loop's
own steps (:func:`proftune.train.run_step`) of one process at the per-rank batch, timed by phase,
on the device the ranks would run on, at the threads one rank would have.

The roofline's compute is what a device's peak FLOPs and bandwidth allow; on a CPU, small
matmuls reach a fraction of that peak (one process's step measures 2-4x the roofline's), so a
prediction for this machine's ranks (``target="cpu"``, or the CUDA GPU proftune runs on) times
the step instead, and keeps the roofline only where nothing can be measured: a named GPU that
is not here, or a model too large to run here.

For one strategy on this machine's CPU ranks, :func:`measure_in_ranks` starts the ranks: each
steps as one rank alone, all at once (their sharing of the cores and the load is measured, not
modelled), then they replay the step's collectives between them at its sizes and launches, each
launch after its share of the step's compute, so that the waiting of ranks that the cores' time
slicing holds back is in the figure (issue 46: one process's step and a separate sweep met other
moments of the load and missed that waiting: 4 of 16 cases within 25%).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._device import move_to_device
from .._machine import available_memory_bytes, cores, free_port
from ..exceptions import ConfigError, RunFailedError
from ..task import Task, load_task
from ..train import StepSpec, TimedPhases, TrainParams, run_step
from ._checkpointing import apply_activation_checkpointing
from ._link import ReplayedCall, replay_collectives

__all__ = ["BLOCKING", "COMPUTE", "ComputeFigures", "between_collectives", "can_start_ranks", "measure_compute",
           "measure_in_ranks", "rank_sharing", "spare_cores_per_rank", "why_not_measured"]

#: Where the step's compute comes from: ``auto`` (measured where the ranks would run here, else
#: the roofline) or ``roofline`` (the device table's peak FLOPs and bandwidth, always).
COMPUTE = ("auto", "roofline")
#: Threads each CPU rank computes with: ``torchrun`` sets ``OMP_NUM_THREADS=1`` for more than one
#: process per node, as ``measure_link`` and the gloo benchmarks do.
CPU_RANK_THREADS = 1
#: Measured only when the roofline's step is below this (ms; it reads 2-4x low on a CPU) and the
#: traced peak below this share of the available host memory.
MAX_ROOFLINE_STEP_MS = 2000.0
MAX_MEMORY_SHARE = 0.5
#: CPU ranks that step here to be measured (more: one process's step, the sharing modelled).
MAX_RANKS_HERE = max(4, 2 * cores())


@dataclass(frozen=True)
class ComputeFigures:
    """One process's measured phases at ``batch_size`` (median of ``steps`` timed steps after
    warm-up): forward and backward per micro-batch, the whole model's optimizer step, in ms."""

    device: str
    threads: int
    batch_size: int
    checkpointing: str
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    steps: int
    #: The strategy whose runtime wrapped the model (one rank of it), or "" (the bare model).
    wrapped: str = ""
    #: Cores' worth of CPU time the process got while it ran (its CPU time over the wall time):
    #: below ``threads`` where other processes took the rest of the cores.
    cpu_share: float = 1.0
    #: Processes that stepped together, each as one rank (the median rank's phases): where more
    #: than one, their sharing of the cores is in the figures, not modelled.
    ranks: int = 1
    #: The ranks the model was wrapped for (all but one pretended): a rank's shards, not the whole.
    world: int = 1
    #: Milliseconds per step of each of the strategy's collectives (by name), replayed at the
    #: sizes and launches the step sends them in, between those ranks (empty: priced by a link).
    collectives_ms: dict[str, float] = field(default_factory=dict)
    #: Forward and backward timed at the share of a core the rank got between its replayed
    #: collectives, which it waits on in the compute thread (FSDP on CPU: ``BLOCKING``), not as
    #: the ranks stepped together without them.
    between_collectives: bool = False

    @property
    def source(self) -> str:
        who = "one process" if self.ranks == 1 else f"each of {self.ranks} processes stepping together"
        return (f"measured: {self.steps} steps of {who} on {self.device} at {self.threads} "
                f"thread{'s' if self.threads > 1 else ''} ({self.cpu_share:.2f} of a core's time each), "
                f"per-rank batch {self.batch_size}, checkpointing {self.checkpointing}"
                + (f", wrapped as one {self.wrapped} rank" if self.wrapped else "")
                + (f" of {self.world} (the others pretended)" if self.world > 1 else "")
                + (", forward and backward at the share of a core each rank got between its replayed collectives"
                   if self.between_collectives else ""))


class _PhaseTimer(TimedPhases):
    """Milliseconds spent in each phase of the steps it wraps."""

    def __init__(self, sync: Any) -> None:
        self.sync = sync
        self.ms = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.ms[phase] += (time.perf_counter() - t0) * 1e3


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


#: The strategies whose runtime is PyTorch's own, wrapped as the ranks wrap the model (one rank).
WRAPPED = ("ddp", "fsdp", "fsdp-no-reshard")
#: Those whose collectives a CPU rank waits on in its compute thread, between its units' compute:
#: FSDP2 on CPU has no streams, its all-gathers and reduce-scatters return when done (DDP's
#: all-reduces run in gloo's thread beside the backward). While a rank waits, its core is free
#: for the other ranks' compute: on 2 ranks of 2 shared cores, 8 blocks, accumulation 4 (load 3),
#: the real ranks computed at 0.94 of a core between their collectives, 0.5 stepping together
#: without them (issue 46: FSDP2 predicted 1.1-1.5x the measured step).
BLOCKING = ("fsdp", "fsdp-no-reshard")


def _group_size() -> int:
    """The ranks of this process's group (1 where there is none)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@contextlib.contextmanager
def _one_rank(strategy: str, device: torch.device, world: int = 1) -> Iterator[bool]:
    """A process group of this process alone while the strategy's own runtime is measured, when
    none is there already: True when the model is to be wrapped. Of ``world`` ranks, all but this
    one pretended (PyTorch's ``fake`` backend: its collectives return at once), so that FSDP holds
    a rank's shards and runs its copies in and out of each all-gather and reduce-scatter, which
    it skips in a group of one; else gloo, an in-memory store."""
    import torch.distributed as dist

    if strategy not in WRAPPED or not dist.is_available() or dist.is_initialized() or device.type != "cpu":
        yield False
        return
    fake: Any = None
    if world > 1 and strategy != "ddp":  # DDP's Reducer copies its buckets in a group of one too
        with contextlib.suppress(ImportError):
            from torch.testing._internal.distributed.fake_pg import FakeStore as fake
    if fake is not None:
        dist.init_process_group("fake", store=fake(), rank=0, world_size=world)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield True
    finally:
        dist.destroy_process_group()


def _wrap(model: torch.nn.Module, strategy: str) -> torch.nn.Module:
    """The model as the strategy's ranks hold it: DDP, or ``fully_shard`` on each block then the root."""
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    from ._checkpointing import block_units

    for _, unit in block_units(model):
        fully_shard(unit, reshard_after_forward=strategy != "fsdp-no-reshard")
    wrapped = fully_shard(model)
    assert isinstance(wrapped, torch.nn.Module)  # fully_shard returns the module, its class extended
    return wrapped


def measure_compute(task: Task, given: TrainParams, *, batch_size: int, checkpointing: str = "none",
                    strategy: str = "", device: torch.device | str = "cpu", threads: int = CPU_RANK_THREADS,
                    steps: int = 5, warmup: int = 2,
                    before_step: Callable[[], object] | None = None, world: int = 1) -> ComputeFigures:
    """Time ``steps`` of the fit loop's step of ``task`` (with ``given``'s params, its micro-batches)
    at ``batch_size`` on ``device`` at ``threads`` CPU threads, after ``warmup`` steps (the first
    creates the optimizer state); each phase's median. With ``strategy`` DDP or FSDP (on CPU) the
    model runs wrapped as one rank of it holds it, in a process group of this process alone: the
    runtime's own work per bucket and per unit (copies in and out, hooks) is in the phases, the
    collectives between ranks are not. ``world``: FSDP wrapped as one rank of that many (the
    others pretended: a rank's shards, its copies in and out). ``before_step``: called before
    each step (processes that step together wait for each other there)."""
    dev, params = torch.device(device), given.params
    spec = StepSpec.from_params(params)
    batch = move_to_device(next(iter(task.train_data(batch_size, params))), dev)
    micro = [batch] * spec.grad_accumulation
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    with _threads(threads), _one_rank(strategy, dev, world) as wrap:
        state = torch.random.get_rng_state()
        torch.manual_seed(0)
        model = task.build_model(params).to(dev)
        torch.random.set_rng_state(state)
        apply_activation_checkpointing(model, checkpointing)
        if wrap:
            model = _wrap(model, strategy)
        optimizer = task.configure_optimizer(model, params)
        scaler = spec.grad_scaler(dev.type)
        per: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
        wall = cpu = 0.0
        for i in range(warmup + steps):
            timer = _PhaseTimer(sync)
            if before_step is not None:
                before_step()
            w0, c0 = time.perf_counter(), time.process_time()
            run_step(task, model, optimizer, micro, spec, device_type=dev.type, scaler=scaler, phases=timer)
            if i >= warmup:
                wall += time.perf_counter() - w0
                cpu += time.process_time() - c0
                for phase, ms in timer.ms.items():
                    per[phase].append(ms)
        wrapped = strategy if wrap else ""
        world = _group_size() if wrap else 1
    n = len(micro)
    return ComputeFigures(device=str(dev), threads=threads, batch_size=batch_size, checkpointing=checkpointing,
                          wrapped=wrapped, world=world,
                          forward_ms=statistics.median(per["forward"]) / n,
                          backward_ms=statistics.median(per["backward"]) / n,
                          optimizer_ms=statistics.median(per["optimizer"]), steps=steps,
                          cpu_share=min(float(threads), cpu / wall) if wall > 0 and dev.type == "cpu" else 1.0)


@dataclass(frozen=True)
class _RankJob:
    """What each of :func:`measure_in_ranks`'s processes measures: the task's step at
    ``batch_size``, then the step's collectives ``calls`` replayed ``repeats`` times."""

    task: Task | str
    given: TrainParams
    batch_size: int
    checkpointing: str
    strategy: str
    threads: int
    steps: int
    warmup: int
    repeats: int
    calls: list[ReplayedCall]


def _in_rank(rank: int, world: int, port: int, job: _RankJob, barrier: Any, queue: Any) -> None:
    """One of :func:`measure_in_ranks`'s processes: its compute as one rank alone, stepping with
    the others, then the step's collectives between all of them."""
    import torch.distributed as dist

    torch.set_num_threads(job.threads)
    task = load_task(job.task)
    figures = measure_compute(task, job.given, batch_size=job.batch_size, checkpointing=job.checkpointing,
                              strategy=job.strategy, threads=job.threads, steps=job.steps,
                              warmup=job.warmup, before_step=barrier.wait, world=world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        # the step's CPU time spread over its collectives' launches, spent before each one
        micro = StepSpec.from_params(job.given.params).grad_accumulation
        cpu_ms = figures.cpu_share * micro * (figures.forward_ms + figures.backward_ms)
        launches = sum(c.launches for c in job.calls)
        replayed = replay_collectives(job.calls, repeats=job.repeats, work_ms=cpu_ms / max(launches, 1))
    finally:
        dist.destroy_process_group()
    if job.strategy in BLOCKING:
        figures = between_collectives(figures, replayed.work_wall_ms, replayed.work_cpu_ms)
    queue.put((rank, figures, replayed.collectives_ms))


def between_collectives(figures: ComputeFigures, wall_ms: float, cpu_ms: float) -> ComputeFigures:
    """``figures`` with forward and backward at the share of a core (``cpu_ms`` over ``wall_ms``
    of the work replayed between the collectives) that a rank gets where it waits on each of its
    collectives between its pieces of compute, instead of the share it got stepping without them."""
    if wall_ms <= 0 or cpu_ms <= 0:
        return figures  # no work replayed (no collectives): nothing measured to say otherwise
    share = min(float(figures.threads), cpu_ms / wall_ms)
    scale = figures.cpu_share / share
    return dataclasses.replace(figures, forward_ms=figures.forward_ms * scale,
                               backward_ms=figures.backward_ms * scale, cpu_share=share, between_collectives=True)


def can_start_ranks(task: Task | str) -> bool:
    """Whether spawned processes can rebuild ``task`` (a spec string, or a picklable Task)."""
    try:
        pickle.dumps(task)
    except Exception:  # noqa: BLE001 - any pickling failure (a local class, a lambda, an open file) means no
        return False
    return True


def measure_in_ranks(task: Task | str, given: TrainParams, *, ranks: int, batch_size: int,
                     calls: Sequence[ReplayedCall], checkpointing: str = "none", strategy: str = "",
                     threads: int = CPU_RANK_THREADS, steps: int = 5, warmup: int = 2,
                     repeats: int = 3) -> ComputeFigures:
    """Start ``ranks`` CPU processes that step together, each wrapped as one rank of ``strategy``
    holds the model (``measure_compute`` in a group of itself, all waiting for each other before
    each step: their sharing of the cores and the load measured as it happens), then replay the
    step's collectives ``calls`` between them (:func:`replay_collectives`); the median rank's
    phases and each collective's median ms per step."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ConfigError(f"measure_in_ranks needs ranks >= 2, but got {ranks=}.")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, barrier = ctx.SimpleQueue(), ctx.Barrier(ranks)
    job = _RankJob(task=task, given=given, batch_size=batch_size, checkpointing=checkpointing,
                   strategy=strategy, threads=threads, steps=steps, warmup=warmup, repeats=repeats, calls=list(calls))
    try:
        mp.start_processes(_in_rank, args=(ranks, free_port(), job, barrier, queue), nprocs=ranks, join=True,
                           start_method="spawn")
    except mp.ProcessRaisedException as exc:
        raise RunFailedError(f"measuring the step on {ranks} CPU ranks failed: {exc}") from exc
    got = [queue.get() for _ in range(ranks)]
    figs: list[ComputeFigures] = [g[1] for g in got]
    mid = {k: statistics.median(getattr(f, k) for f in figs)
           for k in ("forward_ms", "backward_ms", "optimizer_ms", "cpu_share")}
    comm = {name: statistics.median(g[2][name] for g in got) for name in got[0][2]}
    return ComputeFigures(device="cpu", threads=threads, batch_size=batch_size, checkpointing=checkpointing,
                          steps=steps, wrapped=figs[0].wrapped, world=figs[0].world, ranks=ranks,
                          collectives_ms=comm, between_collectives=figs[0].between_collectives, **mid)


def rank_sharing(ranks: int, *, threads: int = CPU_RANK_THREADS, n_cores: int | None = None,
                 cpu_share: float | None = None) -> float:
    """How much slower each of ``ranks`` CPU processes of ``threads`` threads computes than the
    one process measured alone, on this machine's cores shared in equal parts by the runnable
    threads (4 one-thread ranks on 2 cores each get half a core). ``cpu_share``: the cores' worth
    of time that process got; below ``threads``, other processes' runnable threads took the rest
    (c / share - 1 of them per thread), and they stay beside the ranks."""
    c = float(n_cores or cores())
    alone = min(1.0, (cpu_share if cpu_share is not None else threads) / threads)
    others = c / alone - threads if alone < 1.0 else 0.0
    shared = min(1.0, c / (ranks * threads + others))
    return max(1.0, alone / shared)


def spare_cores_per_rank(ranks: int, *, threads: int = CPU_RANK_THREADS, n_cores: int | None = None) -> float:
    """Cores left over per CPU rank once every rank's compute threads have one (0..1): where a
    rank's collectives (gloo's own thread) can run beside its compute."""
    free = (n_cores or cores()) - ranks * threads
    return max(0.0, min(1.0, free / max(ranks, 1)))


def why_not_measured(peak_bytes: int, roofline_ms: float | None) -> str:
    """Why a step of this size is not timed here ("" when it is)."""
    if roofline_ms is not None and roofline_ms > MAX_ROOFLINE_STEP_MS:
        return f"the roofline's step is {roofline_ms:.0f} ms (measured only below {MAX_ROOFLINE_STEP_MS:.0f} ms)"
    avail = available_memory_bytes()
    if avail is not None and peak_bytes > MAX_MEMORY_SHARE * avail:
        return (f"its peak of {peak_bytes / 2**30:.2f} GiB is over {MAX_MEMORY_SHARE:.0%} of the "
                f"{avail / 2**30:.2f} GiB available here")
    return ""
