"""Compression benchmark: proftune compress beside the anchors (Torch-Pruning's own counter and
published ResNet-18 figures, plain uniform Torch-Pruning, torch.ao vs torchao INT8), with ratios.

    python benchmarks/compress.py            # digits parts (a few minutes on 2 CPU cores)
    python benchmarks/compress.py --resnet   # + ResNet-18 structured 0.5, round_to=8

Latencies: CPU, 1 intra-op thread, warm-up, interleaved rounds, median. Nothing is written to
the repository (a temporary folder holds the run store and the models).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")

import proftune  # noqa: E402
from proftune.compress import Candidate, load_model  # noqa: E402
from proftune.task import load_task  # noqa: E402
from proftune.train import evaluate_model, fit  # noqa: E402

RESULTS: list[tuple[str, bool]] = []


def check(name: str, ok: bool) -> None:
    RESULTS.append((name, ok))
    print(f"  [{'PASS' if ok else 'FAIL'}] {name}")


def row(label: str, ours: float, anchor: float, unit: str = "") -> None:
    ratio = ours / anchor if anchor else float("nan")
    print(f"  {label:<44} ours {ours:>12.4g}{unit}   anchor {anchor:>12.4g}{unit}   ratio {ratio:6.3f}")


def by(report: proftune.CompressResult, method: str, ratio: float | None = None) -> Candidate:
    for c in report.candidates:
        if c.method == method and (ratio is None or abs(c.ratio - ratio) < 1e-9):
            return c
    raise KeyError(method)


def resnet(tmp: Path) -> None:
    import torch_pruning as tp

    print("\n== resnet18-synthetic, structured, ratio 0.5, round_to=8 (no fine-tuning: random data) ==")
    task = load_task("resnet18-synthetic")
    torch.manual_seed(0)
    model = task.build_model({}).eval()
    out = tmp / "resnet18_pruned.pt"
    t0 = time.perf_counter()
    rep = proftune.compress(task, model=model, prune="structured", ratios=(0.5,), round_to=8,
                            sensitivity=False, finetune_epochs=0, max_accuracy_drop=1.0,
                            goal="macs", out=str(out), db=f"sqlite:///{tmp}/b.db", threads=1,
                            latency_rounds=9)
    print(f"  compress took {time.perf_counter() - t0:.0f} s")
    base, pruned = rep.baseline, by(rep, "structured", 0.5)
    x = torch.randn(1, 3, 224, 224)
    tp_macs0, tp_params0 = tp.utils.count_ops_and_params(model, x)
    saved = load_model(out)
    tp_macs1, tp_params1 = tp.utils.count_ops_and_params(saved, x)
    print("  ours = proftune count_model on the saved model; anchor = tp.utils.count_ops_and_params")
    row("baseline MACs", base.macs, tp_macs0)
    row("baseline params", base.params, tp_params0)
    row("pruned MACs", pruned.macs, tp_macs1)
    row("pruned params", pruned.params, tp_params1)
    print("  anchor = Torch-Pruning's published figures (1.82G -> 0.49G MACs, 11.69M -> 3.1M params)")
    row("pruned MACs vs published 0.49G", pruned.macs, 0.49e9)
    row("pruned params vs published 3.1M", pruned.params, 3.1e6)
    speed1 = base.latency_ms / pruned.latency_ms
    speedb = base.latency_batch_ms / pruned.latency_batch_ms
    print(f"  latency batch 1: {base.latency_ms:.1f} -> {pruned.latency_ms:.1f} ms ({speed1:.2f}x); "
          f"batch {base.batch_size}: {base.latency_batch_ms:.1f} -> {pruned.latency_batch_ms:.1f} ms ({speedb:.2f}x)")
    check("resnet18 MACs <= 0.49G", pruned.macs <= 0.49e9)
    check("resnet18 params <= 3.1M", pruned.params <= 3.1e6)
    check("resnet18 CPU speedup at batch 1 >= 2x", speed1 >= 2.0)


def digits_cnn_structured(tmp: Path, base_model: torch.nn.Module) -> None:
    print("\n== digits-cnn, structured pruning to <= half the parameters, fine-tuned 3 epochs ==")
    task = load_task("digits-cnn")
    t0 = time.perf_counter()
    rep = proftune.compress(task, model=base_model, prune="structured", ratios=(0.3, 0.4), finetune_epochs=3,
                            goal="size", max_accuracy_drop=0.01, db=f"sqlite:///{tmp}/b.db", threads=1)
    print(f"  compress took {time.perf_counter() - t0:.0f} s")
    base = rep.baseline
    half = [c for c in rep.candidates if c.params <= base.params / 2]
    best = max(half, key=lambda c: c.metric) if half else None
    for c in rep.candidates:
        print(f"  ours: ratio {c.ratio:g}: params {base.params} -> {c.params} ({c.params / base.params:.2f}), "
              f"accuracy {base.metric:.4f} -> {c.metric:.4f} (drop {c.metric_drop * 100:+.2f} pt)")
    # anchor: plain Torch-Pruning, uniform ratio, same importance, same fine-tuning by the fit loop
    import torch_pruning as tp

    ratio = best.ratio if best else 0.4
    anchor = copy.deepcopy(base_model)
    x = torch.randn(1, 1, 8, 8)
    tp.pruner.MetaPruner(anchor, x, importance=tp.importance.GroupMagnitudeImportance(p=2),
                         pruning_ratio=ratio, ignored_layers=[anchor[-1]]).step()
    fit(task, {}, model=anchor, epochs=3, seed=0, device="cpu")
    a_acc = evaluate_model(task, anchor, torch.device("cpu"), 64)["accuracy"]
    a_params = sum(p.numel() for p in anchor.parameters())
    if best is not None:
        print(f"  anchor = plain uniform Torch-Pruning at ratio {ratio:g}, same 3 fine-tuning epochs")
        row("accuracy", best.metric, a_acc)
        row("params", best.params, a_params)
    check("digits-cnn structured: some candidate has <= half the params", best is not None)
    check("digits-cnn structured: accuracy drop <= 1 point at <= half the params",
          best is not None and best.metric_drop <= 0.01)


def digits_mlp_dynamic(tmp: Path) -> None:
    print("\n== digits-mlp hidden=1024, dynamic INT8 (torch.ao and torchao timed side by side) ==")
    task = load_task("digits-mlp")
    t0 = time.perf_counter()
    rep = proftune.compress(task, params={"hidden": 1024}, quantize="dynamic", baseline_epochs=5,
                            max_accuracy_drop=0.005, db=f"sqlite:///{tmp}/b.db", threads=1)
    print(f"  compress took {time.perf_counter() - t0:.0f} s (includes training the baseline)")
    base, q = rep.baseline, by(rep, "dynamic")
    print(f"  backend timings at batch {q.batch_size} (ms): {q.backend_ms}; chosen: {q.quant_backend}")
    speed = base.latency_batch_ms / q.latency_batch_ms
    smaller = base.size_bytes / q.size_bytes
    print(f"  latency batch {q.batch_size}: fp32 {base.latency_batch_ms:.3f} -> int8 {q.latency_batch_ms:.3f} ms "
          f"({speed:.2f}x); batch 1: {base.latency_ms:.3f} -> {q.latency_ms:.3f} ms")
    print(f"  size {base.size_bytes} -> {q.size_bytes} bytes ({smaller:.2f}x smaller); accuracy "
          f"{base.metric:.4f} -> {q.metric:.4f} (drop {q.metric_drop * 100:+.2f} pt)")
    for note in rep.notes:
        print(f"  note: {note}")
    ta = q.backend_ms.get("torchao")
    if isinstance(ta, float):
        row("int8 latency at batch 64: ours chosen vs torchao", q.latency_batch_ms, ta, " ms")
    check("dynamic INT8: >= 2x lower CPU latency at batch 64", speed >= 2.0)
    check("dynamic INT8: >= 3.5x smaller", smaller >= 3.5)
    check("dynamic INT8: accuracy drop <= 0.5 point", q.metric_drop <= 0.005)


def digits_cnn_static(tmp: Path, base_model: torch.nn.Module) -> None:
    print("\n== digits-cnn, static INT8 (fused conv-bn-relu, calibrated on task data) ==")
    task = load_task("digits-cnn")
    rep = proftune.compress(task, model=base_model, quantize="static", max_accuracy_drop=0.01,
                            db=f"sqlite:///{tmp}/b.db", threads=1)
    base, q = rep.baseline, by(rep, "static")
    print(f"  latency batch {q.batch_size}: {base.latency_batch_ms:.3f} -> {q.latency_batch_ms:.3f} ms "
          f"({base.latency_batch_ms / q.latency_batch_ms:.2f}x); batch 1: {base.latency_ms:.3f} -> "
          f"{q.latency_ms:.3f} ms ({base.latency_ms / q.latency_ms:.2f}x)")
    print(f"  size {base.size_bytes} -> {q.size_bytes} bytes; accuracy {base.metric:.4f} -> {q.metric:.4f} "
          f"(drop {q.metric_drop * 100:+.2f} pt); backends: {q.backend_ms}")
    for note in rep.notes:
        print(f"  note: {note}")
    check("static INT8: accuracy drop <= 1 point", q.metric_drop <= 0.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--resnet", action="store_true", help="also run the ResNet-18 part (~2-4 min more)")
    parser.add_argument("--only-resnet", action="store_true", help="run only the ResNet-18 part")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads available; timing with 1 thread")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.only_resnet:
            task = load_task("digits-cnn")
            base_model = fit(task, {}, epochs=10, seed=0, device="cpu").model.eval()
            digits_cnn_structured(tmp, base_model)
            digits_mlp_dynamic(tmp)
            digits_cnn_static(tmp, base_model)
        if args.resnet or args.only_resnet:
            resnet(tmp)
    print(f"\n{sum(ok for _, ok in RESULTS)}/{len(RESULTS)} checks passed in {time.perf_counter() - started:.0f} s")
    return 0 if all(ok for _, ok in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
