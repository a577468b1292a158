"""What ``proftune optimize`` leaves in ``--out``: config.yaml, summary.json, plots, the report."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .._jsonsafe import finite_float, json_dumps, json_safe
from .._optional import pyplot
from .._paths import replacing, write_text
from .._report_writers import report_writer
from ..exceptions import DependencyError
from ._records import ComputeOutputs, FinalOutputs, LayerValueOutputs, SearchStageOutputs

if TYPE_CHECKING:
    from ._result_records import OptimizeResult
    from ._state import OptimizeState

__all__ = ["few_values", "load_line", "write_html", "write_outputs", "write_summary"]

log = logging.getLogger(__name__)


def _config_yaml(result: OptimizeResult, state: OptimizeState) -> object:
    """Every parameter of the final configuration, its value, and where the value came from."""
    fin = state.record(FinalOutputs)
    params, evidence = fin.params, fin.evidence
    comp = {r["name"]: r for r in state.record(ComputeOutputs).recommendations}
    final = result.final.to_dict()
    out: dict[str, dict[str, object]] = {}
    for name in sorted(params):
        ev = str(evidence.get(name, "task default"))
        kind = ("searched" if ev.startswith("searched") else "computed" if ev.startswith("computed")
                else "measured" if name in comp else "default")
        entry: dict[str, object] = {"value": params[name], "source": kind, "evidence": ev}
        if name in comp and kind == "computed":
            entry["evidence"] = f"{ev}: {comp[name]['reason']}"
        out[name] = entry
    return json_safe({"task": result.task, "objective": result.objective, "study": result.study,
                      "decision": result.vs_baseline.summary, "params": out,
                      "final": {k: final[k] for k in ("mean", "std", "test", "latency_ms", "size_bytes", "model",
                                                      "load")},
                      "load": load_line(result)})


def few_values(srch: SearchStageOutputs) -> str | None:
    """Why the search's plot has no line: fewer than two of its trials produced a value (how many
    did, what became of the others, why the search stopped); None where two or more did."""
    if srch.trials_log:
        valued, total = sum(1 for t in srch.trials_log if finite_float(t.value) is not None), len(srch.trials_log)
    else:
        valued, total = len(srch.history), srch.trials
    if valued >= 2:
        return None
    states = ", ".join(f"{v} {k.lower()}" for k, v in srch.counts.items() if v)
    return (f"{valued} of {total} trial(s) produced a value" + (f" ({states})" if states else "")
            + (f"; the search stopped: {srch.stop_reason}" if srch.stop_reason else ""))


def load_line(result: OptimizeResult) -> str:
    """Python that rebuilds the result's model from this folder's files, from any directory."""
    folder = Path(result.out).resolve()
    return ("import torch, yaml, proftune; "
            f"cfg = yaml.safe_load(open({str(folder / 'config.yaml')!r})); "
            "params = {k: v['value'] for k, v in cfg['params'].items()}; "
            f"model = proftune.load_task({(result.spec or result.task)!r}).build_model(params); "
            f"model.load_state_dict(torch.load({str(folder / 'model.pt')!r}, weights_only=True))")


def _plots(result: OptimizeResult, state: OptimizeState, folder: Path) -> list[str]:
    try:
        plt = pyplot("optimize's PNG plots")
    except DependencyError as exc:
        log.info("%s; the report has none", exc)
        return []
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    srch = state.record(SearchStageOutputs)
    hist = srch.history
    if hist or srch.trials:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.step([h[0] for h in hist], [h[1] for h in hist], where="post", marker="o", label="best so far")
        empty = few_values(srch)
        if empty:  # a line needs two trials with a value: say why there is none
            ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", wrap=True, fontsize=9,
                    color="#c92a2a")
        base = result.vs_baseline.baseline
        if base is not None:
            ax.axhline(base, color="grey", linestyle="--", label="baseline (defaults)")
        ax.set_xlabel("trial")
        ax.set_ylabel(result.objective.split(":")[0])
        ax.legend()
        ax.set_title("search: best value by trial")
        fig.tight_layout()
        with replacing(folder / "search.png") as tmp:  # never a half-written plot where a finished one belongs
            fig.savefig(tmp, dpi=100)
        plt.close(fig)
        files.append(str(folder / "search.png"))
    layers = state.record(LayerValueOutputs).layers
    if layers:
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(layers)), 3.5))
        xs = range(len(layers))
        ax.bar([x - 0.2 for x in xs], [lv.time_share or 0 for lv in layers], 0.4, label="time share")
        ax.bar([x + 0.2 for x in xs], [lv.value_share or 0 for lv in layers], 0.4, label="value share")
        ax.set_xticks(list(xs), [f"{lv.name}\n{lv.type}" for lv in layers], fontsize=7)
        ax.legend()
        ax.set_title("layer value: share of step time vs share of the measured contribution", fontsize=9)
        fig.tight_layout()
        with replacing(folder / "layer_value.png") as tmp:  # never a half-written plot where a finished one belongs
            fig.savefig(tmp, dpi=100)
        plt.close(fig)
        files.append(str(folder / "layer_value.png"))
    stages = [s for s in result.stages if s.duration_s]
    if stages:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.barh([s.name for s in stages], [s.duration_s or 0 for s in stages], label="spent")
        ax.barh([s.name for s in stages], [s.share_s or 0 for s in stages], fill=False,
                edgecolor="black", label="share")
        ax.set_xlabel("seconds")
        ax.legend()
        ax.invert_yaxis()
        fig.tight_layout()
        with replacing(folder / "stages.png") as tmp:  # never a half-written plot where a finished one belongs
            fig.savefig(tmp, dpi=100)
        plt.close(fig)
        files.append(str(folder / "stages.png"))
    return files


def write_html(run_id: int, out: Path, store: Any) -> str | None:
    """The HTML report of the optimize run, where the report feature registered its writer
    (``proftune.report`` does on import): the run as it is recorded once its outputs are written
    (its result stored, not yet finished)."""
    write_report = report_writer("html")
    if write_report is None:
        return None
    record = dataclasses.replace(store.get_run(run_id), status="finished")
    return str(write_report(record, out / "report.html", store=store))


def write_outputs(result: OptimizeResult, state: OptimizeState, out: Path) -> dict[str, str]:
    """Write config.yaml and the PNGs; the paths of every output file (summary.json written last:
    the result's ``files``)."""
    files = {"config": str(out / "config.yaml"), "summary": str(out / "summary.json"),
             "model": str(out / "model.pt")}
    write_text(out / "config.yaml", yaml.safe_dump(_config_yaml(result, state), sort_keys=False))
    if result.final.compressed is not None:
        files["model_compressed"] = str(out / "model_compressed.pt")
    for i, path in enumerate(_plots(result, state, out / "plots")):
        files[f"plot{i}"] = path
    return files


def write_summary(result: OptimizeResult, out: Path) -> None:
    """``summary.json``: the result as ``--json`` prints it, with the files written; once, last."""
    write_text(out / "summary.json", json_dumps({**result.to_dict(), "files": result.files}, indent=1))
