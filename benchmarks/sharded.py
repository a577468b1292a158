"""Data-parallel predictions (``proftune predict --gpus N --strategy ...``) beside the real thing.

1. Measured: real DDP and FSDP2 (``fully_shard`` per block, then the root) training steps on 2
   and 4 CPU ranks (gloo, one thread each; ``tests/predict/sharded_runs.py``), with and without
   full activation checkpointing, with gradient accumulation 1 and 4, on DeepBlocks (8 residual
   blocks of width 128, ``tests/predict/block_tasks.py``: the shard plus the units in flight is
   far from the whole model) at per-rank batch 2, fp32: the predicted per-rank peak
   (``--target cpu``) beside the measured one (PyTorch's ``FSDPMemTracker`` / ``MemTracker``,
   the highest rank; the CPU memory profile's running sum beside it), and the predicted step
   beside the measured one (median of 5 timed steps, the median rank) three ways: predict's own
   (``compute="auto"``, ``link="auto"``: the N ranks started for a few steps each, stepping
   together, each wrapped as one rank holds the model (FSDP of N ranks with all but one pretended),
   then the step's own collectives replayed between them at its sizes and launches, each launch
   after its share of the step's compute), the roofline's compute with the link swept in the
   measured ranks (``compute="roofline"``), and the roofline with the device table's link. Each
   repetition predicts right before its real run, so both meet the same moment of the load; the
   per-case ratio is the median of the repetitions' ratios, its range beside it. Goal: peak
   within 10%, step within 25%. ``--models TinyBert TinyLlama`` runs the ``transformers`` models instead.
   Measured (docs/development.md, 'The sharded step on gloo CPU ranks'): predict's own step (the
   ranks started for a few steps, stepping together, FSDP's rank on its shards with the other ranks
   pretended, the step's collectives replayed between them at its sizes and launches; each of 3
   repetitions right before its real run; load 5.9-10.3): pred/meas median 1.17 (0.81-1.49), within
   25% in 12 of 16 (FSDP2 high); FSDP's compute read at the share a rank gets between its
   collectives: FSDP2 median 0.98 (0.83-1.54), 7 of 8 (medians of 3 runs, load 3.7-7.4); the
   roofline's compute with the link swept in the same ranks 0.51 (0.30-0.98, 3 of 16); peak within
   3.42% in all 16 (median 0.32%).
2. DeepSpeed: one GPU's model states (parameters, gradients, optimizer state) under ZeRO-2,
   ZeRO-3 and FSDP (priced by ZeRO-3's form) at 1, 2, 4 and 8 GPUs on one node, for GPT-2 small
   (124M), TinyLlama and a Llama-2-7B-shaped decoder, with DeepSpeed's own estimators called
   directly (``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`` and
   ``stage3.estimate_zero3_model_states_mem_needs``, the functions its ``*_all_live`` and
   ``*_all_cold`` print; the counts from DeepSpeed's ``model_to_params`` on the live model, or
   for 7B from the config's closed form, never allocated). Printed: DeepSpeed's GPU bytes, our
   closed form of them (``STRATEGIES[s].deepspeed``; goal: ratio 1.000), our traced per-GPU
   model states and the ratio to DeepSpeed's, and our per-GPU peak at batch 1 (the activations
   DeepSpeed leaves out). Ours are PyTorch's mixed precision as the fit loop runs it (bf16
   autocast over fp32 weights: 4Ψ parameters, 4Ψ gradients, 8Ψ AdamW state, each sharded as the
   strategy shards it); DeepSpeed's assume its own fp16 layout (2Ψ fp16 parameters on every GPU;
   2Ψ fp16 + 4Ψ fp32 gradients, 4Ψ fp32 master weights and 8Ψ Adam state sharded): the ratio
   is that difference of layouts, not an error (ZeRO-2 at N GPUs: (4 + 12/N) / (2 + 18/N)).

DeepSpeed is optional: ``pip install 'proftune[deepspeed]'`` (or ``pip install deepspeed``: it
builds from source in about a minute and runs its estimators on a CPU-only machine). Without
it, part 2 prints how to install it and our closed forms alone.

Part 1 starts 2 sets of ranks per case and repetition (80-170 s a case at 3 repetitions on a busy
2-core machine; ``--skip-measured`` leaves it out); part 2 traces the 7B decoder twice (about a minute; ``--skip-7b``).
Timings on a shared, busy machine: compare within one run.
Usage: python benchmarks/sharded.py [--skip-measured] [--skip-deepspeed] [--skip-7b] [--ranks 2 4]
       [--repeats 1] [--models DeepBlocks] [--strategies ddp fsdp] [--checkpointing none full]
       [--accumulation 1 4]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "predict")
HF = os.path.join(TESTS, "hf_tasks.py")
sys.path.insert(0, TESTS)

import proftune  # noqa: E402
from proftune.predict import STRATEGIES, predict  # noqa: E402

MEASURED_TASKS = {"DeepBlocks": os.path.join(TESTS, "block_tasks.py") + ":DeepBlocks",
                  "TinyBert": f"{HF}:TinyBert", "TinyLlama": f"{HF}:TinyLlama"}
#: (strategy, offload) rows of part 2.
DS_ROWS = [("zero2", "none"), ("zero2", "optimizer"), ("zero3", "none"), ("zero3", "optimizer"),
           ("zero3", "params"), ("fsdp", "none")]
GPUS = (1, 2, 4, 8)


def in_unit(unit: int) -> Any:
    """Bytes as a number in ``unit`` (2**20: MiB, 2**30: GiB), three decimals."""
    return lambda n: "-" if n is None else f"{n / unit:.3f}"


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.3f}"


# -- 1. predicted vs measured on CPU ranks --------------------------------------------------------------


def measured_table(ranks: tuple[int, ...], *, repeats: int = 1, models: tuple[str, ...] = ("DeepBlocks",),
                   strategies: tuple[str, ...] = ("ddp", "fsdp"), checkpointing: tuple[str, ...] = ("none", "full"),
                   accumulation: tuple[int, ...] = (1, 4), batch_size: int = 2) -> dict[str, list[float]]:
    from sharded_runs import measure

    from proftune.predict import LinkFigures

    print(f"\n== 1. per-rank peak and step on gloo CPU ranks, fp32, per-rank batch {batch_size}: predicted vs measured "
          f"(median of {repeats} run{'s' if repeats > 1 else ''}; a run's peak is its highest rank's, PyTorch's "
          "FSDPMemTracker / MemTracker; its step the median rank's median of 5)")
    print("   link: measured in the same ranks after their steps (all-reduce/all-gather/reduce-scatter at "
          "16 KiB-4 MiB); 'table' = the device table's cpu figure (a quarter of the copy bandwidth, no latency)")
    print(f"{'model':10s} {'N':>2s} {'strategy':8s} {'ckpt':5s} {'acc':>3s} {'pred MiB':>9s} {'meas MiB':>9s} "
          f"{'pred/meas':>9s} {'prof MiB':>9s} {'pred ms':>8s} {'meas ms':>8s} {'pred/meas':>9s} {'table ms':>8s} "
          f"{'tbl/meas':>8s} {'roof ms':>8s} {'roof/meas':>9s} {'share':>5s} {'sharing':>7s} {'wall s':>7s}")
    out: dict[str, list[float]] = {"peak": [], "step": [], "step_table": [], "step_roofline": []}
    rows: list[tuple[int, str, str, int, float, float, float, float, float, float]] = []
    spreads: list[tuple[float, float]] = []
    load_seen: list[float] = []
    links: dict[int, Any] = {}
    for label in models:
        task = MEASURED_TASKS[label]
        for n in ranks:
            for strategy in strategies:
                for ckpt in checkpointing:
                    for acc in accumulation:
                        t0 = time.perf_counter()
                        params = {"grad_accumulation": acc}
                        kw = {"batch_size": batch_size, "target": "cpu", "gpus": n, "strategy": strategy,
                              "activation_checkpointing": ckpt, "max_batch": False}
                        # each repetition: predict's own measurement right before the real run, so that
                        # both meet the same moment of the machine's load
                        runs, preds, loads = [], [], []
                        for r in range(repeats):
                            loads.append(os.getloadavg()[0])
                            preds.append(predict(task, params, **kw).parallel)
                            runs.append(measure(task, world=n, strategy=strategy, checkpointing=ckpt,
                                                batch_size=batch_size, params=params, timed_steps=5,
                                                profiler=r == 0, link=True))
                        p = preds[0]
                        assert p is not None
                        per_run = [float(q.step["time_ms"] or 0) / m["step_ms"]
                                   for q, m in zip(preds, runs, strict=True) if q is not None]
                        peak = statistics.median(r["peak_bytes"] for r in runs)
                        step_ms = statistics.median(r["step_ms"] for r in runs)
                        prof = runs[0]["profiler_peak_bytes"]
                        link = LinkFigures("gloo", n, runs[-1]["link"], False,
                                           f"measured: gloo between the {n} ranks of this run")
                        links[n] = link
                        tbl = predict(task, params, link="table", compute="roofline", **kw).parallel
                        roof = predict(task, params, link=link, compute="roofline", **kw).parallel
                        assert tbl is not None
                        assert roof is not None
                        pred_ms = statistics.median(float(q.step["time_ms"] or 0) for q in preds if q is not None)
                        out["peak"].append(p.peak_bytes / peak - 1)
                        out["step"].append(statistics.median(per_run))
                        out["step_table"].append(float(tbl.step["time_ms"] or 0) / step_ms)
                        out["step_roofline"].append(float(roof.step["time_ms"] or 0) / step_ms)
                        spreads.append((min(per_run), max(per_run)))
                        load_seen.extend(loads)
                        rows.append((n, strategy, ckpt, acc, pred_ms, step_ms, min(per_run), max(per_run),
                                     min(loads), max(loads)))
                        print(f"{label:10s} {n:2d} {strategy:8s} {ckpt:5s} {acc:3d} {mib(p.peak_bytes):>9s} "
                              f"{mib(peak):>9s} {ratio(p.peak_bytes, peak):>9s} {mib(prof):>9s} "
                              f"{pred_ms:8.2f} {step_ms:8.2f} {statistics.median(per_run):9.3f} "
                              f"{tbl.step['time_ms'] or 0:8.2f} {ratio(tbl.step['time_ms'], step_ms):>8s} "
                              f"{roof.step['time_ms'] or 0:8.2f} {ratio(roof.step['time_ms'], step_ms):>9s} "
                              f"{p.compute.get('cpu_share', 0):5.2f} {p.compute.get('sharing', 0):7.2f} "
                              f"{time.perf_counter() - t0:7.1f}", flush=True)
    for n, link in links.items():
        print(f"link measured on {n} ranks (last run): " + "; ".join(
            f"{k} {v['latency_s'] * 1e6:.0f} us + bytes / {v['bytes_s'] / 1e9:.3g} GB/s"
            for k, v in link.collectives.items()))
    errs = [abs(e) for e in out["peak"]]
    print(f"peak: max |error| {max(errs):.2%}, median {statistics.median(errs):.2%} (goal <= 10%)")
    print(f"\nthe step, predict's own (the ranks' compute measured as they step together + their collectives "
          f"replayed between them; each repetition right before its real run; medians of {repeats}):")
    print(f"{'ranks':>5s} {'strategy':8s} {'ckpt':5s} {'acc':>3s} {'predicted ms':>12s} {'measured ms':>11s} "
          f"{'ratio':>6s} {'ratio range':>11s} {'load':>9s}")
    for (n, strategy, ckpt, acc, pred_ms, step_ms, lo, hi, l0, l1), r in zip(rows, out["step"], strict=True):
        print(f"{n:5d} {strategy:8s} {ckpt:5s} {acc:3d} {pred_ms:12.2f} {step_ms:11.2f} {r:6.2f} "
              f"{lo:5.2f}-{hi:<5.2f} {l0:4.1f}-{l1:<4.1f}")
    if load_seen:
        print(f"load (1-minute average) at the predictions: {min(load_seen):.1f}-{max(load_seen):.1f}")
    for key, what in (("step", "the ranks measured stepping together + collectives replayed (predict's own)"),
                      ("step_roofline", "roofline compute + measured link"),
                      ("step_table", "roofline compute + table link")):
        r = out[key]
        print(f"step pred/meas, {what}: median {statistics.median(r):.2f}, range {min(r):.2f}-{max(r):.2f}, "
              f"within 25% in {sum(abs(x - 1) <= 0.25 for x in r)} of {len(r)}")
    return out


# -- 2. DeepSpeed's estimators ---------------------------------------------------------------------------


def deepspeed_estimators() -> tuple[Any, Any, Any] | None:
    """DeepSpeed's two returning estimators and ``model_to_params``, or None when not installed."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no GPU here: say so, rather than its fallback warning
    try:
        from deepspeed.runtime.zero.stage3 import (
            estimate_zero3_model_states_mem_needs,
            model_to_params,
        )
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except ImportError as exc:
        print(f"DeepSpeed is not installed ({exc}): pip install 'proftune[deepspeed]' (or pip install deepspeed) "
              "to print its figures; below, our closed forms of its estimators alone.")
        return None
    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs, model_to_params


