"""Where the model's parameters, MACs and time sit (read from its :class:`Profile`), and the
methods that follow from it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..profile import Profile

__all__ = ["TARGETS", "LayerShare", "Plan", "ProfileSummary", "TargetPreset", "TypeShare", "plan_methods",
           "profile_summary"]

#: Layer types that dynamic INT8 quantizes.
DENSE_TYPES = ("Linear", "LSTM", "NonDynamicallyQuantizableLinear")


@dataclass(frozen=True)
class TargetPreset:
    """The methods a deployment target starts from (``auto`` INT8: static for conv-heavy models,
    dynamic otherwise); every candidate is still measured and the selection is by measurement."""

    prune: str | None
    quant: str | None
    half: bool
    compile: tuple[str, ...]
    why: str


#: ``--target``: the seeds' hardware table (GPU, mobile, edge), and the CPU's deployment engine.
TARGETS: dict[str, TargetPreset] = {
    "cpu": TargetPreset("structured", "auto", False, ("onnxruntime",),
                        "structured pruning + INT8 (x86/ARM INT8 kernels) + ONNX Runtime, the CPU serving engine"),
    "gpu": TargetPreset("structured", None, True, (),
                        "structured pruning (dense kernels stay dense) + half precision (tensor cores)"),
    "mobile": TargetPreset("structured", "static", False, (),
                           "static INT8 (integer-only kernels, e.g. QNNPACK/XNNPACK) + channel pruning"),
    "edge": TargetPreset(None, "auto", True, (),
                         "FP16 + INT8 (edge accelerators run one or the other natively)"),
}


@dataclass(frozen=True)
class LayerShare:
    """One layer of the profile: its size and forward time, and its shares of the model's."""

    name: str
    type: str
    params: int
    macs: int
    forward_ms: float | None
    time_share: float | None
    params_share: float
    macs_share: float


@dataclass(frozen=True)
class TypeShare:
    """The shares of the parameters, MACs and forward time that one layer type holds."""

    params_share: float
    macs_share: float
    time_share: float


