"""``proftune predict TASK --batch-size B [--target h200]``: memory and time of a training step,
predicted with fake tensors (nothing allocated, no step run)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .._units import format_bytes
from ..exceptions import ConfigError
from ..predict import (
    CHECKPOINTING,
    DEVICES,
    OFFLOAD,
    STRATEGIES,
    ParallelPlan,
    ParallelPrediction,
    PredictConfig,
    PredictResult,
    predict,
)
from ..track import Store
from . import _options as opt
from ._common import execute, out_console, parse_params, with_report

TargetOpt = Annotated[str, opt.shared(
    "--target",
    then=(", to predict for (not --device, which says where proftune itself runs): "
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
    if r.plan is not None:
        _render_plan(r.plan)
        return
    _render_single(r)
    if r.parallel is not None:
        _render_parallel(r.parallel)


def _render_single(r: PredictResult) -> None:
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
    phases = (f"forward {ms(step.forward_ms)} ms, backward {ms(step.backward_ms)} ms, "
              f"optimizer {ms(step.optimizer_ms)} ms")
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


def _render_parallel(p: ParallelPrediction) -> None:
    title = STRATEGIES[p.strategy].title
    out_console.print(
        f"[bold]{title}[/] on {p.gpus} GPUs ({p.nodes} node{'s' if p.nodes > 1 else ''}), checkpointing "
        f"{p.activation_checkpointing}, offload {p.offload}: per-GPU batch {p.batch_size} x {p.micro_batches} "
        f"micro-batches = global batch {p.global_batch}", highlight=False)
    t = Table(title="one GPU's memory at the step's peak (predicted)")
    t.add_column("part")
    t.add_column("bytes", justify="right")
    for kind, value in sorted(p.memory.items(), key=lambda kv: -kv[1]):
        t.add_row(kind, format_bytes(value))
    t.add_row("[bold]peak[/]", f"[bold]{format_bytes(p.peak_bytes)}[/]")
    out_console.print(t)
    ms = p.model_states
    out_console.print(
        f"peak in {p.peak_phase}; model states per GPU: parameters {format_bytes(ms['params'])}, gradients "
        f"{format_bytes(ms['grads'])}, optimizer state {format_bytes(ms['optimizer_state'])}"
        + (f", on the host {format_bytes(ms['host'])}" if ms.get("host") else "")
        + f"; activations {format_bytes(p.activations_bytes)} (without checkpointing "
        f"{format_bytes(p.activations_without_checkpointing_bytes)}); communication buffers "
        f"{format_bytes(p.comm_buffers_bytes)}", highlight=False)
    ds = p.deepspeed
    out_console.print(
        f"DeepSpeed's terms (Ψ={p.n_params:,} params, L={p.largest_layer_params:,}, fp16 + Adam): "
        f"{ds['formula']} = GPU {format_bytes(ds['gpu_bytes'])}, CPU {format_bytes(ds['cpu_bytes'])} "
        f"({ds['source']})", highlight=False)
    st = p.step
    if st.get("time_ms") is not None:
        link = p.link
        bw = f"{bytes_s / 1e9:.3g} GB/s" if (bytes_s := link.get("bytes_s")) else "-"
        rate = f", {p.samples_per_s:.4g} samples/s" if p.samples_per_s else ""
        rate += f", {p.tokens_per_s:.4g} tokens/s" if p.tokens_per_s else ""
        out_console.print(
            f"step (estimate) {st['time_ms']:.4g} ms: compute {st['compute_ms']:.4g} ms, collectives "
            f"{st['comm_ms']:.4g} ms over {link['name']} {bw} ({st['exposed_comm_ms']:.4g} ms not hidden), "
            f"offload {st['offload_ms']:.4g} ms{rate}; link: {link.get('source') or '-'}", highlight=False)
    if p.max_batch_size is not None:
        out_console.print(f"largest per-GPU batch that fits {format_bytes(p.device_memory_bytes)}: "
                          f"[bold]{p.max_batch_size}[/]", highlight=False)


def _render_plan(plan: ParallelPlan) -> None:
    tokens = f" x {plan.tokens_per_sample} tokens" if plan.tokens_per_sample else ""
    t = Table(title=f"plan: {plan.gpus} GPUs, global batch {plan.global_batch}{tokens} "
                    f"({plan.traces} fake steps, {plan.seconds:.1f} s)")
    for col in ("#", "strategy", "checkpointing", "offload", "per-GPU batch", "accumulation", "peak/GPU",
                "step ms", "samples/s", "tokens/s"):
        t.add_column(col, justify="left" if col in ("strategy", "checkpointing", "offload") else "right")
    for i, o in enumerate(plan.options[:15], 1):
        step = o.step.get("time_ms")
        t.add_row(str(i), STRATEGIES[o.strategy].title, o.activation_checkpointing, o.offload, str(o.batch_size),
                  str(o.micro_batches), format_bytes(o.peak_bytes), "-" if step is None else f"{step:.4g}",
                  "-" if o.samples_per_s is None else f"{o.samples_per_s:.4g}",
                  "-" if o.tokens_per_s is None else f"{o.tokens_per_s:.4g}")
    out_console.print(t)
    if len(plan.options) > 15:
        out_console.print(f"... and {len(plan.options) - 15} more options that fit (--json lists them all)")
    for r in plan.rejected:
        out_console.print(f"[yellow]{r['reason']}[/] (checkpointing {r['activation_checkpointing']}, "
                          f"offload {r['offload']})", highlight=False)


@opt.command
def predict_command(
    task: opt.TaskArg,
    batch_size: Annotated[int | None, opt.shared(
        "--batch-size", "-b", then=" to predict (per GPU with --gpus); not with --plan.", show_default=False)] = None,
    target: TargetOpt = "auto",
    device_memory: MemoryOpt = None,
    peak_tflops: TflopsOpt = None,
    bandwidth: BandwidthOpt = None,
    precision: Annotated[str | None, typer.Option(
        "--precision", help="fp32, bf16 or fp16 (autocast, fp32 weights); default: the task's.",
        show_default=False)] = None,
    optimizer: Annotated[str | None, typer.Option(
        "--optimizer", help="adamw, adam or sgd; default: the task's.", show_default=False)] = None,
    param: opt.ParamOpt = None,
    calibrate: Annotated[int | None, typer.Option(
        "--calibrate", help="Also run a few real steps at this (small) batch on this machine's CPU and report "
                            "the prediction's error there.", show_default=False)] = None,
    gpus: Annotated[int | None, typer.Option(
        "--gpus", help="Data-parallel GPUs in all: predict one GPU of them.", show_default=False)] = None,
    nodes: Annotated[int | None, typer.Option(
        "--nodes", help="Nodes the --gpus are spread over (collectives cross the network).",
        show_default=False)] = None,
    strategy: Annotated[str | None, typer.Option(
        "--strategy", help=f"Data-parallel strategy: {', '.join(STRATEGIES)} (default with --gpus: ddp).",
        show_default=False)] = None,
    activation_checkpointing: Annotated[str, typer.Option(
        "--activation-checkpointing", help=f"Recompute the blocks' activations: {', '.join(CHECKPOINTING)}.")] = "none",
    offload: Annotated[str, typer.Option(
        "--offload", help=f"Keep on the host: {', '.join(OFFLOAD)} (zero1/2: optimizer; zero3: both; "
                          "fsdp: params).")] = "none",
    plan: Annotated[bool, typer.Option(
        "--plan", help="Rank every strategy x checkpointing x offload x per-GPU batch that fits --global-batch "
                       "on --gpus, by predicted throughput.")] = False,
    global_batch: Annotated[int | None, typer.Option(
        "--global-batch", help="Samples per optimizer step over all GPUs (with --plan; for a sequence model "
                               "each sample is the task's sequence).", show_default=False)] = None,
    link: Annotated[str, typer.Option(
        "--link", help="The link the collectives are priced with: auto (with --target cpu and one "
                       "--strategy, the step's own collectives replayed between --gpus CPU ranks here as they "
                       "step; with --plan a sweep between them; else the target's datasheet figure), table, or "
                       "measure (a short "
                       "all-reduce/all-gather/reduce-scatter sweep between --gpus ranks of this machine).")] = "auto",
    device: opt.DeviceOpt = "auto",
    db: opt.DbOpt = None,
    json_out: opt.JsonOpt = False,
    debug: opt.DebugOpt = False,
    r: opt.ReportOpts = opt.REPORT,
) -> None:
    """Predict memory (params, grads, optimizer state, activations per layer, the step's peak and
    where) and time (roofline estimate per layer) of one training step on a target device, from a
    fake-tensor trace: nothing is allocated and no step runs. Exits 2 when the batch does not fit."""

    def body() -> PredictResult:
        if batch_size is None and not plan:
            raise ConfigError("--batch-size is required (or --plan with --gpus and --global-batch).")
        if batch_size is not None and plan:
            raise ConfigError("--plan chooses the per-GPU batch: leave --batch-size out.")
        config = PredictConfig(batch_size=batch_size or 0, target=target, device_memory=device_memory,
                               peak_tflops=peak_tflops, bandwidth=bandwidth, precision=precision,
                               optimizer=optimizer, calibrate=calibrate, device=device, gpus=gpus, nodes=nodes,
                               strategy=strategy, activation_checkpointing=activation_checkpointing,
                               offload=offload, plan=plan, global_batch=global_batch, link=link)
        result = predict(task, parse_params(param), config, store=Store(db))
        if result.fits is False and result.parallel is None and result.plan is None:
            best = result.max_batch_size
            raise ConfigError(
                f"batch_size={batch_size} does not fit {result.target['name']}'s "
                f"{format_bytes(result.device_memory_bytes)}: predicted peak {format_bytes(result.memory.peak_bytes)} "
                f"(parameters, gradients and optimizer state alone {format_bytes(result.memory.static_bytes)}); "
                + (f"the largest batch that fits is {best}." if best else
                   "no batch size fits this memory.")
            )
        return result

    execute(with_report(body, r.report, db, force=r.force), json_out=json_out, debug=debug, render=_render)
