"""``proftune compress TASK``: prune, fine-tune, quantize and pick the best model within an accuracy budget."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from ..compress import compress as run_compress
from ..exceptions import ConfigError
from . import _options as opt
from ._common import execute_run, keep_whole, out_console, parse_params, task_arg
from ._progress import EpochProgress


def _floats(text: str, option: str) -> tuple[float, ...]:
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            values.append(float(part))
        except ValueError:
            raise ConfigError(f"{option} {text!r}: {part!r} is not a number; give e.g. {option} 0.3,0.5,0.7.") from None
    return tuple(values)


@opt.command
def compress(
    task: opt.TaskArg,
    data: opt.DataOpt = None,
    prune: Annotated[str | None, typer.Option(
        "--prune", help="unstructured or structured.", show_default=False)] = None,
    ratios: Annotated[str, typer.Option(
        "--ratios",
        help="Fractions removed, comma-separated (channels for structured, weights for unstructured).",
    )] = "0.3,0.5,0.7",
    importance: Annotated[str, typer.Option("--importance", help="l1, l2, taylor or bn.")] = "l2",
    global_pruning: Annotated[bool, typer.Option(
        "--global", help="Rank channels/weights across layers, not per layer.")] = False,
    ignore_layers: Annotated[list[str] | None, typer.Option(
        "--ignore-layers", help="Layer paths to keep whole (comma-separated or repeated).",
        show_default=False)] = None,
    quantize: Annotated[str | None, typer.Option(
        "--quantize", help="dynamic, static or qat (INT8).", show_default=False)] = None,
    half: Annotated[bool, typer.Option(
        "--half", help="Also try fp16 weights (half precision) of the float models.")] = False,
    method: Annotated[list[str] | None, opt.unset(
        "--method", help=f"A registered compression method of one's own: {opt.choices('compress_methods', last=', ')} "
                         "(proftune.compress.COMPRESS_METHODS; a plug-in's name too); repeatable.")] = None,
    quant_backend: Annotated[str, typer.Option(
        "--quant-backend",
        help="The quantization library: auto (each usable one measured, the fastest kept) or one of "
        f"{opt.choices('quant_libraries', last=', ')} "
        "(proftune.compress.QUANT_BACKEND_REGISTRY; a plug-in's name too).")] = "auto",
    compile_: Annotated[str | None, typer.Option(
        "--compile",
        help=f"Compile the float models too, comma-separated: {opt.choices('compilers', last=', ')} "
        "(proftune.compress.COMPILER_REGISTRY; a plug-in's name too).",
        show_default=False)] = None,
    target: Annotated[str | None, opt.shared(
        "--target", then=": cpu, gpu, mobile or edge, a deployment preset that picks the methods.",
        show_default=False)] = None,
    distill: Annotated[bool, typer.Option(
        "--distill", help="The original model teaches during fine-tuning (Hinton loss).")] = False,
    finetune_epochs: Annotated[int, typer.Option(
        "--finetune-epochs", help="Fine-tuning epochs after pruning (fit loop).")] = 1,
    max_accuracy_drop: opt.MaxDropOpt = 0.01,
    metric: Annotated[str, opt.shared("--metric", then=": the one the budget applies to.")] = "accuracy",
    goal: Annotated[str, opt.shared("--goal", then=": latency, size or macs.")] = "latency",
    out: Annotated[str | None, opt.shared_output(
        "--out", then=" the selected model (refuses to replace a file without --force).")] = None,
    plot: Annotated[str | None, opt.shared_output(
        "--plot", then=": a folder (metric vs params, metric vs latency).")] = None,
    model: Annotated[str | None, typer.Option(
        "--model",
        help="The trained original: torch.save(model.state_dict()) or a compress output; "
        "default: train the task first. Never modified.",
        show_default=False)] = None,
    trust_model: Annotated[bool, typer.Option(
        "--trust-model",
        help="Let --model be a whole pickled model (torch.save(model)): loading it runs code from the file, "
        "so only for files you trust.")] = False,
    round_to: Annotated[int | None, typer.Option(
        "--round-to", help="Keep channel counts multiples of this (structured).", show_default=False)] = None,
    force: Annotated[bool, opt.shared("--force", then="; never the --model file.")] = False,
    param: opt.ParamOpt = None,
    o: opt.RunOpts = opt.RUN,
    threads: opt.ThreadsOpt = None,
    report: opt.ReportOpt = None,
) -> None:
    """Compress TASK's model under an accuracy budget; every figure is measured on the model as saved."""

    def body() -> Any:
        params = parse_params(param)
        layers = tuple(name.strip() for item in (ignore_layers or []) for name in item.split(",") if name.strip())
        return run_compress(
            task_arg(task, data), params=params, model=model, trust_model=trust_model, db=o.db,
            callbacks=[EpochProgress(None)],
            prune=prune, ratios=_floats(ratios, "--ratios"), importance=importance,
            global_pruning=global_pruning, ignore_layers=layers, quantize=quantize, quant_backend=quant_backend,
            distill=distill,
            half=half, methods=tuple(method or ()),
            compile=tuple(n.strip() for n in (compile_ or "").split(",") if n.strip()), target=target,
            finetune_epochs=finetune_epochs, max_accuracy_drop=max_accuracy_drop, metric=metric,
            goal=goal, out=out, plot_dir=plot, round_to=round_to, force=force, seed=o.seed, device=o.device,
        )

    def render(report: Any) -> None:
        d = report.to_dict()
        table = Table(title=f"compress {d['task']}: {d['metric']} within -{d['max_accuracy_drop']}, "
                            f"goal {d['goal']} ({d['device']}, {d['threads']} thread(s))",
                      box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True,
                      caption="*: the selected candidate; front: on the Pareto front")
        numbers = (d["metric"], "drop", "params", "MMACs", "size KB", "ms @1", f"ms @{d['baseline']['batch_size']}")
        for col in ("method", "ratio", *numbers, "backend", "front"):
            table.add_column(col, justify="left" if col in ("method", "backend") else "right")
        selected = d["selected"]
        for c in [d["baseline"], *d["candidates"]]:
            mark = " *" if selected and c["method"] == selected["method"] and c["ratio"] == selected["ratio"] else ""
            table.add_row(
                c["method"].replace("+", " + ") + mark,  # wraps at the "+" where the table is narrow
                f"{c['ratio']:g}", f"{c['metric']:.4f}", f"{c['metric_drop']:+.4f}",
                f"{c['params']:,}", f"{c['macs'] / 1e6:.2f}", f"{c['size_bytes'] / 1024:.1f}",
                f"{c['latency_ms']:.3f}", f"{c['latency_batch_ms']:.3f}", c["quant_backend"] or "",
                "yes" if c["pareto"] else "")
        keep_whole(table, "ratio", *numbers, "front")
        out_console.print(table)
        for line in d["plan"]:
            out_console.print(f"plan: {line}", highlight=False)
        for note in d["notes"]:
            out_console.print(f"note: {note}", highlight=False)
        if selected is not None:
            out_console.print(f"selected: {selected['method']} ratio {selected['ratio']:g}", highlight=False)
        for c in d["candidates"]:
            if c.get("eager_max_abs_diff") is not None:
                out_console.print(f"{c['method']} ratio {c['ratio']:g}: max |output - eager| over the validation "
                                  f"data {c['eager_max_abs_diff']:.2e}; {'; '.join(c['notes'])}", highlight=False)
        if d["output"]:
            out_console.print(f"saved: {d['output']}  load: {d['load']}", highlight=False)
        for p in d["plots"]:
            out_console.print(f"plot: {p}", highlight=False)
        out_console.print(f"run {d['run_id']} recorded", highlight=False)

    execute_run(body, o, opt.ReportOpts(report, force), render=render, threads=threads, written=[out, plot])
