"""Meet users in the training code they already have: Lightning, Hugging Face, plain loops.

- any other ``nn.Module`` (class, instance, factory; ``timm:NAME``) is a classifier on
  synthetic data (:class:`ModuleTask`; ``--param input_shape=3x32x32`` where the model does
  not say its input);
- a LightningModule (with its LightningDataModule) is a task for every command, without user
  code (:class:`LightningTask`; ``proftune profile lit.py:LitModel --data lit.py:DigitsData``);
- :mod:`proftune.integrations.lightning` and :mod:`proftune.integrations.transformers` hold a
  ``ProftuneCallback`` for ``lightning.Trainer`` and ``transformers.Trainer``: the Monitor's
  sampled profile and the health checks' findings, recorded as a ``profile`` Run.

Nothing here imports Lightning or transformers until it is used.
"""

from __future__ import annotations

from ..task import TaskAdapter, register_task_adapter
from ._dispatch import foreign_task, foreign_task_in, resolve_object, task_with_data
from ._emit import EMIT_FORMATS, emit_snippet
from ._hf_task import HFModelTask
from ._lightning_task import LightningTask
from ._module_task import INPUT_SHAPE_PARAM, ModuleTask
from ._timm import TIMM_PREFIX, timm_task

# load_task takes what is not a Task through this adapter; proftune's __init__ imports this package
register_task_adapter(TaskAdapter("integrations", prefixes={TIMM_PREFIX: timm_task},
                                  from_object=foreign_task, from_namespace=foreign_task_in))

__all__ = [
    "EMIT_FORMATS",
    "INPUT_SHAPE_PARAM",
    "TIMM_PREFIX",
    "HFModelTask",
    "LightningTask",
    "ModuleTask",
    "emit_snippet",
    "foreign_task",
    "foreign_task_in",
    "resolve_object",
    "task_with_data",
    "timm_task",
]
