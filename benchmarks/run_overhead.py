"""What `proftune run` adds to an unmodified training script, beside `python -m torch.utils.bottleneck`.

One user script (an MLP of 8 ``Linear(256, 256) + ReLU`` layers, SGD, batch 64, one thread, data
made in the script) times its own training loop with ``time.process_time`` (this process's CPU
time, so other load on the machine does not inflate it) and prints it. It is run three ways,
interleaved, ``--runs`` times each:

- ``plain``: ``python script.py``;
- ``proftune run``: ``proftune run -- python script.py`` (the default ``--every``: every 50th
  step, further apart where a sampled step costs more than 1.5% of the training's time);
- the anchor, ``python -m torch.utils.bottleneck script.py``, which runs the script once under
  cProfile and once under the autograd profiler. ``torch.utils.bottleneck`` is gone from the
  installed torch (2.14 has no such module), so its two passes are run as it ran them:
  ``bottleneck/cProfile`` (``python -m cProfile``) and ``bottleneck/autograd``
  (``runpy`` under ``torch.autograd.profiler.profile()``); when the module exists it is run too.

The figure of record per way: the median over rounds of the round's ratio to the plain run of
the same round (paired: the machine's load drifting over the benchmark cancels out; the ways run
in a rotated order each round, so none always follows another), with a bootstrap 95% interval of
that median; the loop's CPU time includes its first steps (where `proftune run` finds the
training step and counts the model's MACs once). The goal for `proftune run` is at most +2%.
What each gives beside its cost is printed too: `proftune run` per-layer time, MACs, memory,
statistics and recommendations; bottleneck a whole-script cProfile and an autograd operator
table (no per-layer view, no advice).

    python benchmarks/run_overhead.py [--steps 1500] [--runs 9] [--anchor-runs 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _paired import median_interval

SCRIPT = '''
import sys, time, torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[1])
layers = []
for _ in range(8):
    layers += [nn.Linear(256, 256), nn.ReLU()]
model = nn.Sequential(*layers, nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
t0 = time.process_time()
for _ in range(steps):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"LOOP_S {time.process_time() - t0:.6f}", flush=True)
'''


AUTOGRAD = '''
import runpy, sys, torch
sys.argv = sys.argv[1:]
with torch.autograd.profiler.profile() as prof:
    runpy.run_path(sys.argv[0], run_name="__main__")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5))
'''


def _loop_s(cmd: list[str], cwd: str) -> float:
    """The training loop's CPU seconds in one run of the script."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=900, check=False)
    out = proc.stdout + proc.stderr
    found = re.findall(r"LOOP_S ([0-9.]+)", out)
    if not found:
        raise RuntimeError(f"{cmd[:4]} printed no loop time (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return float(found[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--runs", type=int, default=9, help="rounds of plain and proftune run")
    ap.add_argument("--anchor-runs", type=int, default=3, help="of them, rounds that run the anchor too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        steps = str(args.steps)
        ways = {
            "plain": [sys.executable, str(script), steps],
            "proftune run": [sys.executable, "-m", "proftune.cli", "run", "--db",
                             f"sqlite:///{tmp}/p.db", "--", "python", str(script), steps],
            "bottleneck/cProfile": [sys.executable, "-m", "cProfile", "-o", f"{tmp}/c.prof", str(script), steps],
            "bottleneck/autograd": [sys.executable, "-c", AUTOGRAD, str(script), steps],
        }
        if importlib.util.find_spec("torch.utils.bottleneck") is not None:
            ways["bottleneck"] = [sys.executable, "-m", "torch.utils.bottleneck", str(script), steps]
        loop: dict[str, list[float]] = {k: [] for k in ways}
        paired: dict[str, list[float]] = {k: [] for k in ways}
        names = list(ways)
        for rnd in range(args.runs):
            turn = [n for n in names if rnd < args.anchor_runs or n in ("plain", "proftune run")]
            turn = turn[rnd % len(turn):] + turn[:rnd % len(turn)]  # rotated: none always follows another
            got = {}
            for name in turn:
                got[name] = _loop_s(ways[name], tmp)
                print(f"  round {rnd + 1}: {name} {got[name]:.3f} s", file=sys.stderr, flush=True)
            for name, seconds in got.items():
                loop[name].append(seconds)
                paired[name].append(seconds / got["plain"])
    print(f"training loop CPU time, {args.steps} steps; the median over rounds of each round's ratio to the "
          f"plain run [bootstrap 95% interval]:")
    for name in [n for n in names if loop[n]]:  # an anchor with --anchor-runs 0 ran no round
        low, high = median_interval(paired[name])
        print(f"  {name:20s} {len(loop[name])} rounds: {statistics.median(loop[name]):.3f} s, ratio "
              f"{statistics.median(paired[name]):.3f} [{low:.3f}, {high:.3f}]")
    med = statistics.median(paired["proftune run"])
    print(f"proftune run: {(med - 1) * 100:+.1f}% (goal: at most +2%)")
    print("gives: proftune run: per-layer time, MACs, memory, statistics, the step's phases and "
          "recommendations, a Run in the store; bottleneck: whole-script cProfile + autograd "
          "operator table, no per-layer view, no advice.")


if __name__ == "__main__":
    main()
