"""Reports for people and exports to the tools they keep experiments in.

- :func:`write_report` / :func:`render_report`: one self-contained HTML page for a run, a
  study, or a saved profile (plotly.js inlined, opens offline from ``file://``);
  :func:`write_compare_report`: two runs side by side.
- :func:`register_renderer`: how another kind of run (``optimize``) adds its sections.
- :func:`export_tensorboard`, :class:`TensorBoardLogger`; :func:`export_mlflow`,
  :class:`MLflowLogger`: the same numbers in TensorBoard and MLflow.
"""

from __future__ import annotations

from ._build import (
    compare_html,
    render_report,
    run_id_of,
    run_page,
    write_compare_report,
    write_report,
)
from ._html import Page, Section
from ._loggers import MLflowLogger, TensorBoardLogger
from ._mlflow import export_mlflow
from ._sections import Context, register_renderer
from ._tensorboard import export_tensorboard

__all__ = [
    "Context",
    "MLflowLogger",
    "Page",
    "Section",
    "TensorBoardLogger",
    "compare_html",
    "export_mlflow",
    "export_tensorboard",
    "register_renderer",
    "render_report",
    "run_id_of",
    "run_page",
    "write_compare_report",
    "write_report",
]