@dataclass(frozen=True)
class ProfileSummary:
    """The report's view of the profile: totals, top layers by params/MACs/time, shares by type;
    ``top_time`` is None where no layer was timed."""

    params: int
    macs: int
    batch_size: int
    top_params: list[LayerShare]
    top_macs: list[LayerShare]
    by_type: dict[str, TypeShare]
    top_time: list[LayerShare] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON a :class:`CompressResult` holds as ``profile`` (no ``top_time`` where untimed)."""
        d = dataclasses.asdict(self)
        if self.top_time is None:
            del d["top_time"]
        return d


def profile_summary(record: Profile) -> ProfileSummary:
    """Where the parameters, MACs and time of ``record`` sit.

    Shares come from the record (``LayerProfile.*_share``, ``Profile.by_type``); nothing is
    re-measured or re-aggregated here.
    """
    layers = [LayerShare(name=lp.name, type=lp.type, params=lp.params, macs=lp.macs, forward_ms=lp.forward_ms,
                         time_share=lp.time_share, params_share=lp.params_share or 0.0,
                         macs_share=lp.macs_share or 0.0) for lp in record.layers]
    total_params, total_macs = max(record.params.total, 1), max(record.macs, 1)
    by_type = {t["type"]: TypeShare(params_share=t["params"] / total_params, macs_share=t["macs"] / total_macs,
                                    time_share=float(t.get("time_share") or 0.0))
               for t in record.by_type}
    timed = any(d.time_share is not None for d in layers)
    return ProfileSummary(
        params=record.params.total, macs=record.macs, batch_size=record.batch_size,
        top_params=sorted(layers, key=lambda d: -d.params)[:5], top_macs=sorted(layers, key=lambda d: -d.macs)[:5],
        by_type=by_type, top_time=sorted(layers, key=lambda d: -(d.time_share or 0.0))[:5] if timed else None)


@dataclass
class Plan:
    """The methods to run, why (``lines``) and what the user should know (``notes``)."""

    prune: str | None
    quant: str | None
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: fp16 candidates of the float models; compiled candidates, one per engine named.
    half: bool = False
    compile: tuple[str, ...] = ()


def plan_methods(summary: ProfileSummary, *, prune: str | None, quant: str | None,
                 quant_possible: dict[str, bool], half: bool = False, compile: tuple[str, ...] = (),
                 target: str | None = None, methods: tuple[str, ...] = ()) -> Plan:
    """The methods to run; chosen from where the parameters and MACs sit when none is given, or
    from ``target``'s preset (what the user named explicitly wins over the preset).

    ``quant_possible[method]``: whether some backend can run that INT8 method here.
    """
    by_type = summary.by_type
    conv_macs = sum(v.macs_share for t, v in by_type.items() if t.startswith("Conv"))
    dense_params = sum(v.params_share for t, v in by_type.items() if t in DENSE_TYPES)
    plan = Plan(prune, quant, half=half, compile=tuple(compile))
    if target is not None:
        preset = TARGETS[target]
        plan.prune = prune or preset.prune
        wanted = quant or preset.quant
        if wanted == "auto":
            wanted = "static" if conv_macs >= 0.5 else "dynamic"
        plan.quant = wanted
        plan.half = half or preset.half
        plan.compile = tuple(dict.fromkeys((*compile, *preset.compile)))
        plan.lines.append(f"target {target}: {preset.why}; each candidate measured here")
        if plan.quant is not None and quant is None and not quant_possible.get(plan.quant, False):
            plan.lines.append(f"{plan.quant} INT8 skipped: no backend here")
            plan.quant = None
    elif prune is None and quant is None and not half and not compile and not methods:
        plan.prune = "structured"
        plan.quant = "static" if conv_macs >= 0.5 else "dynamic"
        plan.lines.append(f"no method given: structured pruning (removes channels: fewer MACs and "
                          f"bytes) + {plan.quant} INT8, because conv layers hold {conv_macs:.0%} of the "
                          f"MACs and Linear/LSTM layers {dense_params:.0%} of the parameters")
        if not quant_possible.get(plan.quant, False):
            plan.lines.append(f"{plan.quant} INT8 skipped: no backend here")
            plan.quant = None
    if plan.quant == "dynamic":
        plan.lines.append(f"dynamic INT8 quantizes Linear/LSTM, which hold {dense_params:.0%} of the "
                          "parameters" + ("; little to gain" if dense_params < 0.5 else ""))
    if plan.quant in ("static", "qat"):
        plan.lines.append(f"{plan.quant} INT8 quantizes conv and Linear layers (conv: {conv_macs:.0%} of MACs)")
    if plan.prune == "unstructured":
        plan.notes.append("unstructured pruning zeroes weights but keeps tensors dense: dense "
                          "kernels run no faster and the dense file is no smaller; sparse_size_bytes "
                          "is the size when stored sparse (CSR) where that is smaller.")
    if plan.prune == "structured":
        plan.lines.append("structured pruning where the MACs are: " + ", ".join(
            f"{d.name} ({d.macs_share:.0%})" for d in summary.top_macs[:3]))
    if plan.half:
        plan.lines.append("fp16: the float models with half-precision weights (half the bytes; fast on "
                          "tensor cores, slow where the CPU converts: measured)")
    if methods:
        plan.lines.append("methods of one's own: " + ", ".join(methods) + " of every float model, "
                          "measured like every other candidate")
    if plan.compile:
        plan.lines.append("compiled: " + ", ".join(plan.compile) + " of every float model, checked against "
                          "the eager outputs on the validation data")
    if summary.top_time is not None:
        _time_notes(summary, summary.top_time, plan)
    return plan


def _time_notes(summary: ProfileSummary, top_time: list[LayerShare], plan: Plan) -> None:
    """Where the forward time goes, and whether the INT8 method covers it."""
    by_type = summary.by_type
    plan.lines.append(f"forward time (profile, batch {summary.batch_size}): " + ", ".join(
        f"{d.name} {d.type} {(d.time_share or 0.0):.0%}" for d in top_time[:3]))
    conv_time = sum(v.time_share for t, v in by_type.items() if t.startswith("Conv"))
    dense_time = sum(v.time_share for t, v in by_type.items() if t in DENSE_TYPES)
    if plan.quant == "dynamic" and dense_time < 0.3:
        plan.notes.append(f"Linear/LSTM layers take only {dense_time:.0%} of the forward time; "
                          "dynamic INT8 cannot speed up the rest (static INT8 covers conv).")
    if plan.quant == "static" and conv_time + dense_time < 0.3:
        plan.notes.append("conv and Linear layers take under 30% of the forward time; INT8 "
                          "will change little.")
