"""Bandit allocation on 5 simulated configurations with known mean rewards (accuracy-like,
Gaussian noise): Thompson sampling and UCB beside uniform (round-robin) allocation, the way an
A/B test of training configs is often run.

The pulls are split over ``--processes`` Bandit objects in turn, each opening the same SQLite
store afresh, as separate processes would: the allocation only works if the state carries over.
Passes when >= 80% of the last half of the pulls go to the best configuration.

    python benchmarks/bandit.py [--rounds 200] [--seeds 0 1 2 3 4] [--noise 0.03]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

from proftune.diagnose import Arm, Bandit, regret_curve
from proftune.track import Store

MEANS = (0.90, 0.88, 0.85, 0.80, 0.70)


def run(policy: str, *, rounds: int, seed: int, noise: float, processes: int, db: str) -> tuple[float, float]:
    """Final regret and share of the best arm in the last half, pulls split across processes."""
    arms = [Arm(f"config-{i}", {"mean": m}) for i, m in enumerate(MEANS)]
    truth = {a.name: m for a, m in zip(arms, MEANS, strict=True)}
    rng = random.Random(1000 + seed)
    name = f"sim-{policy}-{seed}"
    per = [rounds // processes + (1 if i < rounds % processes else 0) for i in range(processes)]
    bandit = None
    for i, n in enumerate(per):
        bandit = Bandit(arms, policy=policy, name=name, store=Store(db), seed=seed * 100 + i)
        for _ in range(n):
            arm = bandit.select()
            bandit.update(arm, rng.gauss(truth[arm.name], noise))
    assert bandit is not None, "the state did not carry across processes"
    assert bandit.t == rounds, "the state did not carry across processes"
    regret = regret_curve(bandit.history, truth)
    tail = bandit.history[rounds // 2:]
    share = sum(a == "config-0" for a, _ in tail) / len(tail)
    return regret[-1], share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    print(f"means {MEANS}, noise sd {args.noise}, {args.rounds} pulls split over {args.processes} "
          f"store sessions, seeds {args.seeds}")
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'bandit.db'}"
        results = {p: [run(p, rounds=args.rounds, seed=s, noise=args.noise, processes=args.processes, db=db)
                       for s in args.seeds] for p in ("thompson", "ucb", "uniform")}
    uniform = statistics.median(r for r, _ in results["uniform"])
    print(f"{'policy':>9} {'regret (median)':>16} {'uniform regret':>15} {'ratio':>7} "
          f"{'best share, last half (min..median)':>36}")
    ok = True
    for policy, rs in results.items():
        regret = statistics.median(r for r, _ in rs)
        shares = [s for _, s in rs]
        print(f"{policy:>9} {regret:>16.3f} {uniform:>15.3f} {regret / uniform:>7.3f} "
              f"{min(shares):>25.0%} .. {statistics.median(shares):.0%}")
        if policy != "uniform":
            ok &= min(shares) >= 0.8
    print(f">= 80% of the last half of pulls to the best, every seed, Thompson and UCB: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
