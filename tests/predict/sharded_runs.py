"""Real DDP and FSDP2 training steps on CPU ranks (gloo), measured per rank: peak bytes and step ms.

Used by ``tests/predict/test_sharded.py`` and ``benchmarks/sharded.py``. Each rank runs the fit
loop's own step (:func:`proftune.train.run_step`) on its model wrapped as the strategy wraps it
(``DistributedDataParallel``; or ``fully_shard`` on each block of
:func:`proftune.predict.block_units`, then on the root), with the blocks checkpointed as the
prediction checkpoints them (:func:`proftune.predict.apply_activation_checkpointing`).

The peak is the CPU memory profile's own accounting (``torch.profiler`` allocation events, the
running sum of allocations and frees, as ``Profile.memory.peak_bytes`` on CPU): the window opens
before the model is built, so everything the rank allocates is seen (DDP's gradient buckets,
FSDP's shards), and the peak is read inside the measured step (the second; the first creates
the optimizer state).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import proftune

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


def _rank(rank: int, world: int, port: int, case: dict[str, Any], out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # torchao, which transformers imports, registers Enums with pytree; torch 2.10+ logs each one
    # as deprecated on stderr: a library's note, not the run's
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.profiler import ProfilerActivity, profile

        from proftune.predict import apply_activation_checkpointing, block_units
        from proftune.train import StepSpec, run_step

        task = proftune.load_task(case["task"])
        params = proftune.train.validate_params({**task.default_params, **case.get("params", {})})
        spec = dataclasses.replace(StepSpec.from_params(params), precision="fp32")
        batch = next(iter(task.train_data(case["batch_size"], params)))
        torch.manual_seed(0)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            model = task.build_model(params)
            apply_activation_checkpointing(model, case["checkpointing"])
            if case["strategy"] == "ddp":
                from torch.nn.parallel import DistributedDataParallel

                wrapped: Any = DistributedDataParallel(model)
            else:
                from torch.distributed.fsdp import fully_shard

                for _, unit in block_units(model):
                    fully_shard(unit)
                wrapped = fully_shard(model)
            optimizer = task.configure_optimizer(wrapped, params)
            for i in range(2):
                if i == 1:
                    dist.barrier()
                    with torch.profiler.record_function(_MARK):
                        run_step(task, wrapped, optimizer, [batch], spec, device_type="cpu")
                else:
                    run_step(task, wrapped, optimizer, [batch], spec, device_type="cpu")
        peak = _peak_in_step(prof)
        times = []
        for _ in range(case.get("timed_steps", 3)):
            dist.barrier()
            t0 = time.perf_counter()
            run_step(task, wrapped, optimizer, [batch], spec, device_type="cpu")
            times.append((time.perf_counter() - t0) * 1e3)
        out.put((rank, peak, statistics.median(times)))
    finally:
        dist.destroy_process_group()


def measure(task: str, *, world: int, strategy: str, checkpointing: str = "none", batch_size: int,
            params: dict[str, Any] | None = None, timed_steps: int = 3) -> dict[str, Any]:
    """Per-rank peak bytes (the highest rank's) and step ms (the median over ranks) of a real step."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    case = {"task": task, "strategy": strategy, "checkpointing": checkpointing, "batch_size": batch_size,
            "params": dict(params or {}), "timed_steps": timed_steps}
    mp.start_processes(_rank, args=(world, free_port(), case, queue), nprocs=world, join=True,
                       start_method="spawn")
    results = [queue.get() for _ in range(world)]
    peaks = [p for _, p, _ in results]
    return {"peak_bytes": max(peaks), "peaks": peaks, "step_ms": statistics.median(t for _, _, t in results)}
