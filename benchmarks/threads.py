"""The CPU thread count proftune computes, beside each fixed count, on a quiet and on a busy machine.

For three models (digits-cnn, a wide MLP on digits, a small transformer on digits' rows as
tokens) the script times ``proftune.fit`` (``--steps`` steps or ``--cap-s`` seconds, whichever
comes first, no evaluation) at each fixed thread count (1, 2, ... up to the cores of this
process) and at proftune's default (computed, with no choice remembered from an earlier fit: its
measurement steps at the other counts are in its time), in turns, ``--repeats`` times, and
prints the median of each fit's mean ms/step (every step of a fit, its first included), the
median of the rounds' ratios proftune / best fixed count (paired: fits seconds apart, so the
machine's load drifting over a case cancels out) and the share of proftune's time that its
steps at the counts it did not keep cost beyond the kept count's median step. A fixed
count 3x slower than the best in the first round runs its later rounds for ``--slow-cap-s``
only. Each case runs beside competitors that the script starts and stops itself: none
("quiet": the machine's other jobs still run, see the load column), 1, 2 and 4 other torch
processes training at torch's default threads, and 1, 2 and 4 plain Python busy loops; each
competitor ends by itself after ``--case-s`` seconds at most.

The anchor is torch's own behaviour: a fixed count (torch's default is one thread per core). The
goal: proftune within 10% of the best fixed count, never more than 1.2x slower.

    PYTHONPATH=src python benchmarks/threads.py            # all cases (13 minutes on 2 cores at load 10-16)
    PYTHONPATH=src python benchmarks/threads.py --quick    # quiet and one torch competitor
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from _paired import median_interval
from torch import nn

import proftune
from proftune import _threads
from proftune.train import Callback, FitState, fit

TORCH_COMPETITOR = """
import sys, time, torch
end = time.time() + float(sys.argv[1])
m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
o = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(128, 512)
while time.time() < end:
    o.zero_grad(); m(x).square().mean().backward(); o.step()
"""
BUSY_COMPETITOR = """
import sys, time
end = time.time() + float(sys.argv[1])
while time.time() < end:
    pass
"""


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)


class _DigitsTask(proftune.Task):
    """Digits with a model of the subclass's; batches of (x, y)."""

    default_params: ClassVar[dict[str, Any]] = {"batch_size": 64, "lr": 1e-3}

    def __init__(self) -> None:
        self.x, self.y = _digits()

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterator[Any]:
        g = torch.Generator().manual_seed(0)
        order = torch.randperm(len(self.x), generator=g)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[i:i + batch_size]
            yield self.shape(self.x[idx]), self.y[idx]

    def val_data(self, batch_size: int) -> Iterator[Any]:
        yield self.shape(self.x[:256]), self.y[:256]

    def shape(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)


