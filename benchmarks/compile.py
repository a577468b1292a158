"""The compiler step of compression: the eager model (the anchor) beside its AOTInductor and
ONNX Runtime builds, each measured by ``proftune compress`` as saved and loaded back.

For each task: train it (seed 0, the task's epochs), then ``compress(compile=("inductor",
"onnxruntime"))``: every candidate's latency at batch 1 and at the task's batch (interleaved
rounds, 1 thread, the median), file size, metric and the largest |output - eager output| over
the validation data. Printed: the figures and the ratio to eager; the numbers are this CPU's.
Usage: python benchmarks/compile.py [--tasks digits-mlp digits-cnn digits-transformer] [--rounds 7]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

import proftune


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["digits-mlp", "digits-cnn", "digits-transformer"])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.tasks:
        model = proftune.fit(name, epochs=None, seed=0, device="cpu").model.eval()
        t0 = time.perf_counter()
        report = proftune.compress(name, model=model, compile=("inductor", "onnxruntime"), finetune_epochs=0,
                                   latency_rounds=args.rounds, layer_times=False, device="cpu",
                                   db=f"sqlite:///{tempfile.gettempdir()}/proftune-bench-compile.db")
        spent = time.perf_counter() - t0
        base = report.baseline
        b = base.batch_size
        print(f"\n{name} (accuracy, batch {b}, 1 thread; compress took {spent:.0f} s)")
        print(f"{'method':14s}{'ms @1':>9s}{'x eager':>9s}{f'ms @{b}':>10s}{'x eager':>9s}{'KB':>9s}"
              f"{'accuracy':>10s}{'max |diff|':>12s}")
        for c in [base, *report.candidates]:
            diff = f"{c.eager_max_abs_diff:.1e}" if c.eager_max_abs_diff is not None else "-"
            label = "eager" if c.method == "baseline" else c.method
            print(f"{label:14s}{c.latency_ms:9.3f}{base.latency_ms / c.latency_ms:9.2f}{c.latency_batch_ms:10.3f}"
                  f"{base.latency_batch_ms / c.latency_batch_ms:9.2f}{c.size_bytes / 1024:9.1f}{c.metric:10.4f}"
                  f"{diff:>12s}")
        for note in report.notes:
            print(f"note: {note}")


if __name__ == "__main__":
    main()
