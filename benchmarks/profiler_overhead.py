"""What sampled profiling adds to training, as models get deep: ours vs torch.profiler.

The same user training loop (SGD with momentum, one thread) on the built-in ``digits-cnn``
task's small CNN (batch 64), on MLPs of 10, 100 and 1,000 ``Linear(64, 64) + ReLU`` layers
(batch 16: as many modules per FLOP as a model can have) and on torchvision's ResNet-50 (random
init, 10 classes, batch 4 at 32x32: ~160 modules), run three ways, interleaved so that the
machine's load hits all three alike:

- ``none``: no profiling;
- ``monitor``: ``proftune.Monitor(model, optimizer, every=50)`` (per-layer time, saved
  activations, statistics of weights, activations and gradients; nothing attached between
  samples);
- ``torch.profiler``: ``torch.profiler.profile(record_shapes=True, profile_memory=True)`` with
  its sampled schedule at the same interval (``schedule(wait=48, warmup=1, active=1)``: the
  50th, 100th, ... step recorded, the one before warming up).

Every step's CPU time is measured (this process, so the other load on the machine does not
inflate it). The figure of record is measured inside each run: the CPU time that the steps
around each sample (from three steps before to one after) take beyond the untouched steps near
them, summed and spread over all steps; the same computed on the unprofiled run at the same
positions is the noise floor, taken off. Also shown: the cost of a sampled step in plain steps
(1 + its excess), what the untouched steps lose against the unprofiled run (nothing is attached
to them: ~0, within the run-to-run noise) and the plain end-to-end ratio of the runs' CPU time.
Medians over ``--runs``, with the spread (min..max).

The goal (issue #27): a sampled step costs at most about two plain steps at any depth, so that
``every=50`` adds at most +2%.

    python benchmarks/profiler_overhead.py [--steps 500] [--runs 3] [--every 50]
        [--models digits-cnn,mlp10,mlp100,mlp1000,resnet50]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import proftune

MODELS = ("digits-cnn", "mlp10", "mlp100", "mlp1000", "resnet50")
CONFIGS = ("none", "monitor", "torch.profiler")
#: The steps a sample touches, relative to the sampled step (0): torch.profiler starts in the
#: call that ends step -2's predecessor, warms up on -1, records 0 and stops in 0's step() call;
#: the Monitor attaches at the end of step -1 and detaches in step 0's ``mon.step``.
WINDOW = (-3, -2, -1, 0, 1)
#: Untouched steps on each side of a window that give its local baseline.
AROUND = 8
#: Sampled steps of this cost or less (in plain steps) meet the goal, and this overhead.
GOAL_SAMPLED = 2.0
GOAL_OVERHEAD = 0.02


@dataclass
class Workload:
    """A model, its optimizer and a few fixed batches; ``loss`` runs the forward."""

    name: str
    model: nn.Module
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]
    layers: int = 0
    optimizer: torch.optim.Optimizer = field(init=False)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)


def build(name: str) -> Workload:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if name.startswith("mlp"):
        depth = int(name[3:])
        mods: list[nn.Module] = []
        for _ in range(depth):
            mods += [nn.Linear(64, 64), nn.ReLU()]
        batches = [(torch.randn(16, 64, generator=gen), torch.randn(16, 64, generator=gen)) for _ in range(8)]
        return Workload(f"MLP, {depth} layers", nn.Sequential(*mods), batches,
                        lambda m, b: F.mse_loss(m(b[0]), b[1]), layers=2 * depth)
    if name == "digits-cnn":
        from proftune.task import load_task

        task = load_task("digits-cnn")
        model = task.build_model({})
        batches = []
        for b in task.train_data(64, {}):
            batches.append((b[0], b[1]))
            if len(batches) == 8:
                break
        return Workload("digits-cnn (small CNN)", model, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                        layers=sum(1 for _ in model.modules()))
    if name == "resnet50":
        from torchvision.models import resnet50

        model = resnet50(num_classes=10)
        batches = [(torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 10, (4,), generator=gen))
                   for _ in range(8)]
        return Workload("ResNet-50 (torchvision)", model, batches,
                        lambda m, b: F.cross_entropy(m(b[0]), b[1]), layers=sum(1 for _ in model.modules()))
    raise SystemExit(f"--models: {name!r} is unknown; valid: {', '.join(MODELS)}")


@contextlib.contextmanager
def _profiling(kind: str, w: Workload, every: int) -> Iterator[Callable[[Any], None]]:
    if kind == "none":
        yield lambda loss: None
    elif kind == "monitor":
        with proftune.Monitor(w.model, w.optimizer, every=every) as mon:
            yield mon.step
        assert mon.samples > 0
    else:
        from torch.profiler import ProfilerActivity, profile, schedule

        sched = schedule(wait=every - 2, warmup=1, active=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle"
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                         schedule=sched) as prof:
                yield lambda loss: prof.step()


def run_once(kind: str, w: Workload, steps: int, every: int) -> tuple[list[float], float]:
    """``steps`` training steps under ``kind``: each step's CPU seconds, and the run's wall s."""
    times: list[float] = []
    opt = w.optimizer
    gc.collect()  # what earlier runs left for the collector is not this run's cost
    start = time.perf_counter()
    with _profiling(kind, w, every) as step:
        for i in range(steps):
            c0 = time.process_time()
            loss = w.loss(w.model, w.batches[i % len(w.batches)])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step(loss)
            times.append(time.process_time() - c0)
    return times, time.perf_counter() - start


@dataclass
class RunFigures:
    plain_s: float  # median untouched step
    excess_s: float  # CPU s the windows take beyond their local baselines, summed
    samples: int
    total_s: float  # CPU s of the whole run


def figures(times: list[float], every: int) -> RunFigures:
    """Within one run: the untouched steps' median and the windows' excess over their
    neighbours (see the module docstring)."""
    n = len(times)
    sampled = [i for i in range(n) if (i + 1) % every == 0 and i + WINDOW[-1] < n]
    touched = {i + d for i in sampled for d in WINDOW}
    untouched = [t for i, t in enumerate(times) if i not in touched and i > 0]
    excess = 0.0
    for i in sampled:
        lo, hi = i + WINDOW[0], i + WINDOW[-1]
        near = [times[j] for j in range(lo - AROUND, hi + AROUND + 1)
                if 0 < j < n and j not in touched]
        base = statistics.median(near)
        excess += sum(times[j] - base for j in range(lo, hi + 1))
    return RunFigures(statistics.median(untouched), excess, len(sampled), sum(times))


@dataclass
class Result:
    plain_ms: list[float] = field(default_factory=list)
    overhead: dict[str, list[float]] = field(default_factory=dict)  # within-run, by config
    sampled_x: dict[str, list[float]] = field(default_factory=dict)  # a sampled step, in plain steps
    end_to_end: dict[str, list[float]] = field(default_factory=dict)  # total CPU vs the none run
    untouched: dict[str, list[float]] = field(default_factory=dict)  # untouched steps vs the none run


def measure(w: Workload, steps: int, runs: int, every: int) -> Result:
    for kind in CONFIGS:  # untimed: kernels, allocator, torch.profiler's one-off start-up
        run_once(kind, w, 3 * every, every)
    res = Result()
    for _ in range(runs):
        figs = {kind: figures(run_once(kind, w, steps, every)[0], every) for kind in CONFIGS}
        none = figs["none"]
        res.plain_ms.append(none.plain_s * 1e3)
        for kind in CONFIGS[1:]:
            f = figs[kind]
            floor = none.excess_s / max(none.samples, 1)
            per_sample = f.excess_s / max(f.samples, 1) - floor
            res.overhead.setdefault(kind, []).append(per_sample * f.samples / (steps * none.plain_s))
            res.untouched.setdefault(kind, []).append((f.plain_s - none.plain_s) / none.plain_s)
            res.sampled_x.setdefault(kind, []).append(1 + per_sample / none.plain_s)
            res.end_to_end.setdefault(kind, []).append(f.total_s / none.total_s - 1)
    return res


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _spread(xs: list[float], fmt: str) -> str:
    return f"{format(min(xs), fmt)}..{format(max(xs), fmt)}" if len(xs) > 1 else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=500, help="training steps per run (>= 10 samples at --every)")
    ap.add_argument("--runs", type=int, default=3, help="runs per configuration (median taken)")
    ap.add_argument("--every", type=int, default=50, help="sample every N-th step")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    args = ap.parse_args()
    if args.every < 4 or args.steps < 2 * args.every:
        ap.error(f"need --every >= 4 and --steps >= 2 * --every, but got {args.every=} {args.steps=}")
    torch.set_num_threads(1)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    print(f"torch {torch.__version__}, proftune {proftune.__version__}, cpu, 1 thread, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; {args.steps} steps/run, {args.runs} runs, every={args.every}",
          flush=True)
    head = (f"{'model':<26}{'plain step':>11}  {'Monitor: sampled step':>22}{'overhead':>10}"
            f"  {'torch.profiler: sampled':>24}{'overhead':>10}  {'ratio':>7}")
    print(f"\nCPU time per step; overhead = what every={args.every} adds to a long run "
          "(median of runs, spread below); ratio = torch.profiler's overhead / ours")
    print(head)
    print("-" * len(head), flush=True)
    results: dict[str, tuple[Workload, Result]] = {}
    ok = True
    for name in names:
        w = build(name)
        t0 = time.perf_counter()
        r = measure(w, args.steps, args.runs, args.every)
        results[name] = (w, r)
        ours, theirs = _med(r.overhead["monitor"]), _med(r.overhead["torch.profiler"])
        ratio = f"{theirs / ours:.1f}x" if ours > 0 else "n/a"
        print(f"{w.name:<26}{_med(r.plain_ms):>9.2f}ms  {_med(r.sampled_x['monitor']):>20.2f}x "
              f"{ours:>+9.2%}  {_med(r.sampled_x['torch.profiler']):>22.2f}x {theirs:>+9.2%}  {ratio:>7}")
        print(f"{'  spread':<26}{_spread(r.plain_ms, '.2f'):>11}  {_spread(r.sampled_x['monitor'], '.2f'):>21} "
              f"{_spread(r.overhead['monitor'], '+.1%'):>9}  {_spread(r.sampled_x['torch.profiler'], '.2f'):>23} "
              f"{_spread(r.overhead['torch.profiler'], '+.1%'):>9}")
        for label, got in (("  untouched steps", r.untouched), ("  end to end (total CPU)", r.end_to_end)):
            print(f"{label:<26}{'':>11}  {'':>21} {_med(got['monitor']):>+9.1%}  "
                  f"{'':>23} {_med(got['torch.profiler']):>+9.1%}")
        print(f"{'  (measured in)':<26}{time.perf_counter() - t0:>10.0f}s", flush=True)
        ok &= _med(r.sampled_x["monitor"]) <= GOAL_SAMPLED and ours <= GOAL_OVERHEAD
    worst = max(_med(r.overhead["monitor"]) for _, r in results.values())
    print(f"\ncheck: a Monitor(every={args.every}) sampled step <= {GOAL_SAMPLED:.0f} plain steps and overhead "
          f"<= {GOAL_OVERHEAD:+.0%} on every model (worst {worst:+.2%}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
