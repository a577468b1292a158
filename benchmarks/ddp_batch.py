"""DDP batch size from communication against compute: throughput at the current per-rank batch
(the anchor) beside the batch ``recommend``'s ``ddp_batch_size`` row gives, predicted and measured.

Task digits-mlp with hidden=1024 (1.1M parameters: 4.3 MiB of gradients all-reduced per step) at
32 samples per rank, 2 ranks on this machine (gloo, one thread each). Steps:
1. as the row does (``measure_and_plan``): the DDP step at 32, 64 and 128 per rank, the line
   step = fixed + per_sample·B and the all-reduce time, the plan for an all-reduce share of at
   most 10% within the data, and, where the plan lies past twice 128, a measurement there and
   the plan again from all the points; then the cap by the critical batch
   (``proftune.noise_scale`` at the task's lr; printed beside the uncapped plan);
2. measured: a fresh set of ranks profiles the DDP step at 32 and at the recommended batch
   (``--rounds`` interleaved rounds, each size's fastest kept); throughput = samples of both
   ranks per second. Printed: predicted and measured throughput at both, the speed-up.
Usage: python benchmarks/ddp_batch.py [--share 0.1] [--rounds 3]
"""

from __future__ import annotations

import argparse

import proftune
from proftune.profile import profile_ddp_batches
from proftune.recommend._ddp import ddp_recommendation, measure_and_plan, plan_ddp_batch

PARAMS = {"hidden": 1024, "batch_size": 32}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--share", type=float, default=0.10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    task = proftune.load_task("digits-mlp")
    params = {**task.default_params, **PARAMS}
    current = int(params["batch_size"])
    ns = proftune.noise_scale(task, params, small_batch=16, micro_batches=4, steps=30, device="cpu")
    crit = ns.critical_batch_size
    samples = 1437
    # what the row does: 1x/2x/4x, the plan, and a measurement at the plan when it lies far beyond
    scaling, uncapped = measure_and_plan("digits-mlp", nprocs=args.ranks, current=current, params=params,
                                         share=args.share, samples=samples, rounds=args.rounds, steps=args.steps)
    for p in scaling.points:
        print(f"measured at {p.batch_size:4d}/rank: step {p.step_ms:7.2f} ms, all-reduce {p.allreduce_ms:6.2f} ms "
              f"({p.allreduce_share:.0%}), {p.allreduce_bytes / 2**20:.2f} MiB, {p.throughput:7.0f} samples/s")
    print(f"fit: step = {scaling.fixed_ms:.2f} ms + {scaling.per_sample_ms:.3f} ms x B; all-reduce "
          f"{scaling.allreduce_ms:.2f} ms per step")
    plan = plan_ddp_batch(scaling, current=current, share=args.share, samples=samples, critical_batch=crit)
    row = ddp_recommendation(scaling, plan, lr=float(params["lr"]), optimizer="adamw", critical_batch=crit)
    print(f"critical batch (noise scale at lr {params['lr']}): {crit}; uncapped plan {uncapped.batch_size}/rank")
    print(f"row: {row.value}/rank ({row.confidence}): {row.reason}")
    target = plan.batch_size if plan.batch_size != current else uncapped.batch_size
    if target == current:
        print("nothing to verify: the plan keeps the current batch")
        return
    check = profile_ddp_batches("digits-mlp", nprocs=args.ranks, batch_sizes=[current, target], params=params,
                                rounds=args.rounds, steps=args.steps, device="cpu")
    measured = {p.batch_size: p for p in check.points}
    print(f"\n{'per-rank batch':>16s}{'predicted samples/s':>22s}{'measured samples/s':>21s}{'all-reduce share':>18s}")
    for b in (current, target):
        label = f"{b} ({'anchor' if b == current else 'ours'})"
        print(f"{label:>16s}{scaling.throughput(b):>22.0f}{measured[b].throughput:>21.0f}"
              f"{measured[b].allreduce_share:>18.0%}")
    speed = measured[target].throughput / measured[current].throughput
    predicted = scaling.throughput(target) / scaling.throughput(current)
    print(f"measured speed-up ours/anchor: x{speed:.2f} (predicted x{predicted:.2f}); "
          f"verified at {target}/rank"
          + ("" if target == plan.batch_size else
             f" (the uncapped plan; the critical batch {crit} caps the row at {plan.batch_size})"))


if __name__ == "__main__":
    main()
