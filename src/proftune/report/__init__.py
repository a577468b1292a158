"""Reports for people and exports to the tools they keep experiments in.

- :func:`write_report` / :func:`render_report`: one self-contained HTML page for a run, a
  study, or a saved profile (plotly.js inlined, opens offline from ``file://``);
  :func:`write_compare_report`: two runs side by side.
- :func:`register_renderer`: how a kind of run (a plug-in's, or a built-in page) adds its sections, with
  what a page is drawn with: :func:`read_result` (the Run's record, or why not), the figures
  (:func:`bar`, :func:`line`, :func:`hline`, :func:`vline`, :func:`layout`, ``PALETTE``), the
  cells (:class:`Cell`, :func:`clipped`, :func:`esc`, :func:`fmt_number`, :func:`plot_text`) and
  the charts other pages share (:func:`candidate_charts`, :func:`importance_charts`,
  :func:`lr_chart`, :func:`memory_model_chart`, :func:`sensitivity_chart`).
- :func:`export_tensorboard`, :class:`TensorBoardLogger`; :func:`export_mlflow`,
  :class:`MLflowLogger`; :func:`export_wandb`, :class:`WandbLogger`: the same numbers in
  TensorBoard, MLflow and Weights & Biases (offline too); :class:`WandbTrialLogger`: a study's
  trials in W&B as they end (``search(on_trial=)``).
"""

from __future__ import annotations

from .._callable import make_callable as _make_callable
from ..script import report
from ._build import (
    compare_html,
    render_report,
    run_id_of,
    run_page,
    write_compare_report,
    write_report,
)
from ._common import RENDERERS, Context, read_result, register_renderer
from ._compress_page import candidate_charts, sensitivity_chart
from ._figures import PALETTE, bar, hline, layout, line, vline
from ._html import Cell, Page, Section, clipped, esc, fmt_number, plot_text
from ._loggers import MLflowLogger, TensorBoardLogger, WandbLogger
from ._mlflow import export_mlflow
from ._recommend_page import lr_chart, memory_model_chart
from ._tensorboard import export_tensorboard
from ._tune_page import importance_charts
from ._wandb import WandbRun, WandbTrialLogger, export_wandb

__all__ = [
    "PALETTE",
    "RENDERERS",
    "Cell",
    "Context",
    "MLflowLogger",
    "Page",
    "Section",
    "TensorBoardLogger",
    "WandbLogger",
    "WandbRun",
    "WandbTrialLogger",
    "bar",
    "candidate_charts",
    "clipped",
    "compare_html",
    "esc",
    "export_mlflow",
    "export_tensorboard",
    "export_wandb",
    "fmt_number",
    "hline",
    "importance_charts",
    "layout",
    "line",
    "lr_chart",
    "memory_model_chart",
    "plot_text",
    "read_result",
    "register_renderer",
    "render_report",
    "report",
    "run_id_of",
    "run_page",
    "sensitivity_chart",
    "vline",
    "write_compare_report",
    "write_report",
]

# ``proftune.report(val_acc=0.9, step=3)`` inside a launched script: the subpackage is the one object.
_make_callable(__name__)
