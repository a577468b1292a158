"""``proftune predict TASK --batch-size B [--target h200]``: memory and time of a training step,
predicted with fake tensors (nothing allocated, no step run)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .._units import format_bytes
from ..exceptions import ConfigError
from ..predict import DEVICES, PredictConfig, PredictResult, predict
from ..track import Store
from ._common import (
    DbOpt,
    DebugOpt,
    DeviceOpt,
    ForceOpt,
    JsonOpt,
    ParamOpt,
    ReportOpt,
    TaskArg,
    execute,
    out_console,
    parse_params,
    with_report,
)

TargetOpt = Annotated[str, typer.Option(
    "--target",
    help=("The device to predict for (not --device, which says where proftune itself runs): "
          f"{', '.join(DEVICES)}, cpu (this machine) or auto (this machine's GPU, else its CPU; with only "
          "--device-memory/--peak-tflops/--bandwidth: a device of those numbers)."))]
MemoryOpt = Annotated[str | None, typer.Option(
    "--device-memory", help="The target's memory (80GiB, 24GB, bytes); overrides the table's.",
    show_default=False)]
TflopsOpt = Annotated[float | None, typer.Option(
    "--peak-tflops", help="The target's peak TFLOP/s (for a device not in the table).", show_default=False)]
BandwidthOpt = Annotated[str | None, typer.Option(
    "--bandwidth", help="The target's memory bandwidth per second (3.35TB, bytes).", show_default=False)]


def _render(r: PredictResult) -> None:
    t, m = r.target, r.memory
    run = f"run {r.run_id}: " if r.run_id is not None else ""
    accumulation = int((r.config.get("params") or {}).get("grad_accumulation") or 1)
    micro = f" x {accumulation} micro-batches per step" if accumulation > 1 else ""
    out_console.print(
        f"{run}[bold]{r.task}[/] batch {r.batch_size}{micro}, {r.precision}, {r.optimizer} on "
        f"[bold]{t['name']}[/] ({format_bytes(t['memory_bytes'])}): predicted from one fake-tensor step "
        f"({r.traces} traced, {r.real_steps} real steps, {r.trace_s:.1f} s)", highlight=False)
    mem = Table(title="memory (predicted)")
    for col in ("part", "bytes"):
        mem.add_column(col, justify="right" if col == "bytes" else "left")
    for label, value in (("parameters", m.params_bytes), ("buffers", m.buffers_bytes), ("gradients", m.grads_bytes),
                         ("optimizer state", m.optimizer_bytes), ("batch", m.batch_bytes),
                         ("activations saved for backward", m.activations_bytes), ("step peak", m.peak_bytes)):
        mem.add_row(label, format_bytes(value))
    out_console.print(mem)
    peak = r.peak
    where = peak.layer or ("(optimizer)" if peak.phase == "optimizer" else "(outside layers)")
    out_console.print(f"peak in {peak.phase} at {where} ({peak.op}): "
                      + ", ".join(f"{k} {format_bytes(v)}" for k, v in peak.breakdown.items()),
                      highlight=False)
    layers = Table(title=f"layers ({r.note})")
    for col in ("layer", "type", "params", "fwd GFLOP", "bwd GFLOP", "activations", "fwd ms", "bwd ms", "bound"):
        layers.add_column(col, justify="left" if col in ("layer", "type", "bound") else "right")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3g}"

    for lay in sorted(r.layers, key=lambda x: -((x.forward_ms or 0) + (x.backward_ms or 0)))[:20]:
        layers.add_row(lay.name or "(model)", lay.type, str(lay.params), f"{lay.flops / 1e9:.3g}",
                       f"{lay.backward_flops / 1e9:.3g}", format_bytes(lay.activation_bytes),
                       ms(lay.forward_ms), ms(lay.backward_ms), lay.bound)
    out_console.print(layers)
    step = r.step
    phases = f"forward {ms(step.forward_ms)} ms, backward {ms(step.backward_ms)} ms, optimizer {ms(step.optimizer_ms)} ms"
    out_console.print(f"step time (estimate) {ms(step.time_ms)} ms ({phases}); bound: {r.bound}", highlight=False)
    if r.max_batch_size is not None:
        out_console.print(f"largest batch that fits {format_bytes(r.device_memory_bytes)}: "
                          f"[bold]{r.max_batch_size}[/] (batch-size's memory model and margin, on fake steps)")
    c = r.calibration
    if c:
        out_console.print(
            f"calibration on this {c['device']} at batch {c['batch_size']} ({c['real_steps']} real steps): peak "
            f"predicted {format_bytes(c['predicted_peak_bytes'])} vs measured {format_bytes(c['measured_peak_bytes'])} "
            f"({c['peak_error']:+.1%}); step {c['predicted_step_ms']:.3g} ms (roofline) vs "
            f"{c['measured_step_ms']:.3g} ms ({c['time_error']:+.0%})", highlight=False)
    if r.uncounted_ops:
        out_console.print("[yellow]ops not counted (no FLOP formula; not in FLOPs or time):[/] " + "; ".join(
            f"{u['op']} x{u['calls']} {u['shapes'][:2]}" for u in r.uncounted_ops), highlight=False)


def predict_command(
    task: TaskArg,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Batch size to predict.")],
    target: TargetOpt = "auto",
    device_memory: MemoryOpt = None,
    peak_tflops: TflopsOpt = None,
    bandwidth: BandwidthOpt = None,
    precision: Annotated[str | None, typer.Option(
        "--precision", help="fp32, bf16 or fp16 (autocast, fp32 weights); default: the task's.",
        show_default=False)] = None,
    optimizer: Annotated[str | None, typer.Option(
        "--optimizer", help="adamw, adam or sgd; default: the task's.", show_default=False)] = None,
    param: ParamOpt = None,
    calibrate: Annotated[int | None, typer.Option(
        "--calibrate", help="Also run a few real steps at this (small) batch on this machine's CPU and report "
                            "the prediction's error there.", show_default=False)] = None,
    device: DeviceOpt = "auto",
    db: DbOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
    report: ReportOpt = None,
    force: ForceOpt = False,
) -> None:
    """Predict memory (params, grads, optimizer state, activations per layer, the step's peak and
    where) and time (roofline estimate per layer) of one training step on a target device, from a
    fake-tensor trace: nothing is allocated and no step runs. Exits 2 when the batch does not fit."""

    def body() -> PredictResult:
        config = PredictConfig(batch_size=batch_size, target=target, device_memory=device_memory,
                               peak_tflops=peak_tflops, bandwidth=bandwidth, precision=precision,
                               optimizer=optimizer, calibrate=calibrate, device=device)
        result = predict(task, parse_params(param), config, store=Store(db))
        if result.fits is False:
            best = result.max_batch_size
            raise ConfigError(
                f"batch_size={batch_size} does not fit {result.target['name']}'s "
                f"{format_bytes(result.device_memory_bytes)}: predicted peak {format_bytes(result.memory.peak_bytes)} "
                f"(parameters, gradients and optimizer state alone {format_bytes(result.memory.static_bytes)}); "
                + (f"the largest batch that fits is {best}." if best else
                   "no batch size fits this memory.")
            )
        return result

    execute(with_report(body, report, db, force=force), json_out=json_out, debug=debug, render=_render)
