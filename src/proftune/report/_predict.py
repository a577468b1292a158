"""The report of a ``predict`` run, read through the prediction's record (:class:`PredictResult`),
so that a renamed field fails here rather than rendering as an empty cell."""

from __future__ import annotations

from .._units import format_bytes
from ..predict import PredictResult
from ..track import RunRecord
from ._figures import PALETTE, bar, hline, layout
from ._html import Page
from ._sections import Context, register_renderer


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
