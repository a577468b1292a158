"""One compress run: baseline, profile, plan, sweep, measure as saved, select, save."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._device import DeviceIterable, call_model, capture_inputs, move_to_device, slice_batch
from ..exceptions import ConfigError
from ..metrics import direction
from ..profile import size_bytes, time_forwards
from ..task import Task
from ..train import Callback, TrainParams, evaluate_model, fit
from ._checkpoint import Rebuild, load_model, read_model, save_model
from ._compile import compiler_status, get_compiler, providers_of
from ._config import CompressConfig, backend_problems
from ._distill import DistillationTask
from ._half import HalfPrecision, save_half
from ._measure import count, sparse_size_bytes, tensors_of
from ._methods import COMPRESS_METHODS, MethodContext
from ._pipeline import GOAL_METRICS, Candidate, choose
from ._plan import Plan, ProfileSummary, plan_methods, profile_summary
from ._prune import (
    final_classifier,
    make_permanent,
    prune_structured,
    prune_unstructured,
    resolve_layers,
    sparsity,
)
from ._quant_backends import BACKEND_NAMES, QuantInputs, backend_status, get_backend
from ._quantize import run_batches
from ._records import CompressResult
from ._sensitivity import LayerSensitivity, layer_sensitivity, ratios_from_sensitivity

__all__ = ["Compressor"]


def _joined(prefix: str, method: str) -> str:
    """The method name of ``method`` applied after ``prefix`` (``structured+fp16``)."""
    return f"{prefix}+{method}" if prefix else method

#: (candidate, the model loaded back from its file, the example inputs on its device)
Built = tuple[Candidate, Any, Any]


class Compressor:
    """One compress run over ``task`` with ``cfg`` on ``dev``; :meth:`run` returns the report."""

    def __init__(self, task: Task, given: TrainParams, cfg: CompressConfig, dev: torch.device, *,
                 callbacks: Sequence[Callback] = (), rebuild: Rebuild | None = None,
                 trust_model: bool = False) -> None:
        #: the params as validated where the run was made: the fit loop takes them as they are
        self.given, self.params = given, given.params
        params = self.params
        self.task, self.cfg, self.dev = task, cfg, dev
        self.callbacks = list(callbacks)
        self.rebuild = rebuild or Rebuild(task=None, params=params)
        self.trust_model = trust_model
        self.bs = int(params.get("batch_size", 32))
        self.metric_up = True
        self.goal_up = direction(GOAL_METRICS[cfg.goal]) == "max"
        self.notes: list[str] = []
        self.plan: list[str] = []
        self.ends = time.monotonic() + cfg.time_limit_s if cfg.time_limit_s is not None else None
        self.left_out: list[str] = []

    def _out_of_time(self, what: str) -> bool:
        """True (and ``what`` noted as left out) once ``time_limit_s`` is spent."""
        if self.ends is None or time.monotonic() < self.ends:
            return False
        self.left_out.append(what)
        return True

    # -- the run ---------------------------------------------------------------------------
    def run(self, model: nn.Module | str | Path | None) -> CompressResult:
        cfg = self.cfg
        base = self._prepare(model)
        summary = profile_summary(self._profile(base))
        plan = self._plan(summary)
        tmp = Path(tempfile.mkdtemp(prefix="proftune-compress-"))
        try:
            built, sens = self._build_all(base, plan, tmp)
            self._latencies(built)
            self._denormal_check(built[0])
            cands = [c for c, _, _ in built]
            selected = self._select(cands)
            output = self._write_out(selected)
            plots = self._plots(cands, selected) if cfg.plot_dir else []
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return CompressResult(
            task=self.task.name or type(self.task).__name__, metric=cfg.metric, goal=cfg.goal,
            max_accuracy_drop=cfg.max_accuracy_drop, device=str(self.dev),
            threads=cfg.threads if self.dev.type == "cpu" else None, baseline=cands[0],
            candidates=cands[1:], selected=selected, output=output, profile=summary.to_dict(), plan=self.plan,
            sensitivity=[dataclasses.asdict(s) for s in sens], notes=self.notes, plots=plots,
            task_spec=self.rebuild.task,
        )

    def _prepare(self, model: nn.Module | str | Path | None) -> nn.Module:
        """The baseline in eval mode, its metrics, the metric's direction and example inputs."""
        cfg = self.cfg
        if model is None and cfg.prune == "structured":
            self._preflight()
        base = self._baseline(model).to(self.dev).eval()
        self.base = base
        self.base_metrics = evaluate_model(self.task, base, self.dev, self.bs)
        if cfg.metric not in self.base_metrics:
            raise ConfigError(f"metric={cfg.metric!r} is not a metric of task {self.task.name!r}; "
                              f"its metrics: {', '.join(sorted(self.base_metrics))}.")
        self.metric_up = direction(cfg.metric, task=self.task) == "max"
        batch = move_to_device(next(iter(self.task.val_data(self.bs))), self.dev)
        self.example = capture_inputs(self.task.loss, base, batch)
        self.example1 = slice_batch(self.example, 1)
        self.train_batch = move_to_device(next(iter(self.task.train_data(self.bs, self.params))), self.dev)
        return base

    def _build_all(self, base: nn.Module, plan: Plan, tmp: Path) -> tuple[list[Built], list[LayerSensitivity]]:
        """The baseline and every candidate, each saved, reloaded and measured (all but latency)."""
        cfg = self.cfg
        ignored_names = self._ignored_names(base, plan.prune)
        built = [self._save_measure("baseline", 0.0, base, tmp=tmp)]
        floats: list[tuple[str, float, nn.Module]] = [("", 0.0, base)]
        sens: list[LayerSensitivity] = []
        if plan.prune == "structured" and cfg.sensitivity and not cfg.global_pruning:
            sens = self._sensitivity(base, ignored_names)
        if plan.prune is not None:
            for ratio in cfg.ratios:
                if self._out_of_time(f"{plan.prune} {ratio:g}"):
                    continue
                pruned = self._prune(base, plan.prune, float(ratio), ignored_names, sens)
                built.append(self._save_measure(plan.prune, ratio, pruned, tmp=tmp, finetuned=True))
                floats.append((plan.prune, float(ratio), pruned))
                if plan.quant and not self._out_of_time(f"{plan.prune}+{plan.quant} {ratio:g}"):
                    q = self._quantized(pruned, plan.quant, f"{plan.prune}+{plan.quant}", ratio, tmp)
                    built.extend([q] if q is not None else [])
        if plan.quant and not self._out_of_time(plan.quant):
            q = self._quantized(base, plan.quant, plan.quant, 0.0, tmp)
            built.extend([q] if q is not None else [])
        for prefix, ratio, model in floats:
            if plan.half and not self._out_of_time(_joined(prefix, "fp16")):
                built.append(self._half(model, _joined(prefix, "fp16"), ratio, tmp))
            for engine in plan.compile:
                if self._out_of_time(_joined(prefix, engine)):
                    continue
                found = self._compiled(model, engine, _joined(prefix, engine), ratio, tmp)
                if found is not None:
                    built.append(found)
            for name in cfg.methods:
                if not self._out_of_time(_joined(prefix, name)):
                    built.extend(self._own_method(model, name, _joined(prefix, name), ratio, tmp))
        if self.left_out:
            self.notes.append(f"not built, the time limit ({cfg.time_limit_s:.0f} s) spent: "
                              + ", ".join(self.left_out))
        return built, sens

    def _select(self, cands: list[Candidate]) -> Candidate | None:
        """Drops against the baseline, the Pareto front, and the best on the goal within budget."""
        selected, notes = choose(cands, goal=self.cfg.goal, metric=self.cfg.metric,
                                 max_drop=self.cfg.max_accuracy_drop, metric_up=self.metric_up,
                                 goal_up=self.goal_up)
        self.notes.extend(notes)
        return selected

    # -- steps -----------------------------------------------------------------------------
    def _preflight(self) -> None:
        """Cut an untrained model once before training the baseline, so that a model Torch-Pruning
        cannot trace (or a bad --ignore-layers) is reported in seconds, not after training."""
        torch.manual_seed(self.cfg.seed)
        model = self.task.build_model(self.params).to(self.dev).eval()
        batch = move_to_device(next(iter(self.task.val_data(self.bs))), self.dev)
        example = capture_inputs(self.task.loss, model, batch)
        ignored = resolve_layers(model, self._ignored_names(model, "structured", example, note=False))
        prune_structured(model, example, max(self.cfg.ratios), importance="l2", ignored=ignored,
                         round_to=self.cfg.round_to)

    def _baseline(self, model: nn.Module | str | Path | None) -> nn.Module:
        if model is None:
            epochs = self.cfg.baseline_epochs or self.task.default_epochs
            self.plan.append(f"baseline: trained {epochs} epochs with the fit loop (no --model given)")
            return fit(self.task, self.given, epochs=epochs, device=self.dev, seed=self.cfg.seed,
                       callbacks=self.callbacks).model
        if isinstance(model, nn.Module):
            return copy.deepcopy(model)
        return read_model(model, task=self.task, params=self.params, trust=self.trust_model,
                          name="model", trust_name="trust_model")

    def _profile(self, base: nn.Module) -> Any:
        """The baseline's inference profile on the task's batch (``proftune.profile``): per-layer
        time with ``layer_times``, else the cheaper ``detail="step"`` (counts, no layer timing)."""
        from ..profile import profile as run_profile

        timed = self.cfg.layer_times
        return run_profile(base, inference=True, example_input=self.example, device=self.dev,
                           steps=2 if timed else 1, warmup=1 if timed else 0,
                           detail="full" if timed else "step", seed=self.cfg.seed)

    def _plan(self, summary: ProfileSummary) -> Plan:
        cfg = self.cfg
        possible = {m: not backend_problems(dataclasses.replace(cfg, quantize=m), self.dev)
                    for m in ("dynamic", "static")}
        plan = plan_methods(summary, prune=cfg.prune, quant=cfg.quantize, quant_possible=possible,
                            half=cfg.half, compile=cfg.compile, target=cfg.target, methods=cfg.methods)
        status = compiler_status(self.dev)
        for engine in [e for e in plan.compile if status.get(e) is not None]:  # a preset's engine
            plan.lines.append(f"{engine} skipped: {status[engine]}")
        plan.compile = tuple(e for e in plan.compile if status.get(e) is None)
        self.plan.extend(plan.lines)
        self.notes.extend(plan.notes)
        return plan

    def _ignored_names(self, base: nn.Module, prune: str | None, example: Any = None, *,
                       note: bool = True) -> list[str]:
        """The layers left whole: those named (checked), and for structured pruning the final classifier."""
        names = list(self.cfg.ignore_layers)
        resolve_layers(base, names)
        if prune == "structured":
            head = final_classifier(base, self.example if example is None else example)
            if head and head not in names:
                names.append(head)
                if note:
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
        fit(task, self.given, model=model, epochs=epochs, device=self.dev, seed=self.cfg.seed,
            callbacks=self.callbacks)

    def _quantized(self, float_model: nn.Module, method: str, name: str, ratio: float, tmp: Path) -> Built | None:
        """Every usable backend's INT8 model of ``float_model``, measured; the fastest is kept
        (None when every backend failed on this model: the notes say why)."""
        cfg = self.cfg
        status = backend_status(method, self.dev, float_model)
        wanted = [b for b in BACKEND_NAMES if cfg.quant_backend in ("auto", b)]
        usable = [b for b in wanted if status.get(b) is None]
        if not usable:
            why = "; ".join(f"{b}: {status[b]}" for b in wanted)
            raise ConfigError(f"quantize={method!r}: no backend can quantize this model on {self.dev} ({why}).")
        built: dict[str, Built] = {}
        for name_ in usable:
            backend = get_backend(name_, method)
            assert backend is not None
            try:
                qmodel = backend.quantize(float_model, self._quant_inputs())
                built[name_] = self._save_measure(name, ratio, qmodel, float_model=float_model,
                                                  fmt=backend.save_format, tmp=tmp, tag=name_.replace(".", "_"))
            except (RuntimeError, AttributeError, TypeError, ValueError, NotImplementedError, AssertionError) as exc:
                # one backend that cannot convert or save this model (a TorchScript trace of a
                # quantized transformer layer, ...) is a finding about that backend, not the end
                status[name_] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                self.notes.append(f"{name} with {name_} skipped: {status[name_]}")
        if not built:
            return None
        if len(built) > 1:
            self._latencies(list(built.values()))
        times: dict[str, float | str] = {b: c.latency_batch_ms for b, (c, _, _) in built.items()}
        for b in BACKEND_NAMES:
            times.setdefault(b, f"unavailable: {status[b]}" if b in wanted else "not requested")
        best = min(built, key=lambda b: built[b][0].latency_batch_ms)
        cand = built[best][0]
        cand.quant_backend = best
        cand.backend_ms = times
        if len(built) > 1:
            cand.notes.append(f"backend {best} chosen: fastest at batch {self.bs} on {self.dev} "
                              f"({', '.join(f'{b} {c.latency_batch_ms:.3f} ms' for b, (c, _, _) in built.items())})")
        return built[best]

    def _half(self, float_model: nn.Module, name: str, ratio: float, tmp: Path) -> Built:
        """``float_model`` with fp16 weights (inputs cast on the way in), saved as an export graph."""
        half = HalfPrecision(float_model.to(self.dev))
        example = move_to_device(self.example, self.dev)
        path = tmp / f"{name.replace('+', '_')}_{ratio:g}.pt"
        save_half(half, path, example)
        loaded = load_model(path).to(self.dev)
        return self._measured(name, ratio, float_model, half, loaded, path=path, fmt="export",
                              notes=["weights in fp16: half the bytes; the latency is this device's "
                                     "fp16 speed (x86 CPUs without AVX512-FP16 convert, GPUs have tensor cores)"])

    def _own_method(self, float_model: nn.Module, name: str, label: str, ratio: float,
                    tmp: Path) -> list[Built]:
        """A registered method's model of ``float_model`` (a copy), saved, reloaded and measured;
        nothing (with a note) when the method cannot run here."""
        method = COMPRESS_METHODS.get_entry(name)
        why = method.unavailable(self.dev)
        if why is not None:
            self.notes.append(f"{label} skipped: {why}")
            return []
        context = MethodContext(example=move_to_device(self.example, self.dev), task=self.task,
                                params=dict(self.params), device=self.dev, finetune=self._fit)
        model = method.apply(copy.deepcopy(float_model).to(self.dev).eval(), context).eval()
        return [self._save_measure(label, ratio, model, tmp=tmp, fmt=method.save_format,
                                   float_model=float_model)]

    def _compiled(self, float_model: nn.Module, engine: str, name: str, ratio: float, tmp: Path) -> Built | None:
        """``float_model`` compiled by ``engine``, loaded back from its file and checked against the
        eager model on the validation data; None (with a note) when the engine cannot take it."""
        compiler = get_compiler(engine)
        model = float_model.to(self.dev).eval()
        example = move_to_device(self.example, self.dev)
        path = tmp / f"{name.replace('+', '_')}_{ratio:g}{compiler.suffix}"
        started = time.perf_counter()
        try:
            compiler.compile(model, example, path, device=self.dev)
            loaded = compiler.load(path, device=self.dev, threads=self.cfg.threads if self.dev.type == "cpu" else None)
            with torch.no_grad():
                call_model(loaded, example)
        except Exception as exc:  # noqa: BLE001 - an engine that cannot trace this model skips, the sweep goes on
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            self.notes.append(f"{name} (ratio {ratio:g}) skipped: {engine} could not compile the model "
                              f"({type(exc).__name__}: {first}).")
            return None
        seconds = time.perf_counter() - started
        notes = [f"compiled by {engine} in {seconds:.1f} s"]
        providers = providers_of(loaded)
        if providers:
            notes.append(f"ONNX Runtime providers: {', '.join(providers)}")
        return self._measured(name, ratio, float_model, model, loaded, path=path, fmt=compiler.save_format,
                              notes=notes, agreement=True)

    def _measured(self, name: str, ratio: float, float_model: nn.Module, model: nn.Module, loaded: nn.Module, *,
                  path: Path, fmt: str, notes: list[str], agreement: bool = False,
                  dev: torch.device | None = None) -> Built:
        """A candidate from a model saved as ``path`` and loaded back as ``loaded`` (run on ``dev``):
        its outputs against ``model``'s on the example (and, with ``agreement``, against the eager
        ``float_model`` on every validation batch), its metric, counts and size."""
        dev = dev or self.dev
        example = move_to_device(self.example, dev)
        with torch.no_grad():
            diff = (call_model(loaded, example).float() - call_model(model, example).float()).abs().max()
        metrics = evaluate_model(self.task, loaded, dev, self.bs)
        params, macs = count(float_model, move_to_device(self.example1, self.dev))
        cand = Candidate(
            method=name, ratio=float(ratio), metric=float(metrics[self.cfg.metric]), metric_drop=0.0,
            params=params, macs=macs, size_bytes=size_bytes(path), latency_ms=float("nan"),
            latency_batch_ms=float("nan"), batch_size=self.bs, metrics=metrics, format=fmt,
            reload_max_abs_diff=float(diff), path=str(path), notes=list(notes),
            eager_max_abs_diff=self._agreement(float_model, loaded) if agreement else None,
        )
        return cand, loaded, example

    @torch.no_grad()
    def _agreement(self, eager: nn.Module, compiled: nn.Module) -> float:
        """The largest absolute difference between the outputs of ``compiled`` and ``eager`` over
        every validation batch (the inputs the task's loss feeds the model)."""
        eager = eager.to(self.dev).eval()
        worst = 0.0
        for batch in self.task.val_data(self.bs):
            inputs = capture_inputs(self.task.loss, eager, move_to_device(batch, self.dev))
            a, b = call_model(eager, inputs), call_model(compiled, inputs)
            for x, y in zip(tensors_of(a), tensors_of(b), strict=True):
                worst = max(worst, float((x.float() - y.float()).abs().max()))
        return worst

    def _quant_inputs(self) -> QuantInputs:
        cpu = torch.device("cpu")
        calib_data = DeviceIterable(self.task.train_data(self.bs, self.params), cpu)
        return QuantInputs(example=move_to_device(self.example, cpu),
                           calibrate=run_batches(self.task.loss, calib_data, self.cfg.calib_batches),
                           train=lambda prepared: self._fit(prepared, max(1, self.cfg.finetune_epochs)))

    def _save_measure(self, method: str, ratio: float, model: nn.Module, *, tmp: Path,
                      float_model: nn.Module | None = None, fmt: str = "state", finetuned: bool = False,
                      tag: str = "") -> Built:
        """Save, reload, check the outputs match, and measure all but latency.

        ``float_model``: the float model a quantized ``model`` came from (its params and MACs).
        """
        float_model = float_model if float_model is not None else model
        dev = torch.device("cpu") if fmt == "torchscript" else self.dev
        example = move_to_device(self.example, dev)
        path = tmp / f"{method.replace('+', '_')}_{ratio:g}{'_' + tag if tag else ''}.pt"
        model_dev = model.to(dev) if fmt == "state" else model
        fmt, loaded = self._save_load(model_dev, path, example, fmt)
        loaded = loaded.to(dev) if fmt == "state" else loaded
        built = self._measured(method, ratio, float_model, model_dev, loaded, path=path, fmt=fmt, notes=[], dev=dev)
        cand = built[0]
        cand.finetune_epochs = self.cfg.finetune_epochs if finetuned else 0
        cand.distilled = bool(self.cfg.distill and finetuned and self.cfg.finetune_epochs > 0)
        self._annotate(cand, float_model, quantized=float_model is not model)
        return built

    def _save_load(self, model: nn.Module, path: Path, example: Any, fmt: str) -> tuple[str, nn.Module]:
        """Write ``model`` in ``fmt`` and load it back as a user would. A float model whose weights
        do not fit the task's model (a trusted pickled module of another shape) goes to export."""
        save_model(model, path, example, fmt=fmt, rebuild=self.rebuild)
        if fmt != "state":
            return fmt, load_model(path)
        try:
            return fmt, load_model(path, task=self.task)
        except ConfigError:
            save_model(model, path, example, fmt="export")
            return "export", load_model(path)

    def _annotate(self, cand: Candidate, float_model: nn.Module, *, quantized: bool) -> None:
        if cand.method == "unstructured":
            cand.nonzero_params = sum(int((p != 0).sum()) for p in float_model.parameters())
            cand.sparsity = sparsity(float_model)
            sparse = sparse_size_bytes(float_model)
            cand.sparse_size_bytes = sparse if sparse < cand.size_bytes else None
            cand.notes.append("dense kernels get no speedup from zeroed weights")
        if quantized:
            cand.notes.append("params and macs are the float model's (INT8 stores each weight in 1 byte)")

    def _latencies(self, built: list[Built]) -> None:
        """Interleaved latency runs of every built model at batch 1 and the task's batch size."""
        by_dev: dict[str, list[Built]] = {}
        for item in built:
            tensors = tensors_of(item[2])
            by_dev.setdefault(str(tensors[0].device) if tensors else "cpu", []).append(item)
        for key, items in by_dev.items():
            ex = items[0][2]
            models = {str(i): m for i, (_, m, _) in enumerate(items)}
            times = time_forwards(models, {1: slice_batch(ex, 1), self.bs: ex}, device=torch.device(key),
                                  threads=self.cfg.threads, rounds=self.cfg.latency_rounds,
                                  flush_denormal=self.cfg.flush_denormal)
            for i, (cand, _, _) in enumerate(items):
                cand.latency_ms = times[str(i)][1].ms
                cand.latency_batch_ms = times[str(i)][self.bs].ms
                if cand.quant_backend and not isinstance(cand.backend_ms.get(cand.quant_backend), str):
                    cand.backend_ms[cand.quant_backend] = cand.latency_batch_ms

    def _denormal_check(self, baseline: Built) -> None:
        """Say so when the float baseline runs much slower with denormals left on (torch's default)."""
        if not self.cfg.flush_denormal or self.dev.type != "cpu":
            return
        cand, model, ex = baseline
        slow = time_forwards({"b": model}, {self.bs: ex}, device=self.dev, threads=self.cfg.threads,
                             rounds=1, flush_denormal=False)["b"][self.bs].ms
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
