"""Meet users in the training code they already have: Lightning, Hugging Face, plain loops.

- a LightningModule (with its LightningDataModule) is a task for every command, without user
  code (:class:`LightningTask`; ``proftune profile lit.py:LitModel --data lit.py:DigitsData``);
- :mod:`proftune.integrations.lightning` and :mod:`proftune.integrations.transformers` hold a
  ``ProftuneCallback`` for ``lightning.Trainer`` and ``transformers.Trainer``: the Monitor's
  sampled profile and the health checks' findings, recorded as a ``profile`` Run.

Nothing here imports Lightning or transformers until it is used.
"""

from __future__ import annotations

from ._dispatch import foreign_task, foreign_task_in, resolve_object, task_with_data
from ._emit import EMIT_FORMATS, emit_snippet
from ._hf_task import HFModelTask
from ._lightning_task import LightningTask

__all__ = [
    "EMIT_FORMATS",
    "HFModelTask",
    "LightningTask",
    "emit_snippet",
    "foreign_task",
    "foreign_task_in",
    "resolve_object",
    "task_with_data",
]
