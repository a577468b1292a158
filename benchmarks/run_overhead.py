"""What `proftune run` adds to an unmodified training script, beside `python -m torch.utils.bottleneck`.

One user script (an MLP of 8 ``Linear(256, 256) + ReLU`` layers, SGD, batch 64, one thread, data
made in the script) times its own training loop with ``time.process_time`` (this process's CPU
time, so other load on the machine does not inflate it) and prints it. It is run three ways,
interleaved, ``--runs`` times each:

- ``plain``: ``python script.py``;
- ``proftune run``: ``proftune run --every 50 -- python script.py`` (the default ``--every``);
- the anchor, ``python -m torch.utils.bottleneck script.py``, which runs the script once under
  cProfile and once under the autograd profiler. ``torch.utils.bottleneck`` is gone from the
  installed torch (2.14 has no such module), so its two passes are run as it ran them:
  ``bottleneck/cProfile`` (``python -m cProfile``) and ``bottleneck/autograd``
  (``runpy`` under ``torch.autograd.profiler.profile()``); when the module exists it is run too.

The figure of record is the median loop time of each, its spread (min..max) and the ratio to the
plain run; the goal for `proftune run` is at most +2%. What each gives beside its cost is printed
too: `proftune run` per-layer time, MACs, memory, statistics and recommendations; bottleneck a
whole-script cProfile and an autograd operator table (no per-layer view, no advice).

    python benchmarks/run_overhead.py [--steps 1500] [--runs 3]
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
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=900, check=False)
    found = re.findall(r"LOOP_S ([0-9.]+)", proc.stdout + proc.stderr)
    if not found:
        raise RuntimeError(f"{cmd[:4]} printed no loop time (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return float(found[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        steps = str(args.steps)
        ways = {
            "plain": [sys.executable, str(script), steps],
            "proftune run": [sys.executable, "-m", "proftune.cli", "run", "--every", "50", "--db",
                             f"sqlite:///{tmp}/p.db", "--", "python", str(script), steps],
            "bottleneck/cProfile": [sys.executable, "-m", "cProfile", "-o", f"{tmp}/c.prof", str(script), steps],
            "bottleneck/autograd": [sys.executable, "-c", AUTOGRAD, str(script), steps],
        }
        if importlib.util.find_spec("torch.utils.bottleneck") is not None:
            ways["bottleneck"] = [sys.executable, "-m", "torch.utils.bottleneck", str(script), steps]
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(args.runs):
            for name, cmd in ways.items():  # interleaved: the machine's load hits all alike
                times[name].append(_loop_s(cmd, tmp))
                print(f"  run {len(times[name])}: {name} {times[name][-1]:.3f} s", file=sys.stderr, flush=True)
    base = statistics.median(times["plain"])
    print(f"training loop CPU time, {args.steps} steps, median of {args.runs} runs (min..max):")
    for name, ts in times.items():
        med = statistics.median(ts)
        paired = sorted(t / p for t, p in zip(ts, times["plain"], strict=True))  # same round: same load
        print(f"  {name:20s} {med:8.3f} s  ({min(ts):.3f}..{max(ts):.3f})  ratio {med / base:.3f} "
              f"({(med / base - 1) * 100:+.1f}%)  paired ratio median {statistics.median(paired):.3f} "
              f"({paired[0]:.3f}..{paired[-1]:.3f})")
    print("gives: proftune run: per-layer time, MACs, memory, statistics, the step's phases and "
          "recommendations, a Run in the store; bottleneck: whole-script cProfile + autograd "
          "operator table, no per-layer view, no advice.")


if __name__ == "__main__":
    main()
