"""Embedding size from the data: the built-in recommender at its original dim 64 (the anchor)
beside the size ``recommend``'s ``embedding_dim`` row gives it, over several seeds.

Task ``implicit-two-tower``: generated implicit feedback, 2000 users, 2000 items with Zipf-1.2
popularity, affinities of latent rank 8; a two-tower model at dim 64 trained with an in-batch
softmax. For each seed the row trains the task as it is (up to 16 epochs, early stop on
hit@10 with patience 2, the best epoch kept), reads the index stream and the trained spectrum,
and retrains at the recommended size under the same protocol. Printed: the dims found, hit@10
of both (mean ± std over the seeds), params, MACs and training memory of both, and the ratios.
Usage: python benchmarks/embedding_dim.py [--seeds 0 1 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import proftune
from proftune.recommend._embedding import EmbeddingConfig, recommend_embedding_dim


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    task = proftune.load_task("implicit-two-tower")
    params = dict(task.default_params)
    rows = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        row = recommend_embedding_dim(task, params, device=torch.device("cpu"),
                                      config=EmbeddingConfig(budget_s=3600, seed=seed))
        assert row is not None
        e = row.evidence
        rows.append({"seed": seed, "dims": row.value, "orig": e["original_metric"], "ours": e["resized_metric"],
                     "orig_epoch": e["original_best_epoch"], "ours_epoch": e["resized_best_epoch"],
                     "p0": e["original_params"], "p1": e["resized_params"], "m0": e["original_macs"],
                     "m1": e["resized_macs"], "b0": e["original_memory_bytes"], "b1": e["resized_memory_bytes"],
                     "s0": e["original_step_ms"], "s1": e["resized_step_ms"], "built": e["built"],
                     "s": time.perf_counter() - t0})
        r = rows[-1]
        print(f"seed {seed}: dims {r['dims']} ({r['built']}); hit@10 dim 64 {r['orig']:.4f} (epoch "
              f"{r['orig_epoch']}) vs ours {r['ours']:.4f} (epoch {r['ours_epoch']}); {r['s']:.0f} s", flush=True)

    def ms(key: str) -> str:
        v = [r[key] for r in rows]
        return f"{statistics.mean(v):.4f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.4f}"

    r0 = rows[0]
    print(f"\ntrue latent rank {task.spec.rank}; dims found per seed: "
          + ", ".join(f"{r['dims']['user_emb']}/{r['dims']['item_emb']}" for r in rows) + " (user/item)")
    print(f"{'':22s}{'anchor: dim 64':>18s}{'ours':>18s}{'ours/anchor':>14s}")
    print(f"{'hit@10 (seeds ' + ','.join(map(str, args.seeds)) + ')':22s}{ms('orig'):>18s}{ms('ours'):>18s}"
          f"{statistics.mean(r['ours'] for r in rows) / statistics.mean(r['orig'] for r in rows):>14.3f}")
    for label, a, b in (("params", "p0", "p1"), ("MACs / batch 512", "m0", "m1"),
                        ("training bytes", "b0", "b1")):
        print(f"{label:22s}{r0[a]:>18,}{r0[b]:>18,}{r0[b] / r0[a]:>14.3f}")
    s0 = statistics.median(r["s0"] for r in rows)
    s1 = statistics.median(r["s1"] for r in rows)
    print(f"{'ms per training step':22s}{s0:>18.2f}{s1:>18.2f}{s1 / s0:>14.3f}")
    diff = [r["ours"] - r["orig"] for r in rows]
    sd = statistics.stdev(diff) if len(diff) > 1 else 0.0
    print(f"paired difference of hit@10 (ours - anchor): {statistics.mean(diff):+.4f} ± {sd:.4f} over "
          f"{len(diff)} seeds")


if __name__ == "__main__":
    main()