def deepspeed_bytes(fns: tuple[Any, Any, Any] | None, strategy: str, offload: str, psi: int, largest: int,
                    gpus: int) -> tuple[int, int] | None:
    """(GPU, CPU) bytes from DeepSpeed's own function for this strategy and offload."""
    if fns is None:
        return None
    z2, z3, _ = fns
    if strategy == "zero2":
        cpu, gpu = z2(psi, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=offload == "optimizer")
    else:
        cpu, gpu, _ = z3(psi, largest, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=offload != "none",
                         cpu_offload_params=offload == "params", zero_init=True)
    return int(gpu), int(cpu)


def llama7b_counts() -> tuple[int, int]:
    """Ψ and DeepSpeed's largest layer of Llama-2-7B's config, in closed form (nothing built)."""
    h, ffn, layers, vocab = 4096, 11008, 32, 32000
    per_layer = 4 * h * h + 3 * h * ffn + 2 * h  # q, k, v, o; gate, up, down; two RMSNorms
    return vocab * h + layers * per_layer + h + vocab * h, vocab * h  # embedding, layers, norm, untied head


def counts(fns: tuple[Any, Any, Any] | None, label: str, task: proftune.Task) -> tuple[int, int, str]:
    """(Ψ, largest layer, how they were counted): DeepSpeed's ``model_to_params`` on the live model
    (random weights), or the 7B config's closed form."""
    if label == "Llama-2-7B":
        psi, largest = llama7b_counts()
        return psi, largest, "closed form of the config (never allocated)"
    if fns is None:
        return 0, 0, "ours"
    import torch

    torch.manual_seed(0)
    model = task.build_model(dict(task.default_params))
    psi, largest = fns[2](model)
    if label == "GPT-2 small":
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_live
        from deepspeed.runtime.zero.stage_1_and_2 import (
            estimate_zero2_model_states_mem_needs_all_live,
        )

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=8, num_nodes=1)
            estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=8, num_nodes=1)
        print(f"DeepSpeed's own printout for {label} on 8 GPUs (estimate_zero2/3_model_states_mem_needs_all_live; "
              "its 'GB' are GiB):")
        print("    " + buf.getvalue().strip().replace("\n", "\n    "))
    del model
    return int(psi), int(largest), "DeepSpeed's model_to_params on the live model"


