"""The training tests' wall time beside another torch process: torch's default threads vs computed.

One other process trains an MLP at torch's default thread count for as long as the script runs
(the busy machine of a shared runner or a second job); the test files that train run with
``PROFTUNE_THREADS`` set to the machine's cores (torch's default, the anchor) and without it
(proftune's computed count), alternated A B B A so that a drift of the machine's load does not
decide. Printed: each run's seconds, the medians and their ratio.

    python benchmarks/tests_beside_load.py            # ~20 minutes on a 2-core machine
    python benchmarks/tests_beside_load.py --rounds 1 tests/test_train.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

TESTS = ["tests/cli/test_train_cli.py", "tests/diagnose", "tests/recommend", "tests/compress", "tests/test_train.py",
         "tests/integrations/test_emit.py"]

COMPETITOR = """
import time, torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()
"""


def run(tests: list[str], fixed: int | None) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k != "PROFTUNE_THREADS"}
    if fixed is not None:
        env["PROFTUNE_THREADS"] = str(fixed)
    start = time.perf_counter()
    rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode
    return time.perf_counter() - start, rc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tests", nargs="*", default=TESTS)
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs (each round's order reversed from the last)")
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR, "7200"])
    times: dict[str, list[float]] = {"default": [], "computed": []}
    try:
        time.sleep(5)  # the competitor at full speed first
        for r in range(a.rounds):
            for arm in (("default", "computed") if r % 2 == 0 else ("computed", "default")):
                s, rc = run(a.tests, cores if arm == "default" else None)
                times[arm].append(s)
                print(f"round {r + 1}: {arm:8s} {s:7.1f} s (pytest exit {rc})", flush=True)
    finally:
        competitor.terminate()
        competitor.wait()
    d, c = statistics.median(times["default"]), statistics.median(times["computed"])
    print(f"\n| threads | runs (s) | median (s) |\n|---|---|---|\n"
          f"| torch's default ({cores}, PROFTUNE_THREADS={cores}) | {', '.join(f'{t:.0f}' for t in times['default'])}"
          f" | {d:.0f} |\n| proftune computed | {', '.join(f'{t:.0f}' for t in times['computed'])} | {c:.0f} |\n"
          f"ratio computed / default: {c / d:.2f} ({d / c:.2f}x faster)")


if __name__ == "__main__":
    main()
