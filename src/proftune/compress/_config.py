"""What ``compress`` tries and how it judges: the config, its validation, the backend check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._paths import OutputPath, check_outputs
from .._with_options import with_options
from ..exceptions import ProblemCollector
from ._compile import COMPILER_NAMES, compiler_status
from ._methods import COMPRESS_METHODS
from ._pipeline import GOAL_METRICS
from ._plan import TARGETS
from ._plot import PLOT_FILES
from ._prune import IMPORTANCES, PRUNE_METHODS
from ._quant_backends import BACKEND_NAMES, backend_status
from ._quantize import QUANT_METHODS

__all__ = ["CompressConfig", "backend_problems", "compile_problems", "merge_config"]


@dataclass
class CompressConfig:
    """What to try and how to judge it (the CLI options of ``proftune compress``).

    ``ratios`` are the fractions removed: of output channels for structured pruning, of weights
    for unstructured. ``max_accuracy_drop`` is in metric units (0.01 = one accuracy point).
    With neither ``prune`` nor ``quantize`` the methods are chosen from the profile.
    """

    prune: str | None = None
    ratios: tuple[float, ...] = (0.3, 0.5, 0.7)
    importance: str = "l2"
    global_pruning: bool = False
    ignore_layers: tuple[str, ...] = ()
    round_to: int | None = None
    sensitivity: bool = True
    quantize: str | None = None
    quant_backend: str = "auto"
    #: Also try fp16 weights (half precision) of the float models.
    half: bool = False
    #: Engines to compile the float models with: ``inductor`` (AOTInductor), ``onnxruntime``.
    compile: tuple[str, ...] = ()
    #: Compression methods of one's own (names in ``COMPRESS_METHODS``), applied to every float model.
    methods: tuple[str, ...] = ()
    #: A deployment preset (``cpu``, ``gpu``, ``mobile``, ``edge``) that picks the methods.
    target: str | None = None
    distill: bool = False
    temperature: float = 4.0
    alpha: float = 0.5
    finetune_epochs: int = 1
    baseline_epochs: int | None = None
    max_accuracy_drop: float = 0.01
    metric: str = "accuracy"
    goal: str = "latency"
    out: str | None = None
    force: bool = False
    plot_dir: str | None = None
    threads: int | None = 1
    calib_batches: int = 8
    latency_rounds: int = 5
    layer_times: bool = True
    flush_denormal: bool = True
    seed: int = 0
    device: str = "auto"
    #: Seconds for building candidates (None: no limit): once spent, no further candidate is
    #: built (those built are measured and judged as ever) and a note says which were left out.
    time_limit_s: float | None = None

    def problems(self, model_path: str | None = None) -> list[str]:
        """Every problem with this config, each naming the option, its value and the choices."""
        p = ProblemCollector()
        self._choice_problems(p)
        self._number_problems(p)
        if self.distill and self.finetune_epochs == 0 and self.quantize != "qat":
            p.add("distill=True teaches during fine-tuning; give finetune_epochs= >= 1.")
        if self.time_limit_s is not None and not (self.time_limit_s > 0):
            p.add(f"time_limit_s={self.time_limit_s!r}: give seconds > 0, or None for no limit.")
        self._out_problems(p, model_path)
        return p.problems

    def _choice_problems(self, p: ProblemCollector) -> None:
        choices: tuple[tuple[str, str | None, tuple[str, ...] | dict[str, str]], ...] = (
            ("prune", self.prune, PRUNE_METHODS), ("quantize", self.quantize, QUANT_METHODS),
            ("quant_backend", self.quant_backend, ("auto", *BACKEND_NAMES)),
            ("importance", self.importance, IMPORTANCES), ("goal", self.goal, GOAL_METRICS),
        )
        for option, value, valid in choices:
            if value is not None and value not in valid:
                p.add(f"{option}={value!r} is unknown; valid: {', '.join(valid)}.")
        for name in self.compile:
            if name not in COMPILER_NAMES:
                p.add(f"compile={name!r} is unknown; valid: {', '.join(COMPILER_NAMES)}.")
        for name in self.methods:
            if name not in COMPRESS_METHODS:
                p.add(f"methods={name!r} is unknown; valid: {', '.join(COMPRESS_METHODS) or '(none registered)'}.")
        if self.target is not None and self.target not in TARGETS:
            p.add(f"target={self.target!r} is unknown; valid: {', '.join(TARGETS)}.")

    def _number_problems(self, p: ProblemCollector) -> None:
        if self.prune is not None and not self.ratios:
            p.add("ratios= is empty; give pruning ratios in (0, 1), e.g. ratios=(0.3, 0.5).")
        for r in self.ratios:
            if not (isinstance(r, (int, float)) and 0.0 < float(r) < 1.0):
                p.add(f"ratio {r!r} is outside (0, 1); a ratio is the fraction removed, e.g. 0.5.")
        if not self.max_accuracy_drop >= 0:
            p.add(f"max_accuracy_drop={self.max_accuracy_drop!r} must be >= 0 (metric units, 0.01 = 1 point).")
        minimums = (("finetune_epochs", self.finetune_epochs, 0), ("baseline_epochs", self.baseline_epochs, 1),
                    ("round_to", self.round_to, 1), ("calib_batches", self.calib_batches, 1))
        for option, value, low in minimums:
            if value is not None and value < low:
                p.add(f"{option}={value!r} must be >= {low}.")
        if not self.temperature > 0:
            p.add(f"temperature={self.temperature!r} must be > 0.")
        if not 0.0 <= self.alpha <= 1.0:
            p.add(f"alpha={self.alpha!r} must be in [0, 1].")

    def _out_problems(self, p: ProblemCollector, model_path: str | None) -> None:
        if self.out is not None and model_path is not None and _same_file(Path(self.out), Path(model_path)):
            p.add(f"out={self.out!r} is the original model file; the original is never "
                  "overwritten, choose another path.")
            return
        check_outputs([OutputPath("out=", self.out),
                       OutputPath("plot_dir=", self.plot_dir, folder=True, names=PLOT_FILES)],
                      force=self.force, problems=p)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def merge_config(config: CompressConfig | None, overrides: dict[str, Any]) -> CompressConfig:
    """``config`` (or the defaults) with ``overrides`` set (:func:`with_options`: an unknown name is
    a ConfigError); a string or a list for a tuple field becomes a tuple."""
    cfg = with_options(CompressConfig, config, overrides, caller="compress")
    tuples = {key: (value,) if isinstance(value, str) else tuple(value) for key in ("ratios", "ignore_layers",
              "compile", "methods") if (value := overrides.get(key)) is not None}
    return with_options(CompressConfig, cfg, tuples, caller="compress")


def backend_problems(cfg: CompressConfig, dev: torch.device) -> list[str]:
    """Why ``cfg.quantize`` cannot run on ``dev`` with ``cfg.quant_backend`` (empty: it can)."""
    assert cfg.quantize is not None
    status = backend_status(cfg.quantize, dev)
    if cfg.quant_backend == "auto":
        if all(reason is not None for reason in status.values()):
            why = "; ".join(f"{b}: {r}" for b, r in status.items())
            return [f"quantize={cfg.quantize!r}: no quantization backend is available on {dev} ({why})."]
        return []
    reason = status.get(cfg.quant_backend)
    if reason is not None:
        return [f"quant_backend={cfg.quant_backend!r} cannot run quantize={cfg.quantize!r} on {dev}: {reason}."]
    return []


def compile_problems(cfg: CompressConfig, dev: torch.device) -> list[str]:
    """Why an engine ``cfg.compile`` names cannot run on ``dev`` (a target's preset engine that
    cannot is skipped with a note instead)."""
    status = compiler_status(dev)
    return [f"compile={n!r}: cannot run on {dev}: {status[n]}." for n in cfg.compile
            if n in status and status[n] is not None]
