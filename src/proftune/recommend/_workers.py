"""The data loader's ``num_workers`` measured on training steps, as the thread count is.

Where a task's ``train_data`` is a :class:`torch.utils.data.DataLoader`, the loader is rebuilt
with each candidate count (0, 1, 2, 4, ... up to the cores this process may use), everything else
as the task made it (its dataset, batch sampler, collate function, pinned memory), and a short
fit trains on each at the thread count just chosen. The steps after the first two (the workers'
start and the first batches' warm-up) are timed, in two rounds of alternating order so that a
change of the machine's load does not decide; the count is the smallest within ``tie`` of the
fastest median step (fewer workers leave cores to the training and to others).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from .._threads import candidate_counts, fixed_threads, max_threads
from .._train_params import TrainParams
from ..task import Task, TaskWrapper
from ..train import Callback, FitState, fit
from ._records import Recommendation

__all__ = ["WorkerTimes", "measure_num_workers", "num_workers_row"]

#: Steps each candidate's fit trains and the first ones it leaves out of the time (start, warm-up).
STEPS, SKIP = 12, 2


@dataclass(frozen=True)
class WorkerTimes:
    """The median step and data-wait times (ms) of each candidate count, the task's own count,
    and the one chosen (the smallest within ``tie`` of the fastest)."""

    step_ms: dict[int, float]
    data_ms: dict[int, float]
    task_workers: int
    chosen: int
    steps: int
    rounds: int
    tie: float
    threads: int
    samples: dict[int, list[float]] = field(default_factory=dict)


class _Loader(TaskWrapper):
    """The task with its training loader rebuilt at ``workers``."""

    def __init__(self, inner: Task, workers: int) -> None:
        super().__init__(inner)
        self.workers = workers

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        loader = self.inner.train_data(batch_size, params)
        assert isinstance(loader, DataLoader)
        return rebuilt(loader, self.workers)


def rebuilt(loader: DataLoader, workers: int) -> DataLoader:
    """``loader`` as it is, but with ``workers`` loader processes (no persistent workers)."""
    kw: dict[str, Any] = {
        "num_workers": workers, "collate_fn": loader.collate_fn, "pin_memory": loader.pin_memory,
        "timeout": loader.timeout if workers else 0, "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator}
    if workers:
        kw["prefetch_factor"] = loader.prefetch_factor or 2
        kw["multiprocessing_context"] = loader.multiprocessing_context
    if loader.batch_sampler is not None:
        kw["batch_sampler"] = loader.batch_sampler
    else:
        kw.update(batch_size=None, sampler=loader.sampler)
    return DataLoader(loader.dataset, **kw)


class _StepTimes(Callback):
    def __init__(self) -> None:
        self.step_ms: list[float] = []
        self.data_ms: list[float] = []

    def on_step_end(self, state: FitState) -> None:
        self.step_ms.append(float(state.timing.get("step_ms", 0.0)))
        self.data_ms.append(float(state.timing.get("data_ms", 0.0)))


def measure_num_workers(task: Task, params: TrainParams, batch_size: int, *, threads: int,
                        device: torch.device, seed: int = 0, steps: int = STEPS, rounds: int = 2,
                        tie: float = 0.1, candidates: list[int] | None = None) -> WorkerTimes:
    """Time ``steps`` training steps of ``task`` with its DataLoader at each candidate count
    (``rounds`` rounds, the order reversed each round) at ``threads`` intra-op threads."""
    loader = task.train_data(batch_size, params.params)
    if not isinstance(loader, DataLoader):
        raise TypeError(f"the task's train_data is a {type(loader).__name__}, not a DataLoader")
    counts = candidates if candidates is not None else [0, *candidate_counts(max_threads())]
    times: dict[int, list[float]] = {c: [] for c in counts}
    waits: dict[int, list[float]] = {c: [] for c in counts}
    with fixed_threads(threads):
        for r in range(rounds):
            for count in (counts if r % 2 == 0 else counts[::-1]):
                clock = _StepTimes()
                fit(_Loader(task, count), params, max_steps=steps, batch_size=batch_size, device=device,
                    seed=seed, evaluate=False, callbacks=[clock])
                times[count] += clock.step_ms[SKIP:]
                waits[count] += clock.data_ms[SKIP:]
    step_ms = {c: statistics.median(v) for c, v in times.items() if v}
    data_ms = {c: statistics.median(v) for c, v in waits.items() if v}
    fastest = min(step_ms.values())
    chosen = min(c for c, v in step_ms.items() if v <= fastest * (1 + tie))
    return WorkerTimes(step_ms=step_ms, data_ms=data_ms, task_workers=int(loader.num_workers), chosen=chosen,
                       steps=steps, rounds=rounds, tie=tie, threads=threads, samples=times)


def num_workers_row(task: Task, params: TrainParams, batch_size: int, *, threads: int,
                    device: torch.device, seed: int = 0) -> Recommendation | None:
    """The ``num_workers`` row where the task's loader is a DataLoader (None where it is not:
    batches from memory have no loader workers to set)."""
    loader = task.train_data(batch_size, params.params)
    if not isinstance(loader, DataLoader):
        return None
    if isinstance(loader.dataset, IterableDataset):
        return Recommendation(
            "num_workers", None,
            "not measured: the task's DataLoader reads an IterableDataset, and each loader worker would "
            "yield the whole stream unless the dataset shards itself by torch.utils.data.get_worker_info().",
            {"task_num_workers": int(loader.num_workers)}, "low", "")
    w = measure_num_workers(task, params, batch_size, threads=threads, device=device, seed=seed)
    per = ", ".join(f"{c}: {w.step_ms[c]:.3g} ms (data {w.data_ms.get(c, 0.0):.2g})" for c in sorted(w.step_ms))
    evidence = {"step_ms": {str(c): round(v, 4) for c, v in sorted(w.step_ms.items())},
                "data_ms": {str(c): round(v, 4) for c, v in sorted(w.data_ms.items())},
                "task_num_workers": w.task_workers, "candidates": sorted(w.step_ms), "steps": w.steps,
                "timed_steps": w.steps - SKIP, "rounds": w.rounds, "tie": w.tie, "threads": w.threads,
                "batch_size": batch_size}
    kept = w.chosen == w.task_workers
    base = w.step_ms.get(w.task_workers)
    effect = ("the task's value is the fastest measured" if kept or base is None else
              f"{base / w.step_ms[w.chosen]:.2f}x the steps per second of the task's num_workers={w.task_workers}")
    return Recommendation(
        "num_workers", w.chosen,
        f"measured per training step (median of {w.rounds} x {w.steps - SKIP} steps, {w.threads} thread(s)) "
        f"with the task's DataLoader rebuilt at num_workers {per}; the smallest within {w.tie:.0%} of the "
        f"fastest; the task sets {w.task_workers}" + (" (kept)." if kept else f": DataLoader(num_workers={w.chosen})."),
        evidence, "medium", effect)
