"""``proftune profile TASK``: measure a model and its step; ``--compare A B`` diffs two profiles."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from .._paths import OutputPath
from .._units import format_bytes
from ..exceptions import ConfigError
from ..profile import Profile, RanksResult, compare_profiles, load_spread, profile
from ..track import Store
from . import _options as opt
from ._common import execute, keep_whole, out_console, parse_params, task_arg, with_report


def _num(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= div:
            return f"{value / div:.2f}{unit}"
    return f"{value:.0f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _spread(lay: Any) -> str:
    """The middle half of a layer's timed steps against its fastest (``1.0-1.3x``)."""
    return load_spread(lay.time_share, lay.time_share_q1, lay.time_share_q3) or "-"


def render_profile(p: Profile, top: int, out: Path | None) -> None:
    title = f"{p.task or 'model'} · {p.mode} · batch {p.batch_size} · {p.device}"
    layers = sorted(p.layers, key=lambda lay: (lay.time_share or 0.0, lay.macs), reverse=True)[:top]
    table = Table(title=f"top {len(layers)} layers by share of forward+backward time — {title}",
                  caption="act: bytes saved for backward; GF/s: forward GFLOP/s; time: share of forward+"
                          "backward at its fastest step, mid½: its steps' middle half against it; par, MAC: "
                          "share of the model's params and MACs", box=box.SIMPLE_HEAD, show_edge=False,
                  collapse_padding=True)
    numbers = ("params", "MACs", "fwd ms", "bwd ms", "act", "GF/s", "time", "mid½", "par", "MAC")
    for col in ("layer", "type", *numbers):
        table.add_column(col, justify="left" if col in ("layer", "type") else "right", overflow="fold")
    for lay in layers:
        table.add_row(lay.name or "(model)", lay.type, _num(lay.params), _num(lay.macs), _ms(lay.forward_ms),
                      _ms(lay.backward_ms), format_bytes(lay.activation_bytes),
                      "-" if lay.gflops_per_s is None else f"{lay.gflops_per_s:.1f}",
                      _pct(lay.time_share), _spread(lay), _pct(lay.params_share), _pct(lay.macs_share))
    keep_whole(table, *numbers)  # the layer's name wraps; its numbers are never cut
    out_console.print(table)

    s, mem = p.step, p.memory
    summary = Table(title="step and memory", show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    summary.add_row("params (total / trainable)", f"{p.params.total:,} / {p.params.trainable:,}")
    summary.add_row("MACs / FLOPs (forward)", f"{_num(p.macs)} / {_num(p.flops)}")
    if p.backward_flops:
        summary.add_row("FLOPs (backward)", _num(p.backward_flops))
    summary.add_row("step time", f"{s.time_ms:.2f} ms")
    summary.add_row("  data / forward / backward",
                    f"{s.data_ms:.2f} / {s.forward_ms:.2f} / {s.backward_ms:.2f} ms")
    summary.add_row("  optimizer / other", f"{s.optimizer_ms:.2f} / {s.other_ms:.2f} ms")
    if s.outside_layers_ms:
        # measured on the layer-timed (hooked, slower) steps: a share of theirs, not ms of the step above
        timed = sum((lay.forward_ms or 0.0) + (lay.backward_ms or 0.0) for lay in p.layers) + s.outside_layers_ms
        summary.add_row("  of forward+backward, in no layer (loss, glue)", f"{s.outside_layers_ms / timed:.0%}")
    summary.add_row("throughput", f"{s.throughput:,.0f} samples/s" if s.throughput >= 100
                    else f"{s.throughput:.3g} samples/s")
    summary.add_row("params / grads / optimizer state",
                    f"{format_bytes(mem.params_bytes)} / {format_bytes(mem.grads_bytes)} / "
                    f"{format_bytes(mem.optimizer_bytes)}")
    summary.add_row("activations saved for backward", format_bytes(mem.activations_bytes))
    summary.add_row("peak of a step", format_bytes(mem.peak_bytes))
    if p.grad.norm is not None:
        var = "-" if p.grad.var is None else f"{p.grad.var:.3g}"
        ratio = "-" if p.grad.update_ratio is None else f"{p.grad.update_ratio:.3g}"
        summary.add_row("grad norm / var / update ratio", f"{p.grad.norm:.3g} / {var} / {ratio}")
    if p.comm is not None:
        summary.add_row("all-reduce per step",
                        f"{format_bytes(p.comm.allreduce_bytes)} in {p.comm.allreduce_ms:.2f} ms ({p.comm.share:.1%})")
    out_console.print(summary)
    for b in p.bottlenecks[:3]:
        out_console.print(f"• {b['finding']}", highlight=False)
    run_id = p.config.get("run_id")
    tail = [f"run {run_id}"] if run_id is not None else []
    if out is not None:
        tail.append(f"saved {out}")
    if p.config.get("trace"):
        tail.append(f"trace {p.config['trace']}")
    if tail:
        out_console.print(" · ".join(tail), style="dim")


def _render_compare(d: dict[str, Any], top: int) -> None:
    totals = Table(title="profile B vs A")
    for col in ("metric", "A", "B", "B / A"):
        totals.add_column(col, justify="left" if col == "metric" else "right")
    for name, v in d["totals"].items():
        fmt = format_bytes if "bytes" in name else (_num if name in ("params", "macs", "flops") else
                                              (lambda x: "-" if x is None else f"{x:.3f}"))
        ratio = "-" if v["ratio"] is None else f"{v['ratio']:.3f}"
        totals.add_row(name, fmt(v["a"]), fmt(v["b"]), ratio)
    out_console.print(totals)
    table = Table(title="per layer (A → B)")
    for col in ("layer", "type", "status", "params", "MACs", "fwd ms", "bwd ms"):
        table.add_column(col, justify="left" if col in ("layer", "type", "status") else "right")

    def pair(v: dict[str, Any], fmt: Any) -> str:
        if v["a"] == v["b"]:
            return str(fmt(v["a"]))
        return f"{fmt(v['a'])} → {fmt(v['b'])}"

    changed = [row for row in d["layers"] if row["status"] != "both" or any(
        row[k]["a"] != row[k]["b"] for k in ("params", "macs"))]
    rest = [row for row in d["layers"] if row not in changed]
    for row in (changed + rest)[:top]:
        table.add_row(row["name"] or "(model)", row["type"], row["status"], pair(row["params"], _num),
                      pair(row["macs"], _num), pair(row["forward_ms"], _ms), pair(row["backward_ms"], _ms))
    out_console.print(table)


@opt.command
def profile_command(
    task: opt.OptionalTaskArg = None,
    batch_size: opt.BatchSizeOpt = None,
    steps: Annotated[int, opt.shared("--steps", then=" (after the warm-up).")] = 3,
    warmup: Annotated[int, typer.Option("--warmup", help="Unmeasured warm-up steps.")] = 1,
    inference: Annotated[bool, typer.Option(
        "--inference", help="Profile the forward pass only (eval, no_grad).")] = False,
    detail: Annotated[str, typer.Option("--detail", help="full (per layer) or step (step, memory, counts).")] = "full",
    out: Annotated[Path | None, opt.shared_output("--out", then=" the profile as JSON.")] = None,
    trace: Annotated[Path | None, opt.output("--trace", help="Write a Chrome/Perfetto trace of one step.")] = None,
    compare: Annotated[tuple[str, str] | None, opt.unset(
        "--compare", help="Compare two saved profiles: --compare A.json B.json.")] = None,
    top: Annotated[int, typer.Option("--top", help="Layers to show.")] = 10,
    structure: Annotated[bool, typer.Option(
        "--structure", help="Also show the module tree: each module's input/output shapes, params and "
                            "MACs (as torchinfo.summary prints it).")] = False,
    depth: Annotated[int, typer.Option("--depth", min=0, help="Module depth the --structure table shows (the JSON "
                                                       "holds every module).")] = 3,
    onnx: Annotated[Path | None, opt.output(
        "--onnx", help="Also write the model (as built from the seed, before the profile's steps) as an ONNX "
                       "file for Netron, checked in ONNX Runtime against torch (needs proftune[compile]).")] = None,
    ddp: Annotated[int | None, opt.shared("--ddp", then=" and find the straggler.", show_default=False)] = None,
    param: opt.ParamOpt = None,
    data: opt.DataOpt = None,
    o: opt.RunOpts = opt.RUN,
    r: opt.ReportOpts = opt.REPORT,
) -> None:
    """Profile TASK: params, MACs/FLOPs, memory, time per layer, statistics; record it as a Run."""

    def body() -> Any:
        if compare is not None and any(compare):
            if task is not None:
                raise ConfigError(f"give either TASK ({task!r}) or --compare A.json B.json, not both.")
            a, b = (Profile.load(path) for path in compare)
            return {"compare": list(compare), **compare_profiles(a, b)}
        if task is None:
            raise ConfigError("missing TASK (e.g. `proftune profile digits-cnn`), or use --compare A.json B.json.")
        params = parse_params(param)
        if ddp is not None:
            return _ranks(task, ddp, extras=structure or onnx is not None, params=params, batch_size=batch_size,
                          steps=steps, warmup=warmup, device=o.device, seed=o.seed)
        store = Store(o.db)
        p = profile(task_arg(task, data), params=params, batch_size=batch_size, steps=steps, warmup=warmup,
                    inference=inference, device=o.device, seed=o.seed, detail=detail, trace=trace, store=store)
        if out is not None:
            p.save(out)
        if not structure and onnx is None:
            return p
        return _with_extras(p, task_arg(task, data), params=params, batch_size=p.batch_size, seed=o.seed,
                            device=p.device, structure=structure, onnx=onnx, store=store, out=out)

    def render(result: Any) -> None:
        if isinstance(result, Profile):
            render_profile(result, top, out)
        elif isinstance(result, _Extras):
            render_profile(result.profile, top, out)
            if result.structure is not None:
                _render_structure(result.structure, depth)
            if result.onnx is not None:
                _render_onnx(result.onnx)
        elif isinstance(result, RanksResult):
            _render_ranks(result)
        else:
            _render_compare(result, top)

    def checked() -> Any:  # --onnx is checked with the other outputs, before any work
        return with_report(body, r.report, o.db, force=r.force, outputs=[
            OutputPath("--out", out), OutputPath("--trace", trace), OutputPath("--onnx", onnx)])()

    execute(checked, json_out=o.json_out, debug=o.debug, render=render)


class _Extras:
    """A profile with the structure table and the ONNX export asked beside it; JSON: the profile's
    object with ``structure`` and ``onnx`` added."""

    def __init__(self, profile: Profile, structure: Any, onnx: Any) -> None:
        self.profile, self.structure, self.onnx = profile, structure, onnx

    def to_dict(self) -> dict[str, Any]:
        d = self.profile.to_dict()
        if self.structure is not None:
            d["structure"] = self.structure.to_dict()
        if self.onnx is not None:
            d["onnx"] = self.onnx.to_dict()
        return d

    @property
    def config(self) -> Mapping[str, object]:  # what the report reads to find the run
        return self.profile.config


def _with_extras(p: Profile, task: Any, *, params: dict[str, Any], batch_size: int, seed: int, device: str,
                 structure: bool, onnx: Path | None, store: Any = None, out: Path | None = None) -> _Extras:
    from ..compress import export_onnx
    from ..profile import model_and_input, model_structure

    model, example = model_and_input(task, params=params, batch_size=batch_size or None, seed=seed, device=device)
    s = model_structure(model, example) if structure else None
    exported = export_onnx(model, example, onnx, force=True) if onnx is not None else None  # checked up front
    if s is not None:  # the profile holds its structure: in --out's file, the stored Run and its report
        p = dataclasses.replace(p, structure=s.to_dict())
        if out is not None:
            p.save(out)
        run_id = p.config.get("run_id")
        if store is not None and isinstance(run_id, int):
            store.update_run(run_id, result=p.to_dict())
    return _Extras(p, s, exported)


def _shape(shapes: list[Any]) -> str:
    if not shapes:
        return "-"
    text = ", ".join(str(list(s)) if isinstance(s, (list, tuple)) else str(s) for s in shapes)
    return text if len(text) <= 40 else text[:39] + "…"


def _render_structure(s: Any, depth: int) -> None:
    rows = [r for r in s.rows if r.depth <= depth]
    table = Table(title=f"model structure · batch {s.batch_size} · depth <= {depth} of {max(r.depth for r in s.rows)}",
                  caption="params: the module's and those under it; MACs: forward multiply-accumulates of "
                          "its subtree (matmuls inside it included); shapes: its first call",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for col in ("module", "type", "input", "output", "params", "MACs"):
        table.add_column(col, justify="left" if col in ("module", "type", "input", "output") else "right",
                         overflow="fold")
    for r in rows:
        label = "(model)" if not r.name else "  " * (r.depth - 1) + r.name.rsplit(".", 1)[-1]
        table.add_row(label, r.type, _shape(r.input_shapes), _shape(r.output_shapes),
                      f"{r.params:,}" if r.params else "-", _num(r.macs) if r.macs else "-")
    keep_whole(table, "module", "params", "MACs")  # the shapes wrap; names and numbers are never cut
    out_console.print(table)
    out_console.print(f"total params {s.params_total:,} (trainable {s.params_trainable:,}) · "
                      f"MACs {_num(s.macs)} · FLOPs {_num(s.flops)}", highlight=False)


def _render_onnx(o: Any) -> None:
    line = f"onnx: {o.path} ({format_bytes(o.size_bytes)}; open it in Netron)"
    if o.checked:
        verdict = "matches torch" if o.matches else "DOES NOT match torch"
        line += (f" · ONNX Runtime {verdict}: max |diff| {o.max_abs_diff:.3g} "
                 f"(atol {o.atol:g}, rtol {o.rtol:g})")
    out_console.print(line, highlight=False)


def _ranks(task: str, nprocs: int, *, device: str, extras: bool, **kw: Any) -> RanksResult:
    from ..profile import profile_ranks

    if extras:
        raise ConfigError("--structure and --onnx describe one model: run them without --ddp.")

    dev = ("cuda" if device == "cuda" or (device == "auto" and __import__("torch").cuda.device_count() >= nprocs)
           else "cpu")
    return profile_ranks(task, nprocs=nprocs, device=dev, **kw)


def _render_ranks(d: RanksResult) -> None:
    table = Table(title=f"{d.task} · DDP {d.world_size} ranks ({d.backend}) · ms per step",
                  caption="busy: the step less the time waiting in the all-reduce")
    for col in ("rank", "step", "data", "forward", "backward", "optimizer", "all-reduce", "busy"):
        table.add_column(col, justify="right")
    for r in d.ranks:
        mark = " *" if r.rank == d.slowest_rank and d.phase else ""
        table.add_row(f"{r.rank}{mark}", *map(_ms, (r.step_ms, r.data_ms, r.forward_ms, r.backward_ms,
                                                    r.optimizer_ms, r.allreduce_ms, r.busy_ms)))
    out_console.print(table)
    comm = d.extra.get("comm") or {}
    if comm.get("batch_size"):
        per = comm.get("busy_ms_per_sample")
        out_console.print(f"all-reduce {format_bytes(comm['allreduce_bytes'])} per step "
                          f"in {comm['allreduce_ms']:.2f} ms "
                          f"({comm['allreduce_share']:.0%} of the step) at batch {comm['batch_size']} per rank; "
                          f"busy {per:.3f} ms per sample" if per is not None else "", highlight=False)
    out_console.print(f"imbalance {d.imbalance:.2f}x (busy, max / median); {d.advice}")