class WideMLP(_DigitsTask):
    name = "wide-mlp"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 64)
        layer = nn.TransformerEncoderLayer(64, nhead=4, dim_feedforward=128, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


class SmallTransformer(_DigitsTask):
    """Each 8x8 digit as 8 tokens of 8 pixels."""

    name = "small-transformer"

    def shape(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(-1, 8, 8)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _Encoder()


class _Steps(Callback):
    """The step times of a fit (ms) and the thread count each began at; stops the fit after
    ``cap_s`` seconds (a fixed count that waits on busy cores would take minutes)."""

    def __init__(self, cap_s: float) -> None:
        self.cap_s, self.started = cap_s, 0.0
        self.ms: list[tuple[int, float]] = []
        self._threads = 1

    def on_fit_start(self, state: FitState) -> None:
        self.started = time.perf_counter()

    def on_step_start(self, state: FitState) -> None:
        self._threads = torch.get_num_threads()

    def on_step_end(self, state: FitState) -> None:
        self.ms.append((self._threads, state.timing["step_ms"]))
        if time.perf_counter() - self.started > self.cap_s:
            state.request_stop("time cap")


def _ms_per_step(task: Any, threads: int | None, steps: int, cap_s: float) -> tuple[float, float, Any]:
    """Mean ms over every step of one fit (its first and, for proftune's default, its
    measurements at the other counts included), stopped after ``steps`` steps or ``cap_s``; and
    the share of the fit's time its steps at other counts than the one it ended at took beyond
    that count's median step (proftune's cost of measuring; 0 for a fixed count)."""
    _threads.forget()  # every proftune run pays for its own first measurement
    steps_cb = _Steps(cap_s)
    r = fit(task, max_steps=steps, evaluate=False, threads=threads, device="cpu", callbacks=[steps_cb])
    ms = [m for _, m in steps_cb.ms]
    end = r.threads.threads if r.threads is not None else threads
    at_end = [m for k, m in steps_cb.ms if k == end] or ms
    cost = sum(max(0.0, m - statistics.median(at_end)) for k, m in steps_cb.ms if k != end) / sum(ms)
    return statistics.fmean(ms), cost, r.threads


def _start(kind: str, n: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    code = TORCH_COMPETITOR if kind == "torch" else BUSY_COMPETITOR
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", _threads.MAX_THREADS_ENV)}
    return [subprocess.Popen([sys.executable, "-c", code, str(seconds)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def _uptime() -> str:
    one, five, _fifteen = os.getloadavg()
    return f"load {one:.2f} (1 min) {five:.2f} (5 min)"


def _case(task: Any, fixed: list[int], args: argparse.Namespace) -> tuple[dict[Any, list[float]], list[str], float]:
    """Each fit's ms/step at each fixed count and at proftune's default (key None), round by
    round, in every order in turn; proftune's choice per round (``1`` or ``1>2``: the counts its checks chose)
    and the median share of its time its measurements cost. A fixed count more than 3x slower
    than the best in the first round runs its later rounds for at most ``--slow-cap-s`` (it is
    not the best either way)."""
    fit(task, max_steps=3, evaluate=False, threads=1, device="cpu")  # warm-up: imports, allocator
    times: dict[Any, list[float]] = {k: [] for k in [*fixed, None]}
    chosen: list[str] = []
    costs: list[float] = []
    # every order of the fits in turn (a seeded shuffle for many counts): each follows each other
    # as often, so what a fit leaves behind (a slow count's spinning threads, a switch) is shared alike
    order: list[Any] = [*fixed, None]
    turns = list(itertools.permutations(order)) if len(order) <= 4 else [
        random.Random(rep).sample(order, len(order)) for rep in range(args.repeats)]
    for rep in range(args.repeats):
        turn = turns[rep % len(turns)]
        for k in turn:
            cap = args.cap_s
            if rep and k is not None and times[k][0] > 3 * min(times[j][0] for j in fixed):
                cap = args.slow_cap_s
            ms, cost, choice = _ms_per_step(task, k, args.steps, cap)
            times[k].append(ms)
            if k is None and choice is not None:
                costs.append(cost)
                chosen.append(">".join(str(c.chosen) for c in choice.checks) or str(choice.threads))
    return times, chosen, statistics.median(costs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="steps of each timed fit")
    ap.add_argument("--cap-s", type=float, default=1.0, help="longest timed fit, seconds")
    ap.add_argument("--slow-cap-s", type=float, default=0.5,
                    help="longest later fit of a fixed count 3x slower than the best in the first round")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--case-s", type=float, default=180.0, help="longest life of a competitor, seconds")
    ap.add_argument("--quick", action="store_true", help="only the quiet case and one torch competitor")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped script stops its competitors

    cores = _threads.max_threads()
    fixed = _threads.candidate_counts(cores)
    tasks = [proftune.load_task("digits-cnn"), WideMLP(), SmallTransformer()]
    cases = [("quiet", "none", 0), ("1 torch", "torch", 1), ("2 torch", "torch", 2), ("4 torch", "torch", 4),
             ("1 busy", "busy", 1), ("2 busy", "busy", 2), ("4 busy", "busy", 4)]
    if args.quick:
        cases = cases[:2]
    started = time.perf_counter()
    print(f"cores of this process: {cores}; fixed counts {fixed}; fits of {args.steps} steps (at most "
          f"{args.cap_s:g} s), in turns, median of {args.repeats} rounds; ms/step: the mean of every step of a "
          f"fit (its first, and proftune's measurements at the other counts, included); ratio: the median "
          f"of each round's proftune / best fixed count; measuring: the share of proftune's time its steps "
          f"at the counts it did not keep took beyond the kept one's median step. 'quiet': no competitor "
          f"started by this script; the machine's other jobs run all the same (the load column).", flush=True)
    header = ("| case | load before | model | proftune (choice) | "
              + " | ".join(f"{k} thread{'s' if k > 1 else ''}" for k in fixed)
              + " | best fixed | ratio (paired) [95% interval] | proftune's measuring |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    ratios: list[float] = []
    within: list[bool] = []
    for case, kind, n in cases:
        procs = _start(kind, n, args.case_s) if n else []
        try:
            time.sleep(1.0 if n else 0.0)  # the competitors' start-up (imports) is not their load
            for task in tasks:
                load = _uptime()
                times, chosen, cost = _case(task, fixed, args)
                med = {k: statistics.median(v) for k, v in times.items()}
                best_k = min(fixed, key=lambda k: med[k])
                # paired: each round's proftune fit against the same round's fit at the best count
                # (fits seconds apart), so the machine's load drifting over the case cancels out
                paired = [a / b for a, b in zip(times[None], times[best_k], strict=True)]
                ratio = statistics.median(paired)
                low, high = median_interval(paired)
                ratios.append(ratio)
                within.append(low <= 1.10)
                rows.append(f"| {case} | {load} | {task.name} | {med[None]:.2f} ({'/'.join(chosen)}) | "
                            + " | ".join(f"{med[k]:.2f}" for k in fixed)
                            + f" | {best_k}: {med[best_k]:.2f} | {ratio:.2f} [{low:.2f}, {high:.2f}] | {cost:.1%} |")
                print(rows[-1], flush=True)
        finally:
            _stop(procs)
    print()
    print("\n".join(rows))
    print(f"\nratio proftune / best fixed: median {statistics.median(ratios):.2f}, worst {max(ratios):.2f} "
          f"(goal: within 1.10, never above 1.20); {sum(r <= 1.10 for r in ratios)} of {len(ratios)} cases at "
          f"or below 1.10, {sum(within)} with 1.10 inside or above their interval's low end; "
          f"{time.perf_counter() - started:.0f} s; after: {_uptime()}")


if __name__ == "__main__":
    main()
