"""Largest batch size under a memory budget: our memory model vs exhaustive search vs binsearch.

For digits-cnn and digits-transformer under two budgets each (chosen so that the answer lands
in the hundreds and in the thousands), on the device given (CPU here: the budget is compared
with the profiler's measured peak of one training step, the same definition as on CUDA):

- truth: exhaustive upward scan of B with the same peak measurement; the first B whose peak
  exceeds the budget bounds the answer (stride 64, then 8, then 1 inside the bracket; --full
  steps every B by 1 from the last fitting stride);
- ours: ``proftune.find_batch_size`` (<= 3 probes + 1 verifying step), fresh measurements;
- binsearch: PyTorch Lightning's ``binsearch`` strategy (init 2, double until it fails, then
  bisect), reimplemented step for step, on the same measurement: the runs it needs.

Peaks are cached per batch size after ours has measured, so all three read the same number
for the same B (the CPU peak jitters by ~0.5% between runs). Usage:
    python benchmarks/batch_size.py [--device cpu] [--full]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable

import proftune
from proftune.profile import peak_step_memory
from proftune.recommend import find_batch_size, format_bytes, parse_memory
from proftune.recommend._full_batches import FullBatchTask

CASES = {
    "digits-cnn": ["20MB", "50MB"],
    "digits-transformer": ["12MB", "30MB"],
}


class Peaks:
    """peak(B) on full batches, cached; counts fresh measurements."""

    def __init__(self, task: str, device: str) -> None:
        self.task = FullBatchTask(proftune.load_task(task))
        self.device = device
        self.cache: dict[int, int] = {}

    def measure(self, batch: int) -> int:
        if batch not in self.cache:
            self.cache[batch] = int(peak_step_memory(self.task, None, batch_size=batch, device=self.device))
        return self.cache[batch]


def counted(fn: Callable[[int], int]) -> tuple[Callable[[int], int], list[int]]:
    calls: list[int] = []

    def wrapped(batch: int) -> int:
        calls.append(batch)
        return fn(batch)

    return wrapped, calls


def exhaustive(peak: Callable[[int], int], budget: int, *, full: bool) -> tuple[int, int]:
    """(largest B whose peak fits, runs): scan up with shrinking strides inside the bracket."""
    runs = 0
    last_fit = 0
    strides = (64, 1) if full else (64, 8, 1)
    for stride in strides:
        b = last_fit + stride
        while True:
            runs += 1
            if peak(b) > budget:
                break
            last_fit = b
            b += stride
    return last_fit, runs


def lightning_binsearch(peak: Callable[[int], int], budget: int, init: int = 2,
                        max_trials: int = 25) -> tuple[int, int]:
    """Lightning's _run_binary_scaling: double until a failure, then bisect; (answer, runs)."""
    low, high, count, new, runs = 1, None, 0, init, 0
    while True:
        runs += 1
        if peak(new) <= budget:
            count += 1
            if count > max_trials:
                break
            low = new
            if high:
                if high - low <= 1:
                    break
                new = (high + low) // 2
            else:
                new *= 2
        else:
            high = new
            new = (high + low) // 2
            if high - low <= 1:
                break
    return new, runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--full", action="store_true", help="step every B by 1 in the last stride")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    import torch

    print(f"device={args.device} torch={torch.__version__} threads={torch.get_num_threads()} "
          f"cpus={os.cpu_count()}")
    header = (f"{'task':<20}{'budget':>8}{'truth':>7}{'runs':>6}{'ours':>7}{'runs':>6}{'ours/truth':>11}"
              f"{'fits':>6}{'binsearch':>10}{'runs':>6}{'ours s':>8}")
    print(header)
    ok = True
    for task, budgets in CASES.items():
        peaks = Peaks(task, args.device)
        for budget_text in budgets:
            budget = parse_memory(budget_text)
            start = time.perf_counter()
            fresh, our_calls = counted(lambda b, p=peaks: p.measure(b))
            ours = find_batch_size(task, memory_budget=budget, device=args.device, measure=fresh)
            ours_s = time.perf_counter() - start
            truth, truth_runs = exhaustive(peaks.measure, budget, full=args.full)
            bins, bins_runs = lightning_binsearch(peaks.measure, budget)
            answer = ours.memory_max_batch_size or ours.max_batch_size
            fits = ours.measured_peak_bytes is not None and ours.measured_peak_bytes <= budget
            ratio = answer / truth if truth else float("nan")
            good = fits and ratio >= 0.9 and answer <= truth and len(our_calls) <= 4
            ok &= good
            print(f"{task:<20}{budget_text:>8}{truth:>7}{truth_runs:>6}{answer:>7}{len(our_calls):>6}"
                  f"{ratio:>11.3f}{'yes' if fits else 'NO':>6}{bins:>10}{bins_runs:>6}{ours_s:>8.1f}"
                  f"  {'ok' if good else 'FAIL'}")
            print(f"{'':<20}model: {format_bytes(ours.model.intercept_bytes)} + "
                  f"{format_bytes(ours.model.per_sample_bytes)}/sample, margin "
                  f"{format_bytes(ours.model.margin_bytes)}; predicted "
                  f"{format_bytes(ours.model.predict(answer))}, measured "
                  f"{format_bytes(ours.measured_peak_bytes)}; probes {our_calls}")
    print("all cases: ours fits, >= 90% of the exhaustive answer, <= 4 runs:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
