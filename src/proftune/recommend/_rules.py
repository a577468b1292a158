"""Rules read off one Profile: precision, data loading, bottleneck layers.

Each rule reads the measured numbers of the Profile (nothing is re-measured) and returns a
:class:`Recommendation` with those numbers as its evidence.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from .._records import JsonRecord
from ..profile import LayerProfile, Profile, load_spread
from ._records import Recommendation

#: Waiting for data above this share of the step is worth fixing (issue 4).
DATA_SHARE_THRESHOLD = 0.10
#: Matmul/conv must take at least this share of the step for autocast to pay.
MATMUL_SHARE_THRESHOLD = 0.5
#: Assumed speed-up of matmul/conv under bf16/fp16 autocast (tensor cores; conservative).
AUTOCAST_MATMUL_SPEEDUP = 2.0
#: A layer is a bottleneck when its time share is this many times its params/MACs share...
BOTTLENECK_RATIO = 3.0
#: ...and it takes at least this share of the layers' time.
BOTTLENECK_MIN_SHARE = 0.05

_NORM = ("BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm", "LocalResponseNorm")
_ELEMENTWISE = ("ReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Dropout",
                "LeakyReLU", "ELU", "Hardswish", "Mish", "Identity", "Flatten", "Unflatten")
_POOL = ("MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "Upsample")
_MATMUL = ("Linear", "Conv", "ConvTranspose", "Bilinear", "MultiheadAttention", "LSTM", "GRU", "RNN",
           "NonDynamicallyQuantizableLinear")


def _layer_ms(layer: LayerProfile) -> float:
    return float(layer.forward_ms or 0.0) + float(layer.backward_ms or 0.0)


def _is_matmul(layer: LayerProfile) -> bool:
    return layer.macs > 0 or any(layer.type.startswith(t) for t in _MATMUL)


def matmul_share(profile: Profile) -> dict[str, float]:
    """Time of matmul/conv layers (any layer with MACs), in ms and as a share of layers and step."""
    layers = [lay for lay in profile.layers if lay.forward_ms is not None]
    total = sum(_layer_ms(lay) for lay in layers)
    mm = sum(_layer_ms(lay) for lay in layers if _is_matmul(lay))
    step = float(profile.step.time_ms or 0.0)
    return {"matmul_ms": mm, "layers_ms": total, "step_ms": step,
            "share_of_layers": mm / total if total > 0 else 0.0,
            "share_of_step": mm / step if step > 0 else 0.0}


@lru_cache(maxsize=1)
def cpu_bf16_flags() -> tuple[str, ...]:
    """The CPU's bf16 matmul instructions (AVX512-BF16, AMX-BF16), from /proc/cpuinfo."""
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return ()
    flags: set[str] = set()
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return tuple(sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile")))


def precision_rule(profile: Profile) -> Recommendation:
    """bf16/fp16 autocast where the device runs it fast and matmul/conv dominate the step."""
    shares = matmul_share(profile)
    share = shares["share_of_step"] or shares["share_of_layers"]
    device = torch.device(profile.device)
    evidence: dict[str, object] = {"device": profile.device, **shares,
                                   "threshold": MATMUL_SHARE_THRESHOLD,
                                   "assumed_matmul_speedup": AUTOCAST_MATMUL_SPEEDUP}
    step_ms = shares["step_ms"]
    predicted = step_ms * (1 - share + share / AUTOCAST_MATMUL_SPEEDUP) if step_ms else None
    act = profile.memory.activations_bytes
    effect = ""
    if predicted is not None:
        effect = (f"step {step_ms:.2f} -> ~{predicted:.2f} ms (matmul/conv {share:.0%} of the step at "
                  f"{AUTOCAST_MATMUL_SPEEDUP:g}x); activations ~{act / 2 / 2**20:.1f} MiB less")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            choice, why = None, "the profile was taken on CUDA but CUDA is not available here to check support."
        else:
            idx = device.index if device.index is not None else torch.cuda.current_device()
            major, minor = torch.cuda.get_device_capability(idx)
            evidence["compute_capability"] = f"{major}.{minor}"
            if torch.cuda.is_bf16_supported():
                choice, why = "bf16", (f"compute capability {major}.{minor} has bf16 tensor cores; "
                                       "bf16 needs no loss scaling.")
            elif major >= 7:
                choice, why = "fp16", (f"compute capability {major}.{minor} has fp16 tensor cores but no bf16; "
                                       "fp16 needs the grad scaler (precision=fp16 adds it).")
            else:
                choice, why = None, (f"compute capability {major}.{minor} has no tensor cores: "
                                     "half precision would not be faster.")
    elif device.type == "cpu":
        flags = cpu_bf16_flags()
        evidence["cpu_bf16_flags"] = list(flags)
        if flags:
            choice, why = "bf16", f"this CPU has {', '.join(flags)}: oneDNN runs bf16 matmul/conv natively."
        else:
            choice, why = None, ("this CPU has no AVX512-BF16 or AMX: bf16 matmuls are converted to "
                                 "fp32 and run slower than fp32 itself, so autocast would cost time.")
    else:
        choice, why = None, f"device type {device.type!r} is not one whose autocast speed proftune knows."
    # the precision the device could run faster, before the share's threshold: a timed check
    # decides it where the share is near the threshold (a share measured twice lands either side)
    evidence["candidate"] = choice
    if choice is not None and share < MATMUL_SHARE_THRESHOLD:
        why = (f"{why} But matmul/conv take only {share:.0%} of the measured step (threshold "
               f"{MATMUL_SHARE_THRESHOLD:.0%}): autocast would save at most "
               f"{share * (1 - 1 / AUTOCAST_MATMUL_SPEEDUP):.0%} of it.")
        choice = None
    if choice is None:
        return Recommendation("precision", "fp32", f"keep fp32: {why}", evidence, "medium",
                              "none: fp32 stays the fastest choice measured here")
    return Recommendation("precision", choice,
                          f"use {choice} autocast (param precision={choice}): {why} Matmul/conv take "
                          f"{share:.0%} of the measured step.", evidence, "medium", effect)


def data_loading_rule(profile: Profile) -> Recommendation:
    """Waiting for data above 10% of the step: workers, pinned memory, prefetch."""
    step = profile.step
    share = step.data_ms / step.time_ms if step.time_ms > 0 else 0.0
    evidence = {"data_ms": step.data_ms, "step_ms": step.time_ms, "data_share": share,
                "threshold": DATA_SHARE_THRESHOLD, "cpu_count": os.cpu_count() or 1}
    if share <= DATA_SHARE_THRESHOLD:
        return Recommendation("data_loading", "no change",
                              f"waiting for data takes {share:.1%} of the step (threshold "
                              f"{DATA_SHARE_THRESHOLD:.0%}): loading keeps up.", evidence, "high",
                              "none needed")
    workers = max(1, min(8, (os.cpu_count() or 2) - 1))
    cuda = profile.device.startswith("cuda")
    value = {"num_workers": workers, "pin_memory": cuda, "prefetch_factor": 2,
             "persistent_workers": True}
    saved = step.data_ms
    faster = step.time_ms / max(step.time_ms - saved, 1e-9)
    reason = (f"waiting for data takes {share:.0%} of the step ({step.data_ms:.2f} of "
              f"{step.time_ms:.2f} ms): load in the background with DataLoader(num_workers={workers}, "
              f"persistent_workers=True, prefetch_factor=2"
              + (", pin_memory=True) and .to(device, non_blocking=True)" if cuda else ")")
              + "; decode/augment once and cache if the transform itself is slow.")
    return Recommendation("data_loading", value, reason, evidence, "medium",
                          f"up to {saved:.2f} ms less per step (x{faster:.2f} throughput) "
                          "when loading overlaps compute")


def _advice(layer: LayerProfile) -> str:
    t = layer.type
    if any(t.startswith(n) for n in _NORM):
        return ("a normalisation: memory-bound, many passes over the activations; fuse it with its "
                "neighbours (torch.compile) and, for convs, use channels_last.")
    if any(t.startswith(n) for n in _ELEMENTWISE):
        return "an elementwise op: memory-bound; fuse it into the layer before it (torch.compile)."
    if any(t.startswith(n) for n in _POOL):
        return "a pooling/resampling op: memory-bound; fuse (torch.compile) or use channels_last."
    if t.startswith("Embedding"):
        return "a lookup whose backward scatters into the whole table; use sparse=True gradients or a smaller table."
    if "Attention" in t:
        return ("attention: time grows with the square of the sequence; make sure it runs through "
                "scaled_dot_product_attention (flash/memory-efficient kernels) and in bf16 on GPU.")
    if t.startswith(("Linear", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN")):
        rate = f" at {layer.gflops_per_s:.1f} GFLOP/s" if layer.gflops_per_s else ""
        return (f"a matmul/conv too small to fill the device{rate}; raise the batch size, widen or "
                "merge small layers, or compile it.")
    return "look at its operators (proftune profile --trace) to see where its time goes."


def _beyond_noise(lay: LayerProfile, work: float) -> bool:
    """A share told from the load's noise (timed on two steps or more) whose share at its fastest
    step clears both bars (a share measured on one step is not told)."""
    low = lay.time_share
    return (not lay.share_within_noise and low is not None and low >= BOTTLENECK_MIN_SHARE
            and low > BOTTLENECK_RATIO * work)


@dataclass(frozen=True)
class _SlowLayer(JsonRecord):
    """A layer whose share of the time is far above its share of the work (at its fastest of ``steps``)."""

    layer: str
    type: str
    time_share: float
    time_share_q1: float | None
    time_share_q3: float | None
    steps: int
    params_share: float
    macs_share: float
    ms: float


def bottleneck_rule(profile: Profile) -> Recommendation:
    """Layers whose share of time is far above their share of parameters and MACs, beyond the
    share's noise: advice only where its fastest of two or more timed steps is above the bars."""
    layers = [lay for lay in profile.layers if lay.forward_ms is not None]
    total_ms = sum(_layer_ms(lay) for lay in layers)
    total_params = sum(lay.params for lay in profile.layers) or 1
    total_macs = sum(lay.macs for lay in profile.layers) or 1
    found: list[tuple[_SlowLayer, str]] = []
    noisy: list[_SlowLayer] = []
    for lay in layers:
        t_share = lay.time_share if lay.time_share is not None else (_layer_ms(lay) / total_ms if total_ms else 0.0)
        p_share = lay.params_share if lay.params_share is not None else lay.params / total_params
        m_share = lay.macs_share if lay.macs_share is not None else lay.macs / total_macs
        work = max(p_share, m_share)
        if t_share >= BOTTLENECK_MIN_SHARE and t_share > BOTTLENECK_RATIO * work:
            row = _SlowLayer(lay.name, lay.type, t_share, lay.time_share_q1, lay.time_share_q3,
                             lay.time_share_samples, p_share, m_share, _layer_ms(lay))
            if _beyond_noise(lay, work):
                found.append((row, _advice(lay)))
            else:
                noisy.append(row)
    found.sort(key=lambda d: -d[0].time_share)
    noisy.sort(key=lambda d: -d.time_share)
    evidence = {"layers_ms": total_ms, "layers_profiled": len(layers), "ratio": BOTTLENECK_RATIO,
                "min_time_share": BOTTLENECK_MIN_SHARE, "within_noise": [d.to_dict() for d in noisy]}
    if not layers:
        return Recommendation("bottleneck", None,
                              "the profile holds no per-layer times (profile with detail='full').",
                              evidence, "low", "")
    withheld = ""
    if noisy:
        d = noisy[0]
        spread = f"it was timed on {d.steps} step(s), too few to tell a share from noise"
        withheld = (f" No advice for {d.layer or '(model)'} ({d.type}, {d.time_share:.0%} of the time): "
                    f"{spread}, within the machine's noise of the bars"
                    + (f" (and {len(noisy) - 1} more like it)" if len(noisy) > 1 else "") + ".")
    if not found:
        return Recommendation("bottleneck", [], "no layer takes far more time than its share of "
                              f"parameters and MACs beyond noise (>= {BOTTLENECK_MIN_SHARE:.0%} of the time "
                              f"and > {BOTTLENECK_RATIO:g}x its work share at its fastest of two or more "
                              f"timed steps).{withheld}", evidence, "medium", "none needed")
    saved = sum(d.ms for d, _ in found) * 0.5
    names = ", ".join(f"{d.layer} ({d.type}, {d.time_share:.0%} of time at its fastest of {d.steps} "
                      f"steps, their middle half {load_spread(d.time_share, d.time_share_q1, d.time_share_q3)} "
                      f"as long, vs {max(d.params_share, d.macs_share):.0%} of work)" for d, _ in found[:5])
    rows = [{**d.to_dict(), "action": action} for d, action in found]
    return Recommendation("bottleneck", rows, f"layers whose time is far above their work: {names}.{withheld}",
                          evidence, "medium",
                          f"fusing/fixing them could save up to ~{saved:.2f} ms per step (half their time)")
