"""Real DDP and FSDP2 training steps on CPU ranks (gloo), measured per rank: peak bytes and step ms.

Used by ``tests/predict/test_sharded.py`` and ``benchmarks/sharded.py``. Each rank runs the fit
loop's own step (:func:`proftune.train.run_step`, with the task's ``grad_accumulation``
micro-batches) on its model wrapped as the strategy wraps it (``DistributedDataParallel``; or
``fully_shard`` on each block of :func:`proftune.predict.block_units`, then on the root), with
the blocks checkpointed as the prediction checkpoints them
(:func:`proftune.predict.apply_activation_checkpointing`).

The peak is PyTorch's own trackers' figure, as its tests of them measure one: FSDP2 under
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` (sharded and unsharded parameters
and gradients, all-gather and reduce-scatter buffers, activations, optimizer state), DDP under
``mem_tracker.MemTracker`` with the model and the optimizer tracked (the Reducer's flat gradient
buckets are made again in each backward: the tracker counts them there, as ``Temp``); one step
after two warm-up steps (the first creates the optimizer state, the second's
start is where DDP rebuilds its buckets in the order the gradients came). Beside it
(``profiler=True``), the CPU memory profile's running sum of allocations within that step: under
DDP it now and then holds one more gradient-sized tensor than the tracker (its events are those
of the threads it profiles; gloo's own threads complete the all-reduces), so it is a cross-check.
After the timed steps the ranks sweep their collectives (:func:`proftune.predict.sweep_collectives`):
the link measured on the ranks at hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import proftune
from proftune.train import StepPhases, TimedPhases

_MARK = "proftune_measured_step"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_in_step(prof: Any) -> int:
    """The highest running sum of CPU allocations while the marked step ran."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int]] = []
    window = (0, 0)
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, int(node.extra_fields.alloc_size)))
        elif node.name == _MARK:
            window = (node.start_time_ns, node.end_time_ns)
    events.sort()
    run = peak = 0
    for t, size in events:
        run += size
        if window[0] <= t <= window[1]:
            peak = max(peak, run)
    return peak


def _wrap(model: torch.nn.Module, strategy: str) -> Any:
    from proftune.predict import block_units

    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for _, unit in block_units(model):
        fully_shard(unit, reshard_after_forward=strategy != "fsdp-no-reshard")
    return fully_shard(model)


class _ResetEachForward(StepPhases):
    """Clears the tracker's per-module statistics before each micro-batch's forward: its peak
    stays, and a second forward of the root in one step (accumulation) is no longer refused."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker

    def forward(self) -> contextlib.AbstractContextManager[Any]:
        self.tracker.reset_mod_stats()
        return contextlib.nullcontext()


class _Phases(TimedPhases):
    """Milliseconds of each phase of one step on this rank (the collectives it waits on inside)."""

    def __init__(self) -> None:
        self.ms = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.ms[phase] += (time.perf_counter() - t0) * 1e3


def _tracked_peak(wrapped: Any, optimizer: Any, step: Any, strategy: str) -> tuple[int, dict[str, int]]:
    """The tracker's peak of one step on this rank's CPU, and its bytes by kind then."""
    if strategy == "ddp":
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker: Any = MemTracker()
        tracker.track_external(wrapped, optimizer)
    else:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = FSDPMemTracker(wrapped, optimizer)
    with tracker:
        step(_ResetEachForward(tracker))
    snap = tracker.get_tracker_snapshot("peak")
    cpu = next((v for k, v in snap.items() if torch.device(k).type == "cpu"), {})
    total = int(cpu.get("Total", 0))
    return total, {str(k): int(v) for k, v in cpu.items() if k != "Total" and v}


def _rank(rank: int, world: int, port: int, case: dict[str, Any], out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # torchao, which transformers imports, registers Enums with pytree; torch 2.10+ logs each one
    # as deprecated on stderr: a library's note, not the run's
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.profiler import ProfilerActivity, profile

        from proftune.predict import apply_activation_checkpointing, sweep_collectives
        from proftune.train import StepSpec, run_step

        task = proftune.load_task(case["task"])
        params = proftune.train.validate_params({**task.default_params, **case.get("params", {})})
        spec = dataclasses.replace(StepSpec.from_params(params), precision="fp32")
        batch = next(iter(task.train_data(case["batch_size"], params)))
        micro = [batch] * spec.grad_accumulation

        def step(phases: StepPhases | None = None) -> None:
            run_step(task, wrapped, optimizer, micro, spec, device_type="cpu", phases=phases)

        torch.manual_seed(0)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                     record_shapes=False) if case.get("profiler") else contextlib.nullcontext() as prof:
            model = task.build_model(params)
            apply_activation_checkpointing(model, case["checkpointing"])
            wrapped = _wrap(model, case["strategy"])
            optimizer = task.configure_optimizer(wrapped, params)
            # the first step creates the optimizer state; DDP rebuilds its buckets in the order the
            # gradients came at the second step's start (new flat buckets, the old ones freed)
            step()
            step()
            if prof is not None:
                dist.barrier()
                with torch.profiler.record_function(_MARK):
                    step()
        profiled = _peak_in_step(prof) if prof is not None else None
        dist.barrier()
        peak, kinds = _tracked_peak(wrapped, optimizer, step, case["strategy"])
        times = []
        phase_ms: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
        for _ in range(case.get("timed_steps", 3)):
            timer = _Phases()
            dist.barrier()
            t0 = time.perf_counter()
            step(timer)
            times.append((time.perf_counter() - t0) * 1e3)
            for k, v in timer.ms.items():
                phase_ms[k].append(v)
        link = sweep_collectives() if case.get("link") else None
        phases = {k: statistics.median(v) for k, v in phase_ms.items()}
        out.put((rank, peak, statistics.median(times), kinds, profiled, link, phases))
    finally:
        dist.destroy_process_group()


def measure(task: str, *, world: int, strategy: str, checkpointing: str = "none", batch_size: int,
            params: dict[str, Any] | None = None, timed_steps: int = 3, profiler: bool = False,
            link: bool = False) -> dict[str, Any]:
    """Per-rank peak bytes (the highest rank's, the tracker's; its bytes by kind), step ms (the
    median over ranks), with ``profiler`` the profiler's peak too, with ``link`` the ranks'
    collectives measured after the steps (rank 0's sweep); ``phases``: each phase's ms in the
    timed steps (the median rank's median; the collectives each phase waits on inside it)."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    case = {"task": task, "strategy": strategy, "checkpointing": checkpointing, "batch_size": batch_size,
            "params": dict(params or {}), "timed_steps": timed_steps, "profiler": profiler, "link": link}
    mp.start_processes(_rank, args=(world, free_port(), case, queue), nprocs=world, join=True,
                       start_method="spawn")
    results = sorted((queue.get() for _ in range(world)), key=lambda r: r[0])
    peaks = [r[1] for r in results]
    top = max(results, key=lambda r: r[1])
    profiled = [r[4] for r in results if r[4] is not None]
    return {"peak_bytes": max(peaks), "peaks": peaks, "kinds": top[3],
            "step_ms": statistics.median(r[2] for r in results),
            "profiler_peak_bytes": max(profiled) if profiled else None,
            "link": results[0][5],
            "phases": {k: statistics.median(r[6][k] for r in results) for k in results[0][6]}}
