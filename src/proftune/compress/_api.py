"""``proftune.compress``: prune, fine-tune (optionally distilled), quantize, measure, select.

Every candidate is saved, reloaded and measured as saved: its metric on the task's validation
data, parameters and MACs (from the profiler's one counter), serialised size, and latency at
batch 1 and at the task's batch size. The selection is the best candidate on ``goal`` whose
metric drop stays within ``max_accuracy_drop``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from .._device import resolve_device
from ..exceptions import ConfigError
from ..task import Task, load_task
from ..track import Store, tracked_run
from ..train import Callback, TrainParams
from ._checkpoint import Rebuild, task_spec
from ._compressor import Compressor
from ._config import CompressConfig, backend_problems, compile_problems, merge_config
from ._records import CompressResult

__all__ = ["CompressConfig", "CompressResult", "compress"]


def compress(
    task: Task | str,
    config: CompressConfig | None = None,
    *,
    params: Mapping[str, Any] | None = None,
    model: nn.Module | str | Path | None = None,
    trust_model: bool = False,
    store: Store | str | None = None,
    db: str | None = None,
    callbacks: Sequence[Callback] = (),
    **overrides: Any,
) -> CompressResult:
    """Compress ``task``'s model under an accuracy budget and record a ``compress`` Run.

    ``model`` is the trained original: a module, or a file holding a state dict for
    ``task.build_model(params)`` (or a file ``compress`` wrote); a file holding a whole pickled
    module runs code while it loads and is read only with ``trust_model=True``. Without it the
    task is trained first with the fit loop. ``overrides`` set :class:`CompressConfig` fields,
    e.g. ``prune="structured"``. The original model and its file are never modified.
    """
    cfg = merge_config(config, overrides)
    model_path = str(model) if isinstance(model, (str, Path)) else None
    problems = cfg.problems(model_path)
    task_obj = load_task(task)
    given = TrainParams.of(task_obj, params)
    merged = given.params
    dev = resolve_device(cfg.device)
    if cfg.quantize is not None:
        problems += backend_problems(cfg, dev)
    problems += compile_problems(cfg, dev)
    if model_path is not None and not Path(model_path).is_file():
        problems.append(f"--model {model_path!r} is not a file.")
    if problems:
        raise ConfigError(problems)
    if model_path is not None:  # a file that is refused is refused before any Run is recorded
        from ._checkpoint import read_model

        model = read_model(model_path, task=task_obj, params=merged, trust=trust_model, name="model",
                           trust_name="trust_model")
    run_config = {"params": merged, **dataclasses.asdict(cfg), "model": model_path, "trust_model": trust_model}
    rebuild = Rebuild(task=task_spec(task, task_obj), params=merged)
    with tracked_run("compress", task_obj, config=run_config, device=dev, store=store, db=db) as run:
        report = dataclasses.replace(Compressor(task_obj, given, cfg, dev, callbacks=callbacks, rebuild=rebuild,
                                                trust_model=trust_model).run(model), run_id=run.id)
        run.set(metrics=_run_metrics(report), result={k: v for k, v in report.to_dict().items() if k != "run_id"},
                artifacts={"output": report.output, "plots": report.plots})
    return report


def _run_metrics(report: CompressResult) -> dict[str, float]:
    metrics = {f"baseline_{report.metric}": report.baseline.metric}
    sel = report.selected
    if sel is not None:
        metrics.update({f"selected_{report.metric}": sel.metric, "selected_params": float(sel.params),
                        "selected_macs": float(sel.macs), "selected_size_bytes": float(sel.size_bytes),
                        "selected_latency_ms": sel.latency_ms})
    return metrics
