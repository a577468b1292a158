"""The report of a ``predict`` run, read through the prediction's record (:class:`PredictResult`),
so that a renamed field fails here rather than rendering as an empty cell."""

from __future__ import annotations

from .._units import format_bytes
from ..predict import STRATEGIES, ParallelPlan, ParallelPrediction, PredictResult
from ..track import RunRecord
from ._common import Context, register_renderer
from ._figures import PALETTE, bar, hline, layout
from ._html import Page, Section

#: The per-GPU kinds in the order the stacked bars and the tables show them.
_KINDS = ("params", "grads", "unsharded_grads", "optimizer_state", "optimizer_temp", "activations", "comm_buckets",
          "gathered_params", "batch", "buffers")


@register_renderer("predict")
def _predict(page: Page, r: RunRecord, ctx: Context) -> None:
    p = PredictResult.from_dict(dict(r.result or {}))
    m, step, peak = p.memory, p.step, p.peak
    s = page.section("Prediction")
    s.para(f"{p.task} · batch {p.batch_size} · {p.precision} · {p.optimizer} on {p.device} · "
           f"{p.traces} fake-tensor steps traced, {p.real_steps} real steps · {p.note}", cls="muted")
    s.kv([("params (total)", p.params.total), ("params (trainable)", p.params.trainable),
          ("FLOPs (forward)", p.flops), ("FLOPs (backward)", p.backward_flops),
          ("FLOPs (optimizer)", p.optimizer_flops),
          ("step time (estimate, ms)", step.time_ms), ("bound", p.bound),
          ("predicted peak", format_bytes(m.peak_bytes)),
          ("device memory", format_bytes(p.device_memory_bytes)),
          ("fits", "-" if p.fits is None else ("yes" if p.fits else "no")),
          ("largest batch that fits", p.max_batch_size)], title="totals")

    parts = [("params", m.params_bytes), ("buffers", m.buffers_bytes), ("grads", m.grads_bytes),
             ("optimizer state", m.optimizer_bytes), ("batch", m.batch_bytes), ("activations", m.activations_bytes)]
    ms = page.section("Memory (predicted)")
    shape, note = hline(m.peak_bytes / 2**20, f"step peak {format_bytes(m.peak_bytes)}")
    fig = {"data": [bar([k for k, _ in parts], [v / 2**20 for _, v in parts], "bytes", color=PALETTE[0],
                        text=[format_bytes(v) for _, v in parts])],
           "layout": layout("predicted memory of a training step (MiB)", y="MiB", shapes=[shape],
                            annotations=[note], showlegend=False)}
    where = peak.layer or ("(optimizer)" if peak.phase == "optimizer" else "(outside layers)")
    ms.chart(fig, side=ms.side(lambda t: t.kv(
        [*[(k, format_bytes(v)) for k, v in parts], ("peak of a step", format_bytes(m.peak_bytes)),
         ("peak at", f"{peak.phase} · {where} · {peak.op}"),
         *[(f"at the peak: {k}", format_bytes(v)) for k, v in peak.breakdown.items()]], title="bytes")))

    ts = page.section("Step time (roofline estimate)")
    ts.kv([("forward ms", step.forward_ms), ("backward ms", step.backward_ms),
           ("optimizer ms", step.optimizer_ms), ("step ms", step.time_ms)], title="milliseconds per step")
    if p.layers:
        ls = page.section("Layers (predicted)")
        ls.table(["layer", "type", "params", "FLOPs fwd", "FLOPs bwd", "activations", "fwd ms", "bwd ms", "bound"],
                 [[lay.name or "(model)", lay.type, lay.params, lay.flops, lay.backward_flops,
                   (format_bytes(lay.activation_bytes), lay.activation_bytes), lay.forward_ms, lay.backward_ms,
                   lay.bound] for lay in p.layers])
    c = p.calibration
    if c:
        page.section("Calibration").kv([(k, v) for k, v in c.items()], title=f"predicted vs measured on {c['device']}")
    if p.uncounted_ops:
        page.section("Ops not counted").table(["op", "calls", "shapes"], [
            [u.get("op"), u.get("calls"), str(u.get("shapes"))[:120]] for u in p.uncounted_ops])
    if p.parallel is not None:
        _parallel(page.section(f"Per GPU: {_title(p.parallel)}"), p.parallel)
    if p.plan is not None:
        _plan(page.section(f"Plan: {p.plan.gpus} GPUs, global batch {p.plan.global_batch}"), p.plan)


def _title(o: ParallelPrediction) -> str:
    return (f"{STRATEGIES[o.strategy].title} on {o.gpus} GPUs ({o.nodes} node{'s' if o.nodes > 1 else ''}), "
            f"checkpointing {o.activation_checkpointing}, offload {o.offload}")


def _kinds(memory: dict[str, int]) -> list[str]:
    return [k for k in _KINDS if memory.get(k)] + sorted(k for k in memory if k not in _KINDS and memory[k])


