"""GPU truth: run proftune's CUDA paths on a real NVIDIA GPU and check them against references.

    python benchmarks/gpu_check.py                   # on a machine with an NVIDIA GPU, < 8 minutes
    python benchmarks/gpu_check.py --quick           # fewer steps and repeats
    python benchmarks/gpu_check.py --device cpu --quick   # dry run: every check's code path on CPU

Prints one table (check, ours, reference, ratio, result) and exits 1 when a check fails.
Without a GPU it prints "no GPU" and exits 0, claiming nothing. The dry run (``--device cpu``)
runs each check at tiny sizes on CPU. It makes no claim about GPU numbers: its rows are marked
"cpu dry-run", and it exits 1 only when a check's code raises.

Only the public API is used (``proftune.profile``, ``find_batch_size``, ``recommend``,
``compress``, ``Monitor``, ``fit``). The references are measured by plain PyTorch code in this
file: ``torch.cuda.max_memory_allocated`` around a hand-written training step, CUDA events
around forward+backward, Torch-Pruning's own pruner, and a bare ``torch.matmul``.

Checks (each names its pass condition in the table):

- memory: ``find_batch_size`` with a memory budget on resnet18-synthetic and a scaled-up
  digits-transformer. The allocator's peak at the answer must fit the budget, and at 1.25x the
  answer it must not be far under it (>= 95%). The profile's peak must be within 5% of the
  allocator's.
- timing: per-layer forward+backward times sum to the CUDA-event forward+backward within 10%;
  ``Monitor(every=50)`` adds <= 2% to a ResNet-18 training loop at batch 64.
- precision: ``recommend`` proposes bf16 for a matmul-bound model, whose bf16 step is >= 1.5x
  faster than its fp32 step; digits-cnn trained in fp16 with the grad scaler reaches the fp32
  accuracy within 1 point.
- compress: ResNet-18 structured pruning at 0.5, latency speedup at batch 1 and 64, at least 90%
  of Torch-Pruning's own speedup. The INT8 backend chosen is the fastest measured (torchao vs
  torch.ao; on CUDA only torchao runs).
- flops: achieved TFLOP/s of the largest layers (fp32 and bf16) beside a bare matmul of the same
  shape and the device's peak (reported, no pass/fail).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import logging
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

import proftune

log = logging.getLogger("gpu_check")

#: Dense peak TFLOP/s by device name (NVIDIA data sheets, SXM parts; no sparsity): fp32, tf32, bf16.
PEAK_TFLOPS: dict[str, tuple[float, float, float]] = {
    "H200": (67.0, 494.7, 989.4),
    "H100": (67.0, 494.7, 989.4),
    "A100": (19.5, 156.0, 312.0),
    "L40S": (91.6, 183.0, 362.0),
    "L4": (30.3, 60.0, 121.0),
    "A10": (31.2, 62.5, 125.0),
}


# -- the table --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    """One line of the table. ``passed`` None: reported, not judged."""

    check: str
    ours: float | str | None
    reference: float | str | None
    unit: str = ""
    passed: bool | None = None
    note: str = ""
    error: bool = False

    @property
    def ratio(self) -> float | None:
        if isinstance(self.ours, (int, float)) and isinstance(self.reference, (int, float)) and self.reference:
            return float(self.ours) / float(self.reference)
        return None


def _cell(v: float | str | None, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if unit == "B":
        return f"{v / 2**20:,.1f} MiB"
    if unit in ("x", "%"):
        return f"{v:.2f}{unit}" if unit == "x" else f"{v:+.2%}"
    return f"{v:.4g}{(' ' + unit) if unit else ''}"


def result_of(row: Row, dry: bool) -> str:
    if row.error:
        return "ERROR"
    if dry:
        return "cpu dry-run"
    if row.passed is None:
        return "info"
    return "PASS" if row.passed else "FAIL"


def format_table(rows: Sequence[Row], *, dry: bool) -> str:
    """The one table: check, ours, reference, ratio, result (and a note)."""
    head = ("check", "ours", "reference", "ratio", "result", "note")
    body = [(r.check, _cell(r.ours, r.unit), _cell(r.reference, r.unit),
             "-" if r.ratio is None else f"{r.ratio:.3f}", result_of(r, dry), r.note) for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(5)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(head[:5], widths, strict=True)) + "  " + head[5]]
    lines.append("-" * (sum(widths) + 2 * 5 + 4))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(x[:5], widths, strict=True)) + "  " + x[5] for x in body]
    return "\n".join(lines)


def exit_code(rows: Sequence[Row], *, dry: bool) -> int:
    """1 when a check raised, or (on a GPU) failed; else 0."""
    if any(r.error for r in rows):
        return 1
    if not dry and any(r.passed is False for r in rows):
        return 1
    return 0


# -- context and measuring helpers --------------------------------------------------------------------
@dataclasses.dataclass
class Ctx:
    device: torch.device
    quick: bool
    tmp: Path

    @property
    def dry(self) -> bool:
        return self.device.type != "cuda"

    @property
    def db(self) -> str:
        return f"sqlite:///{self.tmp / 'gpu_check.db'}"

    def pick(self, gpu: Any, cpu: Any) -> Any:
        """``gpu`` on the real run, ``cpu`` (tiny) in the dry run."""
        return cpu if self.dry else gpu

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(b, device) for b in batch)
    return batch


def _first_batch(task: proftune.Task, params: dict[str, Any], batch_size: int) -> Any:
    """One training batch of exactly ``batch_size`` samples (cycled from the data if short)."""
    xs: list[Any] = []
    n = 0
    while n < batch_size:
        for b in task.train_data(batch_size, params):
            xs.append(b)
            n += int(b[0].shape[0])
            if n >= batch_size:
                break
    cols = list(zip(*xs, strict=True))
    return tuple(torch.cat(c)[:batch_size] for c in cols)


def _samples(task: proftune.Task, params: dict[str, Any]) -> int:
    return sum(int(b[0].shape[0]) for b in task.train_data(256, params))


def reference_peak(ctx: Ctx, task: proftune.Task, params: dict[str, Any], batch_size: int) -> int | None:
    """``torch.cuda.max_memory_allocated`` over one hand-written training step (after two warm-up
    steps that create the optimizer state); None on CPU (no allocator peak there) and, as
    ``math.inf`` cast, an OOM is reported by the caller."""
    if ctx.dry:
        return None
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    model = task.build_model(params).to(ctx.device).train()
    opt = task.configure_optimizer(model, params)
    batch = _to(_first_batch(task, params, batch_size), ctx.device)
    try:
        for i in range(3):
            if i == 2:
                ctx.sync()
                torch.cuda.reset_peak_memory_stats(ctx.device)
            opt.zero_grad(set_to_none=True)
            task.loss(model, batch).backward()
            opt.step()
        ctx.sync()
        return int(torch.cuda.max_memory_allocated(ctx.device))
    finally:
        del model, opt, batch
        torch.cuda.empty_cache()


def timed_ms(ctx: Ctx, fn: Callable[[], Any], *, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn``: CUDA events on the GPU, ``perf_counter`` on CPU."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        if ctx.dry:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
    return statistics.median(out)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- a matmul-bound task ---------------------------------------------------------------------------
class MatmulTask(proftune.ClassificationTask):
    """A wide MLP on synthetic data whose labels a random projection decides: matmuls dominate."""

    name = "matmul-mlp"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 1024, "optimizer": "adamw"}

    def __init__(self, width: int = 4096, depth: int = 6, samples: int = 8192) -> None:
        self.width, self.depth = width, depth
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, width, generator=g)
        self.y = (self.x @ torch.randn(width, 10, generator=g)).argmax(1)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        layers: list[nn.Module] = []
        for _ in range(self.depth):
            layers += [nn.Linear(self.width, self.width), nn.GELU()]
        return nn.Sequential(*layers, nn.Linear(self.width, 10))

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        from proftune.examples import TensorBatches

        return TensorBatches(self.x, self.y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        from proftune.examples import TensorBatches

        return TensorBatches(self.x[:1024], self.y[:1024], batch_size, shuffle=False)


# -- checks ----------------------------------------------------------------------------------------
def _budget_for(ctx: Ctx, task: proftune.Task, params: dict[str, Any], target: int) -> int:
    """A budget whose answer lands near ``target`` samples: the allocator's peak at two small
    batches extended along their line (our own probe on CPU, where no allocator peak exists)."""
    from proftune.profile import peak_step_memory

    def peak(b: int) -> int:
        ref = reference_peak(ctx, task, params, b)
        return ref if ref is not None else peak_step_memory(task, params, batch_size=b, device=ctx.device)

    lo, hi = max(1, target // 8), max(2, target // 4)
    p_lo, p_hi = peak(lo), peak(hi)
    slope = max((p_hi - p_lo) / (hi - lo), 1.0)
    return int(p_hi + slope * (target - hi))


def _memory_model(ctx: Ctx, label: str, task: proftune.Task, params: dict[str, Any]) -> list[Row]:
    data = _samples(task, params)
    target = max(4, int(data * 0.55))  # 1.25x the answer stays inside the data
    budget = _budget_for(ctx, task, params, target)
    res = proftune.find_batch_size(task, params, memory_budget=budget, device=ctx.device)
    b = res.max_batch_size
    over = min(data, max(b + 1, math.ceil(1.25 * b)))
    at = reference_peak(ctx, task, params, b)
    try:
        at_over: float | None = reference_peak(ctx, task, params, over)
    except torch.OutOfMemoryError:
        at_over = math.inf
    note = f"budget {budget / 2**20:,.0f} MiB, answer {b} ({res.limited_by}), {len(res.probes)} probes"
    return [
        Row(f"memory {label}: peak at the answer {b} <= budget", at, float(budget), "B",
            None if at is None else at <= budget, note),
        Row(f"memory {label}: predicted peak at {b} vs allocator", res.predicted_peak_bytes, at, "B",
            None if at is None else abs(res.predicted_peak_bytes / at - 1) <= 0.10, "within 10%"),
        Row(f"memory {label}: peak at 1.25x ({over}) >= 95% of budget", at_over, float(budget), "B",
            None if at_over is None else at_over >= 0.95 * budget, "the answer is not far too small"),
    ]


def check_memory(ctx: Ctx) -> list[Row]:
    from proftune.task import load_task

    rows = _memory_model(ctx, ctx.pick("resnet18-synthetic", "digits-cnn"),
                         load_task(ctx.pick("resnet18-synthetic", "digits-cnn")), {})
    big = ctx.pick({"d_model": 512, "heads": 8, "layers": 8, "ff": 2048},
                   {"d_model": 32, "heads": 4, "layers": 2, "ff": 64})
    rows += _memory_model(ctx, "digits-transformer (scaled)", load_task("digits-transformer"), big)
    return rows


def check_profile(ctx: Ctx) -> list[Row]:
    """Profile peak vs the allocator's; per-layer forward+backward vs CUDA events."""
    from proftune.task import load_task

    name = ctx.pick("resnet18-synthetic", "digits-cnn")
    task = load_task(name)
    bs = ctx.pick(64, 32)
    with quiet():
        p = proftune.profile(task, batch_size=bs, steps=ctx.pick(5, 2), device=ctx.device)
    ref_peak = reference_peak(ctx, task, {}, bs)
    layer_sum = sum((lay.forward_ms or 0.0) + (lay.backward_ms or 0.0) for lay in p.layers)

    torch.manual_seed(0)
    model = task.build_model({}).to(ctx.device).train()
    batch = _to(_first_batch(task, {}, bs), ctx.device)

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        task.loss(model, batch).backward()

    ref_ms = timed_ms(ctx, fwd_bwd, iters=ctx.pick(20, 3))
    return [
        Row(f"profile peak vs allocator peak ({name}, batch {bs})", p.memory.peak_bytes, ref_peak, "B",
            None if ref_peak is None else abs(p.memory.peak_bytes / ref_peak - 1) <= 0.05, "within 5%"),
        Row(f"per-layer fwd+bwd sum vs CUDA-event fwd+bwd ({name}, batch {bs})", layer_sum, ref_ms, "ms",
            abs(layer_sum / ref_ms - 1) <= 0.10, f"within 10%; outside layers {p.step.outside_layers_ms:.3f} ms"),
    ]


