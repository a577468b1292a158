"""``proftune.optimize``: the closed loop in one resumable call.

baseline -> health -> compute -> layer_value -> search -> final -> compress, each stage a Run
(kind ``optimize``, linked to the run's parent ``optimize`` Run) fed by the measured outputs of
the stages before it. Every stage calls the public API of the subpackage that owns the work.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._api import run_train
from .._device import resolve_device
from ..compress import compress as run_compress
from ..compress import task_latencies
from ..diagnose import AdaptiveLR, EarlyStopping, GradGuard, diagnose
from ..exceptions import ConfigError, RunFailedError
from ..profile import Profile
from ..profile import profile as run_profile
from ..recommend import recommend
from ..task import Task, load_task
from ..track import Store, data_fingerprint, environment, redact_url
from ..train import Callback, FitState, fit, validate_params
from ._budget import STAGES, Budget, Deadline
from ._config import OptimizeConfig, Validated, default_study, validate
from ._layer_value import keep_layers, layer_values
from ._output import write_html, write_outputs
from ._search import SearchSettings, run_search_stage
from ._space import build_plan, task_param_defaults
from ._state import OptimizeState, own_run

log = logging.getLogger(__name__)

__all__ = ["OptimizeResult", "optimize"]

Progress = Callable[[str, dict[str, Any]], None]
#: Below this many seconds the compress stage is skipped (imports + one pruned and one INT8
#: candidate measured as saved take ~20-30 s on 2 shared cores).
MIN_COMPRESS_S = 15.0
#: What the search keeps back for the compress stage (measured: 25-50 s for one structured ratio
#: and INT8 on digits-cnn on 2 shared cores, imports included).
COMPRESS_RESERVE_S = 40.0


@dataclass
class OptimizeResult:
    """What the loop produced: each stage's record, the final configuration and model, the gain."""

    task: str
    study: str
    run_id: int
    out: str
    objective: str
    budget_s: float
    elapsed_s: float
    stages: list[dict[str, Any]]
    final: dict[str, Any]
    vs_baseline: dict[str, Any]
    flags: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    layer_findings: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "study": self.study, "run_id": self.run_id, "out": self.out,
                "objective": self.objective, "budget_s": self.budget_s, "elapsed_s": self.elapsed_s,
                "stages": self.stages, "final": self.final, "vs_baseline": self.vs_baseline,
                "flags": self.flags, "warnings": self.warnings, "layer_findings": self.layer_findings,
                "files": self.files}


@dataclass
class _StageResult:
    outputs: dict[str, Any]
    before: float | None = None
    after: float | None = None
    status: str = "finished"