def _parallel(s: Section, o: ParallelPrediction) -> None:
    """One GPU's memory by kind at the step's peak, its model states, DeepSpeed's terms, the step."""
    s.para(f"per-GPU batch {o.batch_size} x {o.micro_batches} micro-batches = global batch {o.global_batch}; "
           f"peak in {o.peak_phase}; {o.note or 'traced at this batch'}", cls="muted")
    kinds = _kinds(o.memory)
    lay = layout(f"one GPU's memory at the step's peak (MiB), {o.peak_phase}", y="MiB", showlegend=False)
    if o.device_memory_bytes:
        shape, note = hline(o.device_memory_bytes / 2**20, f"device {format_bytes(o.device_memory_bytes)}")
        lay.update(shapes=[shape], annotations=[note])
    fig = {"data": [bar(kinds, [o.memory[k] / 2**20 for k in kinds], "bytes", color=PALETTE[0],
                        text=[format_bytes(o.memory[k]) for k in kinds])], "layout": lay}
    st, ds = o.step, o.deepspeed
    s.chart(fig, side=s.side(lambda t: t.kv(
        [*[(k, format_bytes(o.memory[k])) for k in kinds], ("peak per GPU", format_bytes(o.peak_bytes)),
         *[(f"peak in {ph}", format_bytes(v)) for ph, v in o.phase_peaks.items()],
         ("fits", "-" if o.fits is None else ("yes" if o.fits else "no")),
         ("largest per-GPU batch that fits", o.max_batch_size)], title="bytes per GPU")))
    s.kv([*[(f"model states: {k}", format_bytes(v)) for k, v in o.model_states.items()],
          ("activations", format_bytes(o.activations_bytes)),
          ("activations without checkpointing", format_bytes(o.activations_without_checkpointing_bytes)),
          ("communication buffers", format_bytes(o.comm_buffers_bytes)),
          (f"DeepSpeed's terms: {ds.get('formula', '')}",
           f"GPU {format_bytes(ds.get('gpu_bytes'))}, CPU {format_bytes(ds.get('cpu_bytes'))}"),
          ("DeepSpeed's source", str(ds.get("source", ""))),
          ("params (Ψ), largest layer (L)", f"{o.n_params:,}, {o.largest_layer_params:,}")],
         title="model states, activations and DeepSpeed's closed form")
    link = o.link
    s.kv([("step ms (estimate)", st.get("time_ms")), ("compute ms", st.get("compute_ms")),
          ("collectives ms", st.get("comm_ms")), ("collectives not hidden ms", st.get("exposed_comm_ms")),
          ("offload ms", st.get("offload_ms")), ("samples/s", o.samples_per_s), ("tokens/s", o.tokens_per_s),
          ("link", f"{link.get('name', '-')} " + (f"{format_bytes(link['bytes_s'])}/s" if link.get("bytes_s")
                                                    else "(bandwidth unknown)"))], title="step")
    s.table(["collective", "bytes per GPU", "times per step", "hidden behind"],
            [[c["name"], (format_bytes(c["bytes_per_gpu"]), c["bytes_per_gpu"]), c["times"], c["overlaps"] or "-"]
             for c in o.collectives], title="collectives")


def _plan(s: Section, plan: ParallelPlan) -> None:
    """Every option that fits by throughput, per-GPU memory by kind; the best of each strategy as
    stacked bars; and why the rest does not fit."""
    tokens = f" x {plan.tokens_per_sample} tokens" if plan.tokens_per_sample else ""
    s.para(f"global batch {plan.global_batch}{tokens} on {plan.gpus} GPUs ({plan.nodes} node"
           f"{'s' if plan.nodes > 1 else ''}); {len(plan.options)} options fit; {plan.traces} fake steps, "
           f"{plan.seconds:.1f} s; {plan.note}", cls="muted")
    best: dict[str, ParallelPrediction] = {}
    for o in plan.options:
        best.setdefault(o.strategy, o)
    if best:
        kinds = sorted({k for o in best.values() for k in _kinds(o.memory)},
                       key=lambda k: _KINDS.index(k) if k in _KINDS else len(_KINDS))
        labels = [f"{STRATEGIES[o.strategy].title} ({o.activation_checkpointing}, {o.offload}, b{o.batch_size})"
                  for o in best.values()]
        data = [bar(labels, [o.memory.get(k, 0) / 2**20 for o in best.values()], k,
                    color=PALETTE[i % len(PALETTE)]) for i, k in enumerate(kinds)]
        lay = layout("per-GPU memory at the peak, the fastest option of each strategy (MiB)", y="MiB", barmode="stack")
        memory = next(iter(best.values())).device_memory_bytes
        if memory:
            shape, note = hline(memory / 2**20, f"device {format_bytes(memory)}")
            lay.update(shapes=[shape], annotations=[note])
        s.chart({"data": data, "layout": lay})
    cols = ["#", "strategy", "checkpointing", "offload", "per-GPU batch", "accumulation", "params/GPU", "grads/GPU",
            "optimizer/GPU", "activations", "buffers", "peak/GPU", "peak in", "step ms", "samples/s", "tokens/s"]

    def cell(v: int) -> tuple[str, int]:
        return format_bytes(v), v

    rows = [[i, STRATEGIES[o.strategy].title, o.activation_checkpointing, o.offload, o.batch_size, o.micro_batches,
             cell(o.model_states.get("params", 0)), cell(o.model_states.get("grads", 0)),
             cell(o.model_states.get("optimizer_state", 0)), cell(o.activations_bytes), cell(o.comm_buffers_bytes),
             cell(o.peak_bytes), o.peak_phase, o.step.get("time_ms"), o.samples_per_s, o.tokens_per_s]
            for i, o in enumerate(plan.options, 1)]
    s.table(cols, rows, title="options that fit, fastest first (per GPU)")
    if plan.rejected:
        s.table(["strategy", "checkpointing", "offload", "needs per GPU", "at per-GPU batch", "reason"],
                [[STRATEGIES[r["strategy"]].title, r["activation_checkpointing"], r["offload"],
                  cell(int(r["needs_bytes"])), r["batch_size"], r["reason"]] for r in plan.rejected],
                title="does not fit")
