"""``proftune.compress``: prune, fine-tune (optionally distilled), quantize, measure, select.

Every candidate is saved, reloaded and measured as saved: its metric on the task's validation
data, parameters and MACs (from the profiler's one counter), serialised size, and latency at
batch 1 and at the task's batch size. The selection is the best candidate on ``goal`` whose
metric drop stays within ``max_accuracy_drop``.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._device import DeviceIterable, move_to_device, resolve_device
from ..exceptions import ConfigError, ProblemCollector
from ..task import Task, load_task
from ..track import Store, tracked_run
from ..train import Callback, evaluate_model, fit, validate_params
from ._distill import DistillationTask
from ._measure import (
    LOAD_LINES,
    LatencyInput,
    call,
    count,
    file_size,
    load_model,
    measure_latencies,
    save_model,
    sparse_size_bytes,
)
from ._pipeline import (
    GOALS,
    Candidate,
    capture_inputs,
    higher_is_better,
    mark_pareto,
    select,
    slice_batch,
)
from ._prune import (
    IMPORTANCES,
    PRUNE_METHODS,
    final_classifier,
    make_permanent,
    prune_structured,
    prune_unstructured,
    resolve_layers,
    sparsity,
)
from ._quantize import (
    QUANT_BACKENDS,
    QUANT_METHODS,
    backend_status,
    convert_qat,
    prepare_qat,
    quantize_dynamic,
    quantize_static,
    run_batches,
    save_format,
)
from ._sensitivity import LayerSensitivity, layer_sensitivity, ratios_from_sensitivity

__all__ = ["CompressConfig", "CompressReport", "compress"]


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

    def problems(self, model_path: str | None = None) -> list[str]:
        """Every problem with this config, each naming the option, its value and the choices."""
        p = ProblemCollector()
        if self.prune is not None and self.prune not in PRUNE_METHODS:
            p.add(f"--prune {self.prune!r} is unknown; valid: {', '.join(PRUNE_METHODS)}.")
        if self.quantize is not None and self.quantize not in QUANT_METHODS:
            p.add(f"--quantize {self.quantize!r} is unknown; valid: {', '.join(QUANT_METHODS)}.")
        if self.quant_backend not in QUANT_BACKENDS:
            p.add(f"quant_backend={self.quant_backend!r} is unknown; valid: {', '.join(QUANT_BACKENDS)}.")
        if self.importance not in IMPORTANCES:
            p.add(f"--importance {self.importance!r} is unknown; valid: {', '.join(IMPORTANCES)}.")
        if self.goal not in GOALS:
            p.add(f"--goal {self.goal!r} is unknown; valid: {', '.join(GOALS)}.")
        if self.prune is not None and not self.ratios:
            p.add("--ratios is empty; give pruning ratios in (0, 1), e.g. --ratios 0.3,0.5.")
        for r in self.ratios:
            if not (isinstance(r, (int, float)) and 0.0 < float(r) < 1.0):
                p.add(f"ratio {r!r} is outside (0, 1); a ratio is the fraction removed, e.g. 0.5.")
        if not self.max_accuracy_drop >= 0:
            p.add(f"--max-accuracy-drop {self.max_accuracy_drop!r} must be >= 0 (metric units, 0.01 = 1 point).")
        if self.finetune_epochs < 0:
            p.add(f"--finetune-epochs {self.finetune_epochs!r} must be >= 0.")
        if self.baseline_epochs is not None and self.baseline_epochs < 1:
            p.add(f"baseline_epochs={self.baseline_epochs!r} must be >= 1.")
        if self.round_to is not None and self.round_to < 1:
            p.add(f"--round-to {self.round_to!r} must be >= 1.")
        if not self.temperature > 0:
            p.add(f"temperature={self.temperature!r} must be > 0.")
        if not 0.0 <= self.alpha <= 1.0:
            p.add(f"alpha={self.alpha!r} must be in [0, 1].")
        if self.calib_batches < 1:
            p.add(f"calib_batches={self.calib_batches!r} must be >= 1.")
        if self.distill and self.finetune_epochs == 0 and self.quantize != "qat":
            p.add("--distill teaches during fine-tuning; give --finetune-epochs >= 1.")
        if self.out is not None:
            out = Path(self.out)
            if model_path is not None and _same_file(out, Path(model_path)):
                p.add(f"--out {self.out!r} is the original model file; the original is never "
                      "overwritten, choose another path.")
            elif out.exists() and not self.force:
                p.add(f"--out {self.out!r} exists; pass --force to replace it, or choose another path.")
            if not out.parent.exists():
                p.add(f"--out {self.out!r}: folder {str(out.parent)!r} does not exist.")
        return p.problems


@dataclass
class CompressReport:
    """The measured baseline and candidates, the selection and where it was saved."""

    task: str
    metric: str
    goal: str
    max_accuracy_drop: float
    device: str
    threads: int | None
    baseline: Candidate
    candidates: list[Candidate]
    selected: Candidate | None
    output: str | None
    profile: dict[str, Any]
    plan: list[str]
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    run_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        def cand(c: Candidate | None) -> dict[str, Any] | None:
            if c is None:
                return None
            d = c.to_dict()
            d.pop("path", None)
            return d

        return {
            "task": self.task, "metric": self.metric, "goal": self.goal,
            "max_accuracy_drop": self.max_accuracy_drop, "device": self.device,
            "threads": self.threads, "baseline": cand(self.baseline),
            "candidates": [cand(c) for c in self.candidates],
            "selected": cand(self.selected), "output": self.output,
            "load": (LOAD_LINES[self.selected.format].format(path=self.output)
                     if self.selected is not None and self.output else None),
            "profile": self.profile, "plan": self.plan, "sensitivity": self.sensitivity,
            "notes": self.notes, "plots": self.plots, "run_id": self.run_id,
        }


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def compress(
    task: Task | str,
    config: CompressConfig | None = None,
    *,
    params: dict[str, Any] | None = None,
    model: nn.Module | str | Path | None = None,
    store: Store | str | None = None,
    db: str | None = None,
    callbacks: Sequence[Callback] = (),
    **overrides: Any,
) -> CompressReport:
    """Compress ``task``'s model under an accuracy budget and record a ``compress`` Run.

    ``model`` is the trained original (a module, or a file saved with ``torch.save(model)`` or a
    state dict for ``task.build_model(params)``); without it the task is trained first with the
    fit loop. ``overrides`` set :class:`CompressConfig` fields, e.g. ``prune="structured"``.
    The original model and its file are never modified.
    """
    cfg = _config(config, overrides)
    model_path = str(model) if isinstance(model, (str, Path)) else None
    problems = cfg.problems(model_path)
    task_obj = load_task(task)
    merged = validate_params({**task_obj.default_params, **(params or {})})
    dev = resolve_device(cfg.device)
    if cfg.quantize is not None:
        problems += _backend_problems(cfg, dev)
    if model_path is not None and not Path(model_path).is_file():
        problems.append(f"--model {model_path!r} is not a file.")
    if problems:
        raise ConfigError(problems)
    run_config = {"params": merged, **{k: v for k, v in dataclasses.asdict(cfg).items()},
                  "model": model_path}
    with tracked_run("compress", task_obj, config=run_config, device=dev, store=store, db=db) as run:
        report = _Compressor(task_obj, merged, cfg, dev, callbacks).run(model)
        report.run_id = run.id
        sel = report.selected
        metrics = {f"baseline_{cfg.metric}": report.baseline.metric}
        if sel is not None:
            metrics.update({f"selected_{cfg.metric}": sel.metric, "selected_params": float(sel.params),
                            "selected_macs": float(sel.macs), "selected_size_bytes": float(sel.size_bytes),
                            "selected_latency_ms": sel.latency_ms})
        result = report.to_dict()
        result.pop("run_id", None)
        run.set(metrics=metrics, result=result,
                artifacts={"output": report.output, "plots": report.plots})
    return report


def _config(config: CompressConfig | None, overrides: dict[str, Any]) -> CompressConfig:
    cfg = config or CompressConfig()
    names = {f.name for f in dataclasses.fields(CompressConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"compress() got unknown options {unknown}; valid: {', '.join(sorted(names))}.")
    if "ratios" in overrides and overrides["ratios"] is not None:
        overrides["ratios"] = tuple(overrides["ratios"])
    if "ignore_layers" in overrides and overrides["ignore_layers"] is not None:
        overrides["ignore_layers"] = tuple(overrides["ignore_layers"])
    return dataclasses.replace(cfg, **overrides)


def _backend_problems(cfg: CompressConfig, dev: torch.device) -> list[str]:
    assert cfg.quantize is not None
    status = backend_status(cfg.quantize, dev)
    if cfg.quant_backend == "auto":
        if all(reason is not None for reason in status.values()):
            why = "; ".join(f"{b}: {r}" for b, r in status.items())
            return [f"--quantize {cfg.quantize}: no quantization backend is available on {dev} ({why})."]
        return []
    reason = status.get(cfg.quant_backend)
    if reason is not None:
        return [f"quant_backend={cfg.quant_backend!r} cannot run --quantize {cfg.quantize} on {dev}: {reason}."]
    return []


class _Compressor:
    """One compress run: baseline, profile, plan, sweep, measure, select, save."""

    def __init__(self, task: Task, params: dict[str, Any], cfg: CompressConfig, dev: torch.device,
                 callbacks: Sequence[Callback]) -> None:
        self.task, self.params, self.cfg, self.dev = task, params, cfg, dev
        self.callbacks = list(callbacks)
        self.bs = int(params.get("batch_size", 32))
        self.metric_up = higher_is_better(cfg.metric)
        self.notes: list[str] = []
        self.plan: list[str] = []

    # -- the run ---------------------------------------------------------------------------
    def run(self, model: nn.Module | str | Path | None) -> CompressReport:
        cfg = self.cfg
        if model is None and cfg.prune == "structured":
            self._preflight()
        base = self._baseline(model).to(self.dev).eval()
        self.base = base
        self.base_metrics = evaluate_model(self.task, base, self.dev, self.bs)
        if cfg.metric not in self.base_metrics:
            raise ConfigError(f"--metric {cfg.metric!r} is not a metric of task {self.task.name!r}; "
                              f"its metrics: {', '.join(sorted(self.base_metrics))}.")
        batch = move_to_device(next(iter(self.task.val_data(self.bs))), self.dev)
        self.example = capture_inputs(self.task.loss, base, batch)
        self.example1 = slice_batch(self.example, 1)
        self.train_batch = move_to_device(next(iter(self.task.train_data(self.bs, self.params))), self.dev)
        profile = self._profile(base)
        prune, quant = self._plan(profile)
        ignored_names = self._ignored_names(base, prune)
        tmp = Path(tempfile.mkdtemp(prefix="proftune-compress-"))
        try:
            built: list[tuple[Candidate, Any, Any]] = []  # (candidate, loaded model, example)
            built.append(self._save_measure("baseline", 0.0, base, base, fmt="pickle", tmp=tmp))
            sens: list[LayerSensitivity] = []
            if prune == "structured" and cfg.sensitivity and not cfg.global_pruning:
                sens = self._sensitivity(base, ignored_names)
            for ratio in (cfg.ratios if prune is not None else ()):
                assert prune is not None
                pruned = self._prune(base, prune, float(ratio), ignored_names, sens)
                built.append(self._save_measure(prune, ratio, pruned, pruned, fmt="pickle", tmp=tmp,
                                                finetuned=True))
                if quant:
                    built.append(self._quantized(pruned, quant, f"{prune}+{quant}", ratio, tmp))
            if quant:
                built.append(self._quantized(base, quant, quant, 0.0, tmp))
            self._latencies(built)
            self._denormal_check(built[0])
            cands = [c for c, _, _ in built]
            baseline, others = cands[0], cands[1:]
            for c in cands:
                c.metric_drop = (baseline.metric - c.metric) if self.metric_up else (c.metric - baseline.metric)
            goal_key = GOALS[cfg.goal]
            mark_pareto(cands, goal_key, self.metric_up)
            selected = select(cands, goal_key, cfg.max_accuracy_drop)
            if selected is None:
                self.notes.append(
                    f"no candidate keeps the {cfg.metric} drop within {cfg.max_accuracy_drop}; nothing "
                    "saved. Loosen --max-accuracy-drop, lower --ratios or fine-tune longer.")
            if selected is not None and getattr(selected, goal_key) >= getattr(baseline, goal_key):
                self.notes.append(
                    f"the selected candidate is no better than the baseline on --goal {cfg.goal} "
                    f"({getattr(selected, goal_key):.4g} vs {getattr(baseline, goal_key):.4g}); the "
                    "model may be too small for this method to pay on this device.")
            output = self._write_out(selected)
            plots = self._plots(cands, selected) if cfg.plot_dir else []
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return CompressReport(
            task=self.task.name or type(self.task).__name__, metric=cfg.metric, goal=cfg.goal,
            max_accuracy_drop=cfg.max_accuracy_drop, device=str(self.dev),
            threads=cfg.threads if self.dev.type == "cpu" else None, baseline=baseline,
            candidates=others, selected=selected, output=output, profile=profile, plan=self.plan,
            sensitivity=[dataclasses.asdict(s) for s in sens], notes=self.notes, plots=plots,
        )

    # -- steps -----------------------------------------------------------------------------
    def _preflight(self) -> None:
        """Cut an untrained model once before training the baseline, so that a model Torch-Pruning
        cannot trace (or a bad --ignore-layers) is reported in seconds, not after training."""
        torch.manual_seed(self.cfg.seed)
        model = self.task.build_model(self.params).to(self.dev).eval()
        batch = move_to_device(next(iter(self.task.val_data(self.bs))), self.dev)
        example = capture_inputs(self.task.loss, model, batch)
        names = list(self.cfg.ignore_layers)
        resolve_layers(model, names)
        head = final_classifier(model, example)
        ignored = resolve_layers(model, [*names, *([head] if head and head not in names else [])])
        prune_structured(model, example, max(self.cfg.ratios), importance="l2", ignored=ignored,
                         round_to=self.cfg.round_to)

    def _baseline(self, model: nn.Module | str | Path | None) -> nn.Module:
        if model is None:
            epochs = self.cfg.baseline_epochs or self.task.default_epochs
            self.plan.append(f"baseline: trained {epochs} epochs with the fit loop (no --model given)")
            return fit(self.task, self.params, epochs=epochs, device=self.dev, seed=self.cfg.seed,
                       callbacks=self.callbacks).model
        if isinstance(model, nn.Module):
            return copy.deepcopy(model)
        loaded = torch.load(model, weights_only=False, map_location="cpu")
        if isinstance(loaded, nn.Module):
            return loaded
        if isinstance(loaded, dict):
            built = self.task.build_model(self.params)
            try:
                built.load_state_dict(loaded)
            except RuntimeError as exc:
                raise ConfigError(f"--model {str(model)!r} is a state dict that does not fit "
                                  f"{self.task.name}'s model for these params: {exc}") from exc
            return built
        raise ConfigError(f"--model {str(model)!r} holds a {type(loaded).__name__}; give a file saved "
                          "with torch.save(model) or torch.save(model.state_dict()).")

    def _profile(self, base: nn.Module) -> dict[str, Any]:
        """Where the parameters, MACs and (with ``layer_times``) the forward time sit, per layer.

        Read from the profiler's record (``proftune.profile``, inference, on the task's batch);
        without ``layer_times`` only its static counts are taken (cheaper, no timing).
        """
        if self.cfg.layer_times:
            from ..profile import profile as run_profile

            record = run_profile(base, inference=True, example_input=self.example, device=self.dev,
                                 steps=2, warmup=1, seed=self.cfg.seed)
            layers: list[dict[str, Any]] = [
                {"name": lp.name, "type": lp.type, "params": lp.params, "macs": lp.macs,
                 "forward_ms": lp.forward_ms, "time_share": lp.time_share,
                 "params_share": lp.params_share, "macs_share": lp.macs_share}
                for lp in record.layers]
            params_total, macs_total = record.params.total, record.macs
        else:
            from ..profile import count_model

            counts = count_model(base, self.example)
            params_total, macs_total = counts.params_total, counts.macs
            layers = [{"name": lc.name, "type": lc.type, "params": lc.params, "macs": lc.macs,
                       "params_share": lc.params / max(params_total, 1),
                       "macs_share": lc.macs / max(macs_total, 1)}
                      for lc in counts.layers.values()]
        by_type: dict[str, dict[str, float]] = {}
        for d in layers:
            agg = by_type.setdefault(d["type"], {"params_share": 0.0, "macs_share": 0.0, "time_share": 0.0})
            for key in agg:
                agg[key] += float(d.get(key) or 0.0)
        out = {
            "params": params_total, "macs": macs_total, "batch_size": self.bs,
            "top_params": sorted(layers, key=lambda d: -d["params"])[:5],
            "top_macs": sorted(layers, key=lambda d: -d["macs"])[:5],
            "by_type": by_type,
        }
        if self.cfg.layer_times:
            out["top_time"] = sorted(layers, key=lambda d: -d["time_share"])[:5]
        return out

    def _plan(self, profile: dict[str, Any]) -> tuple[str | None, str | None]:
        """The methods to run; chosen from where the parameters and MACs sit when none is given."""
        cfg = self.cfg
        by_type = profile["by_type"]
        conv_macs = sum(v["macs_share"] for t, v in by_type.items() if t.startswith("Conv"))
        dense_params = sum(v["params_share"] for t, v in by_type.items() if t in ("Linear", "LSTM", "NonDynamicallyQuantizableLinear"))
        prune, quant = cfg.prune, cfg.quantize
        if prune is None and quant is None:
            prune = "structured"
            quant = "static" if conv_macs >= 0.5 else "dynamic"
            self.plan.append(f"no method given: structured pruning (removes channels: fewer MACs and "
                             f"bytes) + {quant} INT8, because conv layers hold {conv_macs:.0%} of the "
                             f"MACs and Linear/LSTM layers {dense_params:.0%} of the parameters")
            if quant is not None and _backend_problems(dataclasses.replace(cfg, quantize=quant), self.dev):
                self.plan.append(f"{quant} INT8 skipped: no backend on {self.dev}")
                quant = None
        if quant == "dynamic":
            self.plan.append(f"dynamic INT8 quantizes Linear/LSTM, which hold {dense_params:.0%} of the "
                             "parameters" + ("; little to gain" if dense_params < 0.5 else ""))
        if quant in ("static", "qat"):
            self.plan.append(f"{quant} INT8 quantizes conv and Linear layers (conv: {conv_macs:.0%} of MACs)")
        if prune == "unstructured":
            self.notes.append("unstructured pruning zeroes weights but keeps tensors dense: dense "
                              "kernels run no faster and the dense file is no smaller; sparse_size_bytes "
                              "is the size when stored sparse (CSR) where that is smaller.")
        if prune == "structured":
            top = profile["top_macs"][:3]
            self.plan.append("structured pruning where the MACs are: " + ", ".join(
                f"{d['name']} ({d['macs_share']:.0%})" for d in top))
        if "top_time" in profile:
            self.plan.append(f"forward time (profile, batch {self.bs}): " + ", ".join(
                f"{d['name']} {d['type']} {d['time_share']:.0%}" for d in profile["top_time"][:3]))
            conv_time = profile["by_type"].get("Conv2d", {}).get("time_share", 0.0)
            dense_time = sum(v.get("time_share", 0.0) for t, v in profile["by_type"].items()
                             if t in ("Linear", "LSTM", "NonDynamicallyQuantizableLinear"))
            if quant == "dynamic" and dense_time < 0.3:
                self.notes.append(f"Linear/LSTM layers take only {dense_time:.0%} of the forward time; "
                                  "dynamic INT8 cannot speed up the rest (static INT8 covers conv).")
            if quant == "static" and conv_time + dense_time < 0.3:
                self.notes.append("conv and Linear layers take under 30% of the forward time; INT8 "
                                  "will change little.")
        return prune, quant

    def _ignored_names(self, base: nn.Module, prune: str | None) -> list[str]:
        names = list(self.cfg.ignore_layers)
        resolve_layers(base, names)
        if prune == "structured":
            head = final_classifier(base, self.example)
            if head and head not in names:
                names.append(head)
                self.plan.append(f"kept the final classifier {head!r} whole (its outputs are the classes)")
        return names

    def _score(self, model: nn.Module) -> float:
        value = evaluate_model(self.task, model, self.dev, self.bs)[self.cfg.metric]
        return value if self.metric_up else -value

    def _taylor_loss(self) -> Callable[[nn.Module], torch.Tensor] | None:
        if self.cfg.importance != "taylor":
            return None
        return lambda m: self.task.loss(m, self.train_batch)

    def _sensitivity(self, base: nn.Module, ignored_names: list[str]) -> list[LayerSensitivity]:
        probe = max(self.cfg.ratios)
        sens = layer_sensitivity(
            base, self.example, ratio=probe, baseline=self._score(base), score=self._score,
            importance=self.cfg.importance, ignored=resolve_layers(base, ignored_names),
            round_to=self.cfg.round_to, taylor_loss=self._taylor_loss(),
        )
        if len(sens) > 1:
            self.plan.append(f"per-layer sensitivity at ratio {probe}: each layer cut alone, "
                             f"{self.cfg.metric} drop measured; ratios set inversely to the drop")
        return sens

    def _prune(self, base: nn.Module, method: str, ratio: float, ignored_names: list[str],
               sens: list[LayerSensitivity]) -> nn.Module:
        cfg = self.cfg
        model = copy.deepcopy(base)
        ignored = resolve_layers(model, ignored_names)
        if method == "structured":
            ratio_dict = None
            if len(sens) > 1:
                table = dict(model.named_modules())
                ratio_dict = {table[k]: v for k, v in ratios_from_sensitivity(sens, ratio).items()}
            prune_structured(model, self.example, ratio, importance=cfg.importance,
                             global_pruning=cfg.global_pruning, ignored=ignored, round_to=cfg.round_to,
                             ratio_dict=ratio_dict, taylor_loss=self._taylor_loss())
        else:
            prune_unstructured(model, ratio, global_pruning=cfg.global_pruning,
                               importance=cfg.importance, ignored=ignored, permanent=False)
        if cfg.finetune_epochs > 0:
            self._fit(model, cfg.finetune_epochs)
        if method == "unstructured":
            make_permanent(model)
        return model.eval()

    def _fit(self, model: nn.Module, epochs: int) -> None:
        task: Task = self.task
        if self.cfg.distill:
            task = DistillationTask(self.task, copy.deepcopy(self.base), temperature=self.cfg.temperature,
                                    alpha=self.cfg.alpha)
        fit(task, self.params, model=model, epochs=epochs, device=self.dev, seed=self.cfg.seed,
            callbacks=self.callbacks)

    def _quantized(self, float_model: nn.Module, method: str, name: str, ratio: float,
                   tmp: Path) -> tuple[Candidate, Any, Any]:
        cfg = self.cfg
        status = backend_status(method, self.dev, float_model)
        wanted = [b for b in ("torch.ao", "torchao") if cfg.quant_backend in ("auto", b)]
        usable = [b for b in wanted if status.get(b) is None]
        if not usable:
            why = "; ".join(f"{b}: {status[b]}" for b in wanted)
            raise ConfigError(f"--quantize {method}: no backend can quantize this model on {self.dev} ({why}).")
        built: dict[str, tuple[Candidate, Any, Any]] = {}
        for backend in usable:
            qmodel = self._quantize_with(float_model, method, backend)
            built[backend] = self._save_measure(name, ratio, qmodel, float_model, fmt=save_format(backend),
                                                tmp=tmp, tag=backend.replace(".", ""))
        if len(built) > 1:
            self._latencies(list(built.values()))
        times: dict[str, float | str] = {b: c.latency_batch_ms for b, (c, _, _) in built.items()}
        for b in wanted:
            if status.get(b) is not None:
                times[b] = f"unavailable: {status[b]}"
        for b in ("torch.ao", "torchao"):
            if b not in wanted:
                times.setdefault(b, "not requested")
        best = min(built, key=lambda b: built[b][0].latency_batch_ms)
        cand = built[best][0]
        cand.quant_backend = best
        cand.backend_ms = times
        if len(built) > 1:
            cand.notes.append(f"backend {best} chosen: fastest at batch {self.bs} on {self.dev} "
                              f"({', '.join(f'{b} {c.latency_batch_ms:.3f} ms' for b, (c, _, _) in built.items())})")
        return built[best]

    def _quantize_with(self, float_model: nn.Module, method: str, backend: str) -> nn.Module:
        if method == "dynamic":
            return quantize_dynamic(float_model, backend=backend)
        cpu_example = move_to_device(self.example, torch.device("cpu"))
        calib_data = DeviceIterable(self.task.train_data(self.bs, self.params), torch.device("cpu"))
        if method == "static":
            calibrate = run_batches(self.task.loss, calib_data, self.cfg.calib_batches)
            return quantize_static(float_model, cpu_example, calibrate)
        prepared = prepare_qat(float_model, cpu_example)
        self._fit(prepared, max(1, self.cfg.finetune_epochs))
        return convert_qat(prepared)

    def _save_measure(self, method: str, ratio: float, model: Any, float_model: nn.Module, *, fmt: str,
                      tmp: Path, finetuned: bool = False, tag: str = "") -> tuple[Candidate, Any, Any]:
        """Save, reload, check the outputs match, and measure all but latency."""
        quantized = fmt != "pickle"
        dev = torch.device("cpu") if fmt == "torchscript" else self.dev
        example = move_to_device(self.example, dev)
        suffix = ".pt2" if fmt == "export" else ".pt"
        path = tmp / f"{method.replace('+', '_')}_{ratio:g}{'_' + tag if tag else ''}{suffix}"
        model_dev = model.to(dev) if isinstance(model, nn.Module) and not quantized else model
        save_model(model_dev, path, example, fmt=fmt)
        loaded = load_model(path)
        if isinstance(loaded, nn.Module) and fmt == "pickle":
            loaded = loaded.to(dev).eval()
        with torch.no_grad():
            diff = (call(loaded, example).float() - call(model_dev, example).float()).abs().max()
        metrics = self._evaluate(loaded, dev, fmt)
        params, macs = count(float_model, move_to_device(self.example1, self.dev))
        cand = Candidate(
            method=method, ratio=float(ratio), metric=float(metrics[self.cfg.metric]), metric_drop=0.0,
            params=params, macs=macs, size_bytes=file_size(path), latency_ms=float("nan"),
            latency_batch_ms=float("nan"), batch_size=self.bs, metrics=metrics, format=fmt,
            reload_max_abs_diff=float(diff),
            finetune_epochs=self.cfg.finetune_epochs if finetuned else 0,
            distilled=bool(self.cfg.distill and finetuned and self.cfg.finetune_epochs > 0),
            path=str(path),
        )
        if method == "unstructured":
            nz = sum(int((p != 0).sum()) for p in float_model.parameters())
            cand.nonzero_params = nz
            cand.sparsity = sparsity(float_model)
            sparse = sparse_size_bytes(float_model)
            cand.sparse_size_bytes = sparse if sparse < cand.size_bytes else None
            cand.notes.append("dense kernels get no speedup from zeroed weights")
        if quantized:
            cand.notes.append("params and macs are the float model's (INT8 stores each weight in 1 byte)")
        return cand, loaded, example

    def _evaluate(self, model: Any, dev: torch.device, fmt: str) -> dict[str, float]:
        if fmt != "export":
            return evaluate_model(self.task, model, dev, self.bs)
        with torch.no_grad():  # an exported program has no train/eval switch
            metrics = self.task.evaluate(model, DeviceIterable(self.task.val_data(self.bs), dev))
        return {k: float(v) for k, v in metrics.items()}

    def _latencies(self, built: list[tuple[Candidate, Any, Any]]) -> None:
        """Interleaved latency runs of every built model at batch 1 and the task's batch size."""
        by_dev: dict[str, list[tuple[Candidate, Any, Any]]] = {}
        for item in built:
            ex = item[2]
            key = str(next(iter(_tensors(ex))).device) if _tensors(ex) else "cpu"
            by_dev.setdefault(key, []).append(item)
        for key, items in by_dev.items():
            ex = items[0][2]
            inputs = [LatencyInput(1, slice_batch(ex, 1)), LatencyInput(self.bs, ex)]
            models = {str(i): m for i, (_, m, _) in enumerate(items)}
            times = measure_latencies(models, inputs, device=torch.device(key), threads=self.cfg.threads,
                                      rounds=self.cfg.latency_rounds, flush_denormal=self.cfg.flush_denormal)
            for i, (cand, _, _) in enumerate(items):
                cand.latency_ms = times[str(i)][1]
                cand.latency_batch_ms = times[str(i)][self.bs]
                if cand.quant_backend and not isinstance(cand.backend_ms.get(cand.quant_backend), str):
                    cand.backend_ms[cand.quant_backend] = cand.latency_batch_ms

    def _denormal_check(self, baseline: tuple[Candidate, Any, Any]) -> None:
        """Say so when the float baseline runs much slower with denormals left on (torch's default)."""
        if not self.cfg.flush_denormal or self.dev.type != "cpu":
            return
        cand, model, ex = baseline
        slow = measure_latencies({"b": model}, [LatencyInput(self.bs, ex)], device=self.dev,
                                 threads=self.cfg.threads, rounds=1, flush_denormal=False)["b"][self.bs]
        if slow > 1.3 * cand.latency_batch_ms:
            self.notes.append(
                f"latencies are measured with denormals flushed to zero; with torch's default (not "
                f"flushed) the float baseline takes {slow:.3f} ms at batch {self.bs} instead of "
                f"{cand.latency_batch_ms:.3f} ms: call torch.set_flush_denormal(True) when serving it.")

    def _write_out(self, selected: Candidate | None) -> str | None:
        if selected is None or self.cfg.out is None:
            return None
        assert selected.path is not None
        out = Path(self.cfg.out)
        shutil.copyfile(selected.path, out)
        return str(out)

    def _plots(self, cands: list[Candidate], selected: Candidate | None) -> list[str]:
        from ._plot import plot_tradeoffs

        assert self.cfg.plot_dir is not None
        return plot_tradeoffs(cands, selected, Path(self.cfg.plot_dir), metric=self.cfg.metric)


def _tensors(example: Any) -> list[torch.Tensor]:
    if isinstance(example, torch.Tensor):
        return [example]
    if isinstance(example, (tuple, list)):
        return [t for e in example for t in _tensors(e)]
    if isinstance(example, dict):
        return [t for v in example.values() for t in _tensors(v)]
    return []