def check_monitor(ctx: Ctx) -> list[Row]:
    """Monitor(every=50) on a user's ResNet-18 loop at batch 64, interleaved with the plain loop."""
    from proftune.task import load_task

    task = load_task(ctx.pick("resnet18-synthetic", "digits-cnn"))
    bs, every = ctx.pick(64, 16), ctx.pick(50, 5)
    steps = ctx.pick(150 if ctx.quick else 300, 10)
    torch.manual_seed(0)
    model = task.build_model({}).to(ctx.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = _to(_first_batch(task, {}, bs), ctx.device)

    def loop(monitor: bool) -> float:
        ctx.sync()
        t0 = time.perf_counter()
        with proftune.Monitor(model, opt, every=every) if monitor else contextlib.nullcontext() as mon:
            for _ in range(steps):
                loss = F.cross_entropy(model(batch[0]), batch[1])
                loss.backward()
                opt.step()
                opt.zero_grad()
                if mon is not None:
                    mon.step(loss)
        ctx.sync()
        return time.perf_counter() - t0

    loop(False)  # warm-up: cuDNN autotuning, allocator
    plain: list[float] = []
    monitored: list[float] = []
    with quiet():
        for _ in range(ctx.pick(2 if ctx.quick else 3, 1)):
            plain.append(loop(False))
            monitored.append(loop(True))
    p, m = statistics.median(plain), statistics.median(monitored)
    over = m / p - 1
    return [Row(f"Monitor(every={every}) overhead, batch {bs}, {steps} steps", over, None, "%",
                over <= 0.02, f"plain {p / steps * 1e3:.2f} ms/step, monitored {m / steps * 1e3:.2f} ms/step; <= 2%")]


def _top_layer_tflops(p: proftune.Profile, k: int = 3) -> tuple[float, str]:
    layers = sorted((lay for lay in p.layers if lay.gflops_per_s), key=lambda lay: lay.flops, reverse=True)[:k]
    if not layers:
        return math.nan, "no timed layer"
    return statistics.fmean(lay.gflops_per_s or 0.0 for lay in layers) / 1e3, ", ".join(lay.name for lay in layers)


def _peak_for(dtype: str) -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    for key, peaks in PEAK_TFLOPS.items():
        if key in name:
            return peaks[{"fp32": 0, "tf32": 1, "bf16": 2}[dtype]]
    return None


def check_precision_and_flops(ctx: Ctx) -> list[Row]:
    width, batch = ctx.pick(4096, 64), ctx.pick(1024, 16)
    task = MatmulTask(width=width, depth=ctx.pick(6, 2), samples=ctx.pick(8192, 128))
    params = {"batch_size": batch}
    with quiet():
        recs = proftune.recommend(task, params, device=ctx.device, memory_budget=ctx.pick("16GiB", "512MB"),
                                  lr_steps=ctx.pick(30, 5), noise_steps=ctx.pick(10, 3))
    prec = recs.get("precision")
    want = "bf16" if (not ctx.dry and torch.cuda.is_bf16_supported()) else "fp16"
    rows = [Row(f"recommend precision for a matmul-bound MLP (width {width})", str(prec.value), want, "",
                prec.value == want, prec.reason[:70])]
    with quiet():
        fp32 = proftune.profile(task, params={**params, "precision": "fp32"}, device=ctx.device, steps=ctx.pick(5, 1))
        bf16 = proftune.profile(task, params={**params, "precision": "bf16"}, device=ctx.device, steps=ctx.pick(5, 1))
    speed = fp32.step.time_ms / bf16.step.time_ms
    rows.append(Row("bf16 step speedup over fp32 (matmul-bound MLP)", speed, 1.5, "x", speed >= 1.5,
                    f"fp32 {fp32.step.time_ms:.2f} ms, bf16 {bf16.step.time_ms:.2f} ms; >= 1.5x"))

    # FLOPs: the largest layers' achieved TFLOP/s, beside a bare matmul of their shape
    a = torch.randn(batch, width, device=ctx.device)
    w = torch.randn(width, width, device=ctx.device)
    flops = 2.0 * batch * width * width
    for label, prof, dtype in (("fp32", fp32, torch.float32), ("bf16", bf16, torch.bfloat16)):
        ours, names = _top_layer_tflops(prof)
        x, y = a.to(dtype), w.to(dtype)
        ref_ms = timed_ms(ctx, lambda x=x, y=y: torch.matmul(x, y), iters=ctx.pick(20, 2))
        ref = flops / (ref_ms / 1e3) / 1e12
        peak = _peak_for("fp32" if label == "fp32" else "bf16")
        note = f"largest: {names}; device peak {peak:g} TFLOP/s" if peak else f"largest: {names}"
        rows.append(Row(f"achieved TFLOP/s, largest layers, {label} (vs bare matmul)", ours, ref, "TFLOP/s",
                        None, note))

    def accuracy(precision: str) -> float:
        with quiet():
            r = proftune.fit("digits-cnn", {"precision": precision}, epochs=ctx.pick(15, 1), seed=0,
                             device=ctx.device)
        return float(r.metrics["accuracy"])

    half = ctx.pick("fp16", "bf16")  # the CPU's autocast has no grad scaler to try
    a32, a16 = accuracy("fp32"), accuracy(half)
    rows.append(Row(f"digits-cnn accuracy: {half} (grad scaler) vs fp32", a16, a32, "", abs(a16 - a32) <= 0.01,
                    "within 1 point"))
    return rows


def _torch_pruning_speedup(ctx: Ctx, model: nn.Module, example: torch.Tensor, ratio: float,
                           batches: Sequence[int]) -> list[float]:
    """The anchor: Torch-Pruning's MetaPruner at the same ratio, latency timed here."""
    import torch_pruning as tp

    pruned = copy.deepcopy(model).eval()
    last = [m for m in pruned.modules() if isinstance(m, nn.Linear)][-1]
    tp.pruner.MetaPruner(pruned, example, importance=tp.importance.GroupMagnitudeImportance(p=2),
                         pruning_ratio=ratio, ignored_layers=[last], round_to=ctx.pick(8, None)).step()
    out = []
    for b in batches:
        x = example[:1].expand(b, *example.shape[1:]).contiguous()
        with torch.no_grad():
            t0 = timed_ms(ctx, lambda x=x: model(x), iters=ctx.pick(30, 3))
            t1 = timed_ms(ctx, lambda x=x: pruned(x), iters=ctx.pick(30, 3))
        out.append(t0 / t1)
    return out


def check_compress(ctx: Ctx) -> list[Row]:
    from proftune.task import load_task

    name = ctx.pick("resnet18-synthetic", "digits-cnn")
    task = load_task(name)
    bs = ctx.pick(64, 32)
    torch.manual_seed(0)
    model = task.build_model({}).to(ctx.device).eval()
    with quiet():
        rep = proftune.compress(task, params={"batch_size": bs}, model=model, prune="structured", ratios=(0.5,),
                                round_to=ctx.pick(8, None), sensitivity=False, finetune_epochs=0,
                                max_accuracy_drop=1.0, goal="latency", device=str(ctx.device), db=ctx.db,
                                latency_rounds=ctx.pick(9, 2), threads=None)
    base = rep.baseline
    pruned = next(c for c in rep.candidates if c.method == "structured")
    ours = [base.latency_ms / pruned.latency_ms, base.latency_batch_ms / pruned.latency_batch_ms]
    example = _to(_first_batch(task, {}, 1)[0], ctx.device)
    ref = _torch_pruning_speedup(ctx, model, example, 0.5, (1, bs))
    rows = [Row(f"structured 0.5 {name}: latency speedup at batch {b}", o, r, "x", o >= 0.9 * r,
                ">= 90% of Torch-Pruning's") for b, o, r in zip((1, bs), ours, ref, strict=True)]

    with quiet():
        q = proftune.compress("digits-mlp", params={"hidden": 1024}, quantize="dynamic", baseline_epochs=2,
                              max_accuracy_drop=1.0, device=str(ctx.device), db=ctx.db, latency_rounds=ctx.pick(9, 2))
    cand = next(c for c in q.candidates if c.method == "dynamic")
    measured = {k: v for k, v in cand.backend_ms.items() if isinstance(v, float)}
    fastest = min(measured, key=measured.__getitem__) if measured else None
    skipped = "; ".join(f"{k}: {str(v)[:40]}" for k, v in cand.backend_ms.items() if not isinstance(v, float))
    rows.append(Row("INT8 dynamic: backend chosen = fastest measured", str(cand.quant_backend), str(fastest), "",
                    cand.quant_backend == fastest, skipped or "both measured"))
    rows.append(Row(f"INT8 dynamic latency vs fp32 (batch {cand.batch_size})", cand.latency_batch_ms,
                    q.baseline.latency_batch_ms, "ms", None, "reported"))
    return rows


CHECKS: dict[str, Callable[[Ctx], list[Row]]] = {
    "memory": check_memory,
    "profile": check_profile,
    "monitor": check_monitor,
    "precision": check_precision_and_flops,
    "compress": check_compress,
}


def run_checks(ctx: Ctx, names: Sequence[str], *, deadline: float) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        if time.perf_counter() > deadline:
            rows.append(Row(name, "skipped", None, passed=False, note="out of time (--max-minutes)"))
            continue
        t0 = time.perf_counter()
        print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)
        try:
            got = CHECKS[name](ctx)
        except Exception as exc:  # one broken check must not hide the others' results
            log.exception("check %s raised", name)
            got = [Row(name, "error", None, passed=False, note=f"{type(exc).__name__}: {exc}"[:120], error=True)]
        print(f"[gpu_check] {name} took {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        rows += got
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (the real check) or cpu (a dry run of every code path, tiny sizes)")
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    ap.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {', '.join(CHECKS)}")
    ap.add_argument("--max-minutes", type=float, default=7.5, help="skip the checks left after this")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in CHECKS]
    if bad:
        ap.error(f"--only {','.join(bad)} is unknown; valid: {', '.join(CHECKS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is False; nothing checked, nothing claimed.")
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    device = torch.device(args.device)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="proftune-gpu-check-") as d:
        ctx = Ctx(device=device, quick=args.quick, tmp=Path(d))
        if ctx.dry:
            torch.set_num_threads(1)
            what = "cpu dry-run: code paths at tiny sizes, no claim about GPU numbers"
        else:
            cap = ".".join(map(str, torch.cuda.get_device_capability()))
            what = f"{torch.cuda.get_device_name()} (compute capability {cap})"
        print(f"proftune {proftune.__version__}, torch {torch.__version__}, {what}", flush=True)
        rows = run_checks(ctx, names, deadline=started + args.max_minutes * 60)
    print(format_table(rows, dry=ctx.dry))
    code = exit_code(rows, dry=ctx.dry)
    print(f"{'ok' if code == 0 else 'FAILED'} in {time.perf_counter() - started:.0f}s")
    return code


if __name__ == "__main__":
    sys.exit(main())
