"""``proftune predict TASK --batch-size B [--target h200]``: memory and time of a training step,
predicted with fake tensors (nothing allocated, no step run)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ..exceptions import ConfigError
from ..recommend import DEVICES, format_bytes, predict
from ._common import DebugOpt, JsonOpt, ParamOpt, TaskArg, execute, out_console, parse_params

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


def _render(d: dict[str, Any]) -> None:
    t = d["target"]
    out_console.print(
        f"[bold]{d['task']}[/] batch {d['batch_size']}, {d['precision']}, {d['optimizer']} on "
        f"[bold]{t['name']}[/] ({format_bytes(t['memory_bytes'])}): predicted from one fake-tensor step "
        f"({d['traces']} traced, {d['real_steps']} real steps, {d['trace_s']:.1f} s)", highlight=False)
    mem = Table(title="memory (predicted)")
    for col in ("part", "bytes"):
        mem.add_column(col, justify="right" if col == "bytes" else "left")
    for label, key in (("parameters", "params_bytes"), ("buffers", "buffers_bytes"), ("gradients", "grads_bytes"),
                       ("optimizer state", "optimizer_bytes"), ("batch", "batch_bytes"),
                       ("activations saved for backward", "activations_bytes"), ("step peak", "peak_bytes")):
        mem.add_row(label, format_bytes(d[key]))
    out_console.print(mem)
    where = d["peak_layer"] or ("(optimizer)" if d["peak_phase"] == "optimizer" else "(outside layers)")
    out_console.print(f"peak in {d['peak_phase']} at {where} ({d['peak_op']}): "
                      + ", ".join(f"{k} {format_bytes(v)}" for k, v in d["peak_breakdown"].items()),
                      highlight=False)
    layers = Table(title=f"layers ({d['note']})")
    for col in ("layer", "type", "params", "fwd GFLOP", "bwd GFLOP", "activations", "fwd ms", "bwd ms", "bound"):
        layers.add_column(col, justify="left" if col in ("layer", "type", "bound") else "right")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3g}"

    for lay in sorted(d["layers"], key=lambda x: -((x["forward_ms"] or 0) + (x["backward_ms"] or 0)))[:20]:
        layers.add_row(lay["name"] or "(model)", lay["type"], str(lay["params"]), f"{lay['forward_flops'] / 1e9:.3g}",
                       f"{lay['backward_flops'] / 1e9:.3g}", format_bytes(lay["activation_bytes"]),
                       ms(lay["forward_ms"]), ms(lay["backward_ms"]), lay["bound"])
    out_console.print(layers)
    phases = ", ".join(f"{k} {ms(v)} ms" for k, v in d["phase_ms"].items())
    out_console.print(f"step time (estimate) {ms(d['step_time_ms'])} ms ({phases}); bound: {d['bound']}",
                      highlight=False)
    if d["max_batch_size"] is not None:
        out_console.print(f"largest batch that fits {format_bytes(d['device_memory_bytes'])}: "
                          f"[bold]{d['max_batch_size']}[/] (batch-size's memory model and margin, on fake steps)")
    c = d.get("calibration")
    if c:
        out_console.print(
            f"calibration on this CPU at batch {c['batch_size']} ({c['real_steps']} real steps): peak predicted "
            f"{format_bytes(c['predicted_peak_bytes'])} vs measured {format_bytes(c['measured_peak_bytes'])} "
            f"({c['peak_error']:+.1%}); step {c['predicted_step_ms']:.3g} ms (roofline) vs "
            f"{c['measured_step_ms']:.3g} ms ({c['time_error']:+.0%})", highlight=False)
    if d["uncounted_ops"]:
        out_console.print("[yellow]ops not counted (no FLOP formula; not in FLOPs or time):[/] " + "; ".join(
            f"{u['op']} x{u['calls']} {u['shapes'][:2]}" for u in d["uncounted_ops"]), highlight=False)


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
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Predict memory (params, grads, optimizer state, activations per layer, the step's peak and
    where) and time (roofline estimate per layer) of one training step on a target device, from a
    fake-tensor trace: nothing is allocated and no step runs. Exits 2 when the batch does not fit."""

    def body() -> dict[str, Any]:
        result = predict(task, parse_params(param), batch_size=batch_size, target=target,
                         device_memory=device_memory, peak_tflops=peak_tflops, bandwidth=bandwidth,
                         precision=precision, optimizer=optimizer, calibrate=calibrate)
        d = result.to_dict()
        if result.fits is False:
            best = result.max_batch_size
            raise ConfigError(
                f"batch_size={batch_size} does not fit {result.target['name']}'s "
                f"{format_bytes(result.device_memory_bytes)}: predicted peak {format_bytes(result.peak_bytes)} "
                f"(parameters, gradients and optimizer state alone {format_bytes(result.static_bytes)}); "
                + (f"the largest batch that fits is {best}." if best else
                   "no batch size fits this memory.")
            )
        return d

    execute(body, json_out=json_out, debug=debug, render=_render)