def deepspeed_table(skip_7b: bool) -> list[float]:
    from hf_tasks import Gpt2Small, Llama7B, TinyLlama

    print("\n== 2. one GPU's model states: DeepSpeed's estimators (called) vs our closed form of them vs our "
          "traced states (bf16 autocast + AdamW, batch 1, a100)")
    fns = deepspeed_estimators()
    models: dict[str, proftune.Task] = {"TinyLlama": TinyLlama(), "GPT-2 small": Gpt2Small()}
    if not skip_7b:
        models["Llama-2-7B"] = Llama7B()
    form_ratios: list[float] = []
    for label, task in models.items():
        t0 = time.perf_counter()
        psi, largest, how = counts(fns, label, task)
        first = predict(task, batch_size=1, target="a100", precision="bf16", gpus=1, strategy="zero2",
                        max_batch=False).parallel
        assert first is not None
        ours_psi, ours_largest = first.n_params, first.largest_layer_params
        if not psi:
            psi, largest = ours_psi, ours_largest
        unit, u = (2**30, "GiB") if psi > 2**30 else (2**20, "MiB")
        fmt = in_unit(unit)
        print(f"\n{label}: Ψ = {psi:,} ({how}; ours {ours_psi:,}), largest layer L = {largest:,} "
              f"(ours {ours_largest:,})")
        print(f"{'N':>2s} {'strategy':8s} {'offload':9s} {'DeepSpeed ' + u:>13s} {'our form ' + u:>12s} "
              f"{'form/DS':>7s} {'our states ' + u:>14s} {'ours/DS':>7s} {'our peak ' + u:>12s} "
              f"{'DS CPU ' + u:>10s} {'our host ' + u:>12s}")
        for n in GPUS:
            for strategy, offload in DS_ROWS:
                p = predict(task, batch_size=1, target="a100", precision="bf16", gpus=n, strategy=strategy,
                            offload=offload, max_batch=False).parallel
                assert p is not None
                form = STRATEGIES[strategy].deepspeed(psi, largest, n, 1, offload)
                ds = deepspeed_bytes(fns, strategy, offload, psi, largest, n)
                states = sum(p.model_states.get(k, 0) for k in ("params", "grads", "optimizer_state"))
                if ds is not None:
                    form_ratios.append(form.gpu_bytes / ds[0])
                ds_gpu = ds[0] if ds else None
                print(f"{n:2d} {STRATEGIES[strategy].title:8s} {offload:9s} {fmt(ds_gpu):>13s} "
                      f"{fmt(form.gpu_bytes):>12s} {ratio(form.gpu_bytes, ds_gpu):>7s} {fmt(states):>14s} "
                      f"{ratio(states, ds_gpu or form.gpu_bytes):>7s} {fmt(p.peak_bytes):>12s} "
                      f"{fmt(ds[1] if ds else form.cpu_bytes):>10s} {fmt(p.model_states.get('host', 0)):>12s}",
                      flush=True)
        print(f"({label}: {time.perf_counter() - t0:.1f} s, traces reused across rows)")
    if form_ratios:
        worst = max(abs(r - 1) for r in form_ratios)
        print(f"\nour closed forms vs DeepSpeed's functions: {len(form_ratios)} figures, max |ratio - 1| = {worst:.2e} "
              "(goal: equal)")
    return form_ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-measured", action="store_true")
    ap.add_argument("--skip-deepspeed", action="store_true")
    ap.add_argument("--skip-7b", action="store_true")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=1, help="runs of each measured case (median)")
    ap.add_argument("--models", nargs="+", default=["DeepBlocks"], choices=list(MEASURED_TASKS))
    ap.add_argument("--accumulation", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    ap.add_argument("--checkpointing", nargs="+", default=["none", "full"], choices=["none", "full", "selective"])
    args = ap.parse_args()
    # torchao (imported by transformers) registers Enums with pytree, which torch logs as deprecated
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()  # GPT-2's config notes its default loss on stderr
    started = time.perf_counter()
    if not args.skip_deepspeed:
        deepspeed_table(args.skip_7b)
    if not args.skip_measured:
        measured_table(tuple(args.ranks), repeats=args.repeats, models=tuple(args.models),
                       strategies=tuple(args.strategies), checkpointing=tuple(args.checkpointing),
                       accumulation=tuple(args.accumulation))
    print(f"\ntotal {time.perf_counter() - started:.0f} s (shared, busy machine)")


if __name__ == "__main__":
    main()