class _Capture(Callback):
    """Keeps the fit loop's model at the end (diagnose returns findings, not the model)."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None

    def on_fit_end(self, state: FitState) -> None:
        self.model = state.model


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class _Loop:
    """One optimize run: its task, options, Store, state file and clock."""

    def __init__(self, task: Task, v: Validated, store: Store, progress: Progress | None) -> None:
        self.task, self.v, self.cfg, self.store = task, v, v.cfg, store
        self.name = task.name or type(task).__name__
        self.dev = resolve_device(self.cfg.device)
        self.say: Progress = progress or (lambda _event, _data: None)
        self.out = v.out
        self.out.mkdir(parents=True, exist_ok=True)
        identity = {"task": self.name, "study": self.cfg.study or default_study(self.name),
                    "objective": v.objective, "budget_s": v.budget_s}
        self.state = OptimizeState.load_or_new(self.out, identity)
        self.study: str = self.state.data["study"]
        self.budget = Budget(v.budget_s, spent_s=float(self.state.data.get("spent_s", 0.0)))
        self.defaults = validate_params(dict(task.default_params))
        self.run_id = self._parent_run()

    # -- records ------------------------------------------------------------------------------
    def _parent_run(self) -> int:
        stored = self.state.data.get("run_id")
        if stored is not None:
            self.store.update_run(int(stored), status="running", ended_at=None)
            return int(stored)
        config = {"stage": None, "budget_s": self.v.budget_s, "objective": self.v.objective,
                  "params": self.defaults, "out": str(self.out), "study": self.study,
                  "options": {k: redact_url(v) if k == "db" and v else v
                              for k, v in vars(self.cfg).items() if k != "extra"}}
        run_id = self.store.start_run("optimize", self.name, config=config, env=environment(self.dev),
                                      data_fingerprint=data_fingerprint(self.task, self.defaults),
                                      study=self.study)
        self.state.data["run_id"] = run_id
        self.state.save()
        return run_id

    def stage(self, name: str, fn: Callable[[float, float], _StageResult]) -> dict[str, Any]:
        """Run stage ``name`` (unless it finished before) as a Run linked to the optimize run."""
        if self.state.finished(name):
            self.say("stage_reused", {"stage": name})
            return self.state.outputs(name)
        share = self.budget.stage_s(name)
        self.say("stage_start", {"stage": name, "share_s": share})
        started = time.monotonic()
        run_id = self.store.start_run("optimize", self.name, config={
            "stage": name, "optimize_run": self.run_id, "share_s": share, "study": self.study},
            parent_id=self.run_id, study=self.study)
        try:
            res = fn(share, started + share)
        except BaseException as exc:
            self.store.finish_run(run_id, status="failed", error=f"{type(exc).__name__}: {exc}")
            self.state.stages[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                                       "run_id": run_id, "share_s": share,
                                       "duration_s": time.monotonic() - started}
            self.state.save()
            raise
        duration = time.monotonic() - started
        metrics = {k: x for k, x in (("before", res.before), ("after", res.after)) if x is not None}
        self.store.finish_run(run_id, status="finished", result=res.outputs,
                              metrics={f"{self.v.metric}_{k}": x for k, x in metrics.items()})
        self.state.stages[name] = {"status": res.status, "duration_s": duration, "share_s": share,
                                   "run_id": run_id, "outputs": res.outputs,
                                   "metric_before": res.before, "metric_after": res.after}
        self.state.data["spent_s"] = self.budget.elapsed_s
        self.state.save()
        self.say("stage_end", {"stage": name, "duration_s": duration, "status": res.status,
                               "before": res.before, "after": res.after})
        return res.outputs

    # -- stages -------------------------------------------------------------------------------
    def baseline(self, share: float, end: float) -> _StageResult:
        """The task's defaults (trained with the health checks) and a no-tricks run beside it."""
        epochs = self.task.default_epochs
        capture = _Capture()
        diag = diagnose(self.task, self.defaults, epochs=epochs, device=self.dev, seed=self.cfg.seed,
                        callbacks=[Deadline(share * 0.55), capture], store=self.store)
        if capture.model is not None:
            torch.save(capture.model.state_dict(), self.out / "baseline_model.pt")
        defaults_metric = _finite(diag.metrics.get(self.v.metric))
        known = task_param_defaults(self.task)
        plain = {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.0,
                 "batch_size": int(self.defaults.get("batch_size", 32)),
                 **{k: 0.0 for k in known if "dropout" in k}}
        # as many epochs as the defaults got, so that the spread compares like with like
        plain_res = fit(self.task, plain, epochs=max(1, diag.epochs), device=self.dev, seed=self.cfg.seed,
                        callbacks=[Deadline(max(1.0, end - time.monotonic(), 1.2 * diag.duration_s))])
        plain_metric = _finite(plain_res.metrics.get(self.v.metric))
        # seconds per epoch of the plain loop (the health checks slow the defaults' run)
        epoch_s = plain_res.duration_s / max(plain_res.steps, 1) * max(
            plain_res.steps / max(plain_res.epochs, 1), _steps_per_epoch(self.task, self.defaults))
        spread = (abs(defaults_metric - plain_metric)
                  if defaults_metric is not None and plain_metric is not None else None)
        return _StageResult({
            "defaults": {"params": self.defaults, "metrics": diag.metrics, "epochs": diag.epochs,
                         "steps": diag.steps, "duration_s": diag.duration_s, "run_id": diag.run_id,
                         "stop_reason": diag.stop_reason},
            "no_tricks": {"params": plain, "metrics": plain_res.metrics, "epochs": plain_res.epochs,
                          "duration_s": plain_res.duration_s},
            "spread": spread, "epoch_s": epoch_s,
            "findings": [f.to_dict() for f in diag.findings],
            "model": "baseline_model.pt" if capture.model is not None else None,
        }, before=plain_metric, after=defaults_metric)

    def health(self, share: float, end: float) -> _StageResult:
        """Stop on an error-severity finding of the baseline's training; profile its step."""
        base = self.state.outputs("baseline")
        findings = base.get("findings") or []
        errors = [f for f in findings if f.get("severity") == "error"]
        warnings = [f for f in findings if f.get("severity") == "warning"]
        if errors and not self.cfg.ignore_findings:
            lines = [f"the baseline's training has {len(errors)} error finding(s); the loop stops before "
                     "any search (pass --ignore-findings to go on anyway):"]
            for f in errors:
                lines.append(f"  [{f['severity']}] {f['cause']}: {f['summary']}")
                lines.append(f"    evidence: {f['evidence']}")
                lines.append(f"    fix: {f['fix']}")
            raise RunFailedError("\n".join(lines))
        prof = run_profile(self.task, params=self.defaults, device=self.dev, seed=self.cfg.seed,
                           store=self.store)
        prof.save(self.out / "profile.json")
        return _StageResult({
            "errors": errors, "warnings": warnings, "ignored": bool(errors),
            "profile": "profile.json", "step_time_ms": prof.step.time_ms,
            "peak_memory_bytes": prof.memory.peak_bytes, "params": prof.params.total, "macs": prof.macs,
            "throughput": prof.step.throughput,
        })

    def compute(self, share: float, end: float) -> _StageResult:
        """Batch size, LR (range test, scaled), accumulation, precision, data loading: recommend()."""
        prof = Profile.load(self.out / "profile.json")
        small = share < 60
        recs = recommend(self.task, self.defaults, profile=prof, memory_budget=self.v.memory_bytes,
                         device=self.dev, seed=self.cfg.seed, lr_steps=50 if small else 100,
                         noise_steps=15 if small else 30, store=self.store)
        values = {r.name: r.value for r in recs}
        computed: dict[str, Any] = {}
        if isinstance(values.get("batch_size"), int):
            computed["batch_size"] = values["batch_size"]
        if _finite(values.get("lr")) is not None:
            computed["lr"] = float(values["lr"])
        if isinstance(values.get("grad_accumulation"), int):
            computed["grad_accumulation"] = values["grad_accumulation"]
        if values.get("precision") in ("fp32", "bf16", "fp16"):
            computed["precision"] = values["precision"]
        max_batch = recs.get("batch_size").evidence.get("max_batch_size")
        return _StageResult({
            "computed": computed, "max_batch_size": max_batch, "run_id": recs.run_id,
            "recommendations": [{"name": r.name, "value": r.value, "reason": r.reason,
                                 "confidence": r.confidence, "effect": r.effect} for r in recs],
        })

    def layer_value(self, share: float, end: float) -> _StageResult:
        """Each layer's cost (time, params, MACs) beside its measured contribution (mean ablation)."""
        prof = Profile.load(self.out / "profile.json")
        model = self.task.build_model(dict(self.defaults))
        model.load_state_dict(torch.load(self.out / "baseline_model.pt", weights_only=True))
        base, values, notes = layer_values(
            self.task, model, metric=self.v.metric, higher_is_better=self.v.maximize, profile=prof,
            device=self.dev, batch_size=int(self.defaults.get("batch_size", 32)), deadline=end)
        named = [{"layer": x.name, "finding": x.finding, "action": x.action} for x in values if x.finding]
        return _StageResult({"metric": base, "layers": [x.to_dict() for x in values], "findings": named,
                             "keep": keep_layers(values), "notes": notes})

    def search(self, share: float, end: float) -> _StageResult:
        """Search what the compute stage could not decide (70/20/10, auto-stop, yellow flags)."""
        comp = self.state.outputs("compute")
        base = self.state.outputs("baseline")
        plan = build_plan(self.task, comp.get("computed") or {}, user_space=self.cfg.space,
                          max_batch=comp.get("max_batch_size"), samples=_samples(self.task, self.defaults))
        epoch_s = max(float(base.get("epoch_s") or 1.0), 1e-3)
        epochs = max(1, min(self.task.default_epochs, int(share * 0.9 / (10 * epoch_s))))
        settings = SearchSettings(
            objective=self.v.objective, metric=self.v.metric, maximize=self.v.maximize,
            constraints=tuple(self.cfg.constraints), epochs=epochs, study=self.study, seed=self.cfg.seed,
            device=str(self.dev), max_trials=self.cfg.max_trials, patience=self.cfg.patience,
            min_delta=self.cfg.min_delta, flag_min=self.cfg.flag_min)
        spent = float(self.state.data.get("search_spent_s", 0.0))
        # leave the stages after it their minimum: every final seed at the trials' epochs (as long
        # as the trials measured so far take), and one compress sweep
        compress_min = COMPRESS_RESERVE_S if self.cfg.goal != "none" else 0.0

        def reserve(trial_s: float) -> float:
            return 1.3 * int(self.cfg.seeds) * max(trial_s, epochs * epoch_s) + compress_min

        # (``share`` already excludes what an earlier, killed process spent: the clock resumes)
        seconds = max(1.0, min(share, self.budget.left_s - reserve(0.0)))
        t0 = time.monotonic()

        def on_chunk(info: dict[str, Any]) -> None:
            self.state.data["search_spent_s"] = spent + time.monotonic() - t0
            self.state.data["spent_s"] = self.budget.elapsed_s
            self.state.save()
            self.say("search_chunk", info)

        outcome = run_search_stage(self.task, plan, settings, store=self.store, seconds=seconds,
                                   on_chunk=on_chunk, must_end=self.budget.end, reserve=reserve)
        for flag in outcome.flags:
            self.say("yellow_flag", flag.to_dict())
        best = outcome.best
        counts: dict[str, int] = {}
        for r in outcome.trials:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        (self.out / "search_trials.json").write_text(_json(outcome.trials))
        return _StageResult({
            "study": self.study, "plan": plan.to_dict(), "epochs_per_trial": epochs,
            "best": best, "top": outcome.groups[:5], "flags": [f.to_dict() for f in outcome.flags],
            "stop_reason": outcome.stop_reason, "arms": outcome.arms, "counts": counts,
            "trials": len(outcome.trials), "search_calls": outcome.search_calls,
            "history": outcome.history, "trials_file": "search_trials.json",
        }, after=best["mean"] if best else None)

    def final(self, share: float, end: float) -> _StageResult:
        """The chosen configuration for ``--seeds`` seeds with AdaptiveLR, GradGuard, EarlyStopping."""
        params, evidence = self._final_params()
        seeds = int(self.cfg.seeds)
        srch = self.state.outputs("search")
        best = srch.get("best") or {}
        trial_epochs = int(srch.get("epochs_per_trial") or self.task.default_epochs)
        base_epoch_s = float(self.state.outputs("baseline").get("epoch_s") or 1.0)
        # seconds per epoch at the chosen configuration, from its own trials where they exist
        epoch_s = (float(best["trial_s"]) / trial_epochs) if best.get("trial_s") else base_epoch_s
        epochs = max(min(trial_epochs, self.task.default_epochs),
                     min(self.task.default_epochs, int(share / (seeds * max(epoch_s, 1e-3)))))
        runs: list[dict[str, Any]] = []
        models: list[nn.Module] = []
        for i in range(seeds):
            seed = self.cfg.seed + 100 + i
            left = max(0.0, end - time.monotonic()) / (seeds - i)
            # a seed is not cut below the epochs its configuration was searched at while the
            # whole budget holds them (the compress stage then gets less); the budget comes first
            floor = min(1.3 * min(epochs, trial_epochs) * epoch_s,
                        max(0.0, self.budget.end - time.monotonic()) / (seeds - i))
            callbacks: list[Callback] = [
                AdaptiveLR(), GradGuard(),
                EarlyStopping(self.v.metric, mode="max" if self.v.maximize else "min", patience=3),
                Deadline(max(left, floor))]
            rep = run_train(self.task, params, epochs=epochs, device=self.dev,
                            seed=seed, callbacks=callbacks, store=self.store)
            runs.append({"seed": seed, "run_id": rep.run_id, "metrics": rep.result.metrics,
                         "epochs": rep.result.epochs, "stop_reason": rep.result.stop_reason})
            models.append(rep.result.model)
        vals = [_finite(r["metrics"].get(self.v.metric)) for r in runs]
        good = [v for v in vals if v is not None]
        mean = statistics.fmean(good) if good else None
        std = statistics.stdev(good) if len(good) > 1 else 0.0 if good else None
        # the model saved is the median seed's: representative, not the luckiest
        order = sorted(range(len(vals)), key=lambda i: (vals[i] is None, vals[i] or 0.0))
        pick = order[len(good) // 2] if good else 0
        model = models[pick].cpu().eval()
        torch.save(model.state_dict(), self.out / "model.pt")
        latency, size = _latency_ms(self.task, model), (self.out / "model.pt").stat().st_size
        return _StageResult({
            "params": params, "evidence": evidence, "seeds": runs, "epochs": epochs,
            "metric": {"name": self.v.metric, "mean": mean, "std": std, "values": vals},
            "model": "model.pt", "model_seed": runs[pick]["seed"], "latency_ms": latency, "size_bytes": size,
            "load": (f"model = proftune.load_task({self.name!r}).build_model(params); "
                     "model.load_state_dict(torch.load('model.pt', weights_only=True))"),
        }, after=mean)

    def compress(self, share: float, end: float) -> _StageResult:
        """The final model toward ``--goal`` within ``--max-accuracy-drop`` (proftune.compress)."""
        if self.cfg.goal == "none":
            return _StageResult({"skipped": "--goal none"}, status="skipped")
        fin = self.state.outputs("final")
        lv = self.state.outputs("layer_value")
        params = dict(fin["params"])
        model = self.task.build_model(dict(params))
        model.load_state_dict(torch.load(self.out / "model.pt", weights_only=True))
        names = {n for n, _ in model.named_modules()}
        keep = [n for n in (lv.get("keep") or []) if n in names]
        if share < MIN_COMPRESS_S:
            return _StageResult({"skipped": f"{share:.0f} s left for compression, below the "
                                            f"{MIN_COMPRESS_S:.0f} s one pruning + INT8 sweep needs here; "
                                            "give a larger --budget"}, status="skipped")
        # the sweep grows with the time there is: per-layer sensitivity and a second ratio
        # only when the share holds them (measured: ~45 s for one ratio with sensitivity on 2 cores)
        roomy = share >= 90
        ratios = (0.3, 0.5) if roomy else (0.5,)
        report = run_compress(
            self.task, params=params, model=model, store=self.store,
            callbacks=[Deadline(max(1.0, (end - time.monotonic()) / (2 * len(ratios))))],
            ratios=ratios, ignore_layers=tuple(keep), max_accuracy_drop=self.cfg.max_accuracy_drop,
            metric=self.v.metric, goal=self.cfg.goal, out=str(self.out / "model_compressed.pt"), force=True,
            finetune_epochs=1, seed=self.cfg.seed, device=str(self.dev), sensitivity=roomy,
            latency_rounds=5 if roomy else 3, layer_times=roomy)
        d = report.to_dict()
        sel = d.get("selected")
        base = d.get("baseline") or {}
        return _StageResult({
            "run_id": report.run_id, "plan": d.get("plan"), "notes": d.get("notes"),
            "ignored_layers": keep, "ratios": list(ratios),
            "baseline": {k: base.get(k) for k in ("metric", "latency_ms", "latency_batch_ms", "size_bytes",
                                                  "params", "macs")},
            "selected": ({k: sel.get(k) for k in ("method", "ratio", "metric", "metric_drop", "latency_ms",
                                                  "latency_batch_ms", "size_bytes", "params", "macs",
                                                  "format")} if sel else None),
            "candidates": [{k: c.get(k) for k in ("method", "ratio", "metric", "metric_drop", "latency_ms",
                                                  "latency_batch_ms", "size_bytes", "within_budget")}
                           for c in d.get("candidates") or []],
            "output": "model_compressed.pt" if report.output else None, "load": d.get("load"),
        }, before=_finite(base.get("metric")), after=_finite(sel.get("metric")) if sel else None)

    # -- helpers ------------------------------------------------------------------------------
    def _final_params(self) -> tuple[dict[str, Any], dict[str, str]]:
        comp = self.state.outputs("compute").get("computed") or {}
        srch = self.state.outputs("search")
        plan = srch.get("plan") or {}
        best = srch.get("best")
        params = dict(self.defaults)
        evidence = dict.fromkeys(params, "task default")
        for k, val in comp.items():
            params[k] = val
            evidence[k] = "computed (compute stage: recommend)"
        for k, val in (plan.get("space") or {}).get("fixed", {}).items():
            params[k] = val
            evidence.setdefault(k, "fixed in the space")
        searched = set((plan.get("space") or {}).get("params", {}))
        if best:
            for k, val in best["params"].items():
                params[k] = val
                if k not in searched:
                    continue
                std = f" +- {best['std']:.4g}" if best.get("std") is not None else ""
                evidence[k] = (f"searched (study {self.study}, trials {best['trials']}: {self.v.metric} "
                               f"{best['mean']:.4g}{std} over {best['n']} seed(s))")
        return validate_params(params), evidence

    def run(self) -> OptimizeResult:
        fns: dict[str, Callable[[float, float], _StageResult]] = {
            "baseline": self.baseline, "health": self.health, "compute": self.compute,
            "layer_value": self.layer_value, "search": self.search, "final": self.final,
            "compress": self.compress}
        try:
            for name in STAGES:
                self.stage(name, fns[name])
        except BaseException as exc:
            self.store.finish_run(self.run_id, status="failed", error=f"{type(exc).__name__}: {exc}",
                                  result={"stages": self.state.stages})
            raise
        result = self._result()
        result.files = write_outputs(result, self.state, self.out, task=self.task)
        self.store.finish_run(self.run_id, status="finished", result=result.to_dict(),
                              metrics={f"final_{self.v.metric}": result.final.get("mean") or float("nan")},
                              artifacts=result.files)
        html = write_html(self.run_id, self.out, self.store)  # reads the finished run
        if html is not None:
            result.files["report"] = html
            self.store.update_run(self.run_id, artifacts=result.files)
            (self.out / "summary.json").write_text(_json(result.to_dict()))
        return result

    def _result(self) -> OptimizeResult:
        st = self.state
        base_metric = st.stages["baseline"].get("metric_after")
        stages = []
        for name in STAGES:
            rec = st.stages.get(name, {})
            after = rec.get("metric_after")
            gain = None
            if after is not None and base_metric is not None:
                gain = (after - base_metric) if self.v.maximize else (base_metric - after)
            stages.append({"name": name, "status": rec.get("status"), "duration_s": rec.get("duration_s"),
                           "share_s": rec.get("share_s"), "run_id": rec.get("run_id"),
                           "metric_before": rec.get("metric_before"), "metric_after": after,
                           "gain_vs_baseline": gain, "outputs": _compact(name, rec.get("outputs") or {})})
        fin = st.outputs("final")
        comp = st.outputs("compress")
        sel = comp.get("selected")
        metric = fin.get("metric") or {}
        final = {"params": fin.get("params"), "evidence": fin.get("evidence"),
                 "metrics": {self.v.metric: {"mean": metric.get("mean"), "std": metric.get("std"),
                                             "values": metric.get("values")}},
                 "mean": metric.get("mean"), "std": metric.get("std"),
                 "model": str(self.out / "model.pt"), "load": fin.get("load"),
                 "latency_ms": fin.get("latency_ms"), "size_bytes": fin.get("size_bytes")}
        if sel:
            final["compressed"] = {**sel, "model": str(self.out / "model_compressed.pt"), "load": comp.get("load")}
            cb = comp.get("baseline") or {}
            final["latency_ms"] = cb.get("latency_ms", final["latency_ms"])
            final["latency_batch_ms"] = cb.get("latency_batch_ms")
            final["size_bytes"] = cb.get("size_bytes", final["size_bytes"])
        base = st.outputs("baseline")
        vs = {"metric": self.v.metric, "baseline": base_metric,
              "no_tricks": _finite((base.get("no_tricks") or {}).get("metrics", {}).get(self.v.metric)),
              "final_mean": metric.get("mean"), "final_std": metric.get("std")}
        if metric.get("mean") is not None and base_metric is not None:
            vs["gain"] = (metric["mean"] - base_metric) if self.v.maximize else (base_metric - metric["mean"])
        if sel:
            cb = comp.get("baseline") or {}
            vs["compressed_metric"] = sel.get("metric")
            for key in ("latency_ms", "latency_batch_ms", "size_bytes"):
                if cb.get(key) and sel.get(key):
                    vs[f"{key.replace('_ms', '').replace('_bytes', '')}_speedup" if "ms" in key
                       else "size_ratio"] = cb[key] / sel[key]
        srch = st.outputs("search")
        return OptimizeResult(
            task=self.name, study=self.study, run_id=self.run_id, out=str(self.out),
            objective=self.v.objective, budget_s=self.v.budget_s, elapsed_s=self.budget.elapsed_s,
            stages=stages, final=final, vs_baseline=vs, flags=srch.get("flags") or [],
            warnings=st.outputs("health").get("warnings") or [],
            layer_findings=st.outputs("layer_value").get("findings") or [])


def _compact(name: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """A stage's outputs for ``--json`` and the table: the decisions, not every measurement."""
    drop = {"search": ("history", "plan", "top"), "layer_value": ("layers",),
            "compute": ("recommendations",), "compress": ("candidates",), "final": ("evidence",)}
    return {k: v for k, v in outputs.items() if k not in drop.get(name, ())}


def _steps_per_epoch(task: Task, params: dict[str, Any]) -> int:
    data = task.train_data(int(params.get("batch_size", 32)), params)
    n = getattr(data, "__len__", None)
    return int(n()) if callable(n) else 1


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=1, default=str)


def _samples(task: Task, params: dict[str, Any]) -> int | None:
    """Training samples per epoch (an upper bound: batches x batch size), when the data has a length."""
    bs = int(params.get("batch_size", 32))
    data = task.train_data(bs, params)
    n = getattr(data, "__len__", None)
    return int(n()) * bs if callable(n) else None


def _latency_ms(task: Task, model: nn.Module) -> float | None:
    """Median forward time at batch 1 on CPU (eval mode, one thread), in ms; None when the task's
    loss does not feed the model inputs that can be sliced to one sample."""
    try:
        return task_latencies(task, model.cpu(), (1,), device=torch.device("cpu"), rounds=5)[1]
    except (ConfigError, RuntimeError, TypeError, ValueError) as exc:
        log.info("no latency for the final model: %s", exc)
        return None


def optimize(task: Task | str, budget: str | float = "20m", *, config: OptimizeConfig | None = None,
             store: Store | None = None, progress: Progress | None = None, **options: Any) -> OptimizeResult:
    """Run the closed loop on ``task`` within ``budget`` (``"5m"``, ``90``, ...) and return its result.

    ``options`` set :class:`OptimizeConfig` fields (``memory_budget``, ``constraints``,
    ``objective``, ``space``, ``max_accuracy_drop``, ``goal``, ``seeds``, ``out``, ``study``,
    ``resume``, ``ignore_findings``, ``device``, ``db``, ``seed``). The same call again with
    ``resume=True`` (or the same ``study``) continues from the last finished stage.
    ``progress(event, data)`` is called at each stage's start and end and after search chunks.
    """
    task_obj = load_task(task)
    v = validate(task_obj, config, {"budget": budget, **options})
    st = store or Store(v.cfg.db)
    with own_run(v.out, st, (v.stored or {}).get("study") or v.cfg.study):
        return _Loop(task_obj, v, st, progress).run()

