"""Hugging Face: :class:`ProftuneCallback` for ``transformers.Trainer``.

```python
trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[ProftuneCallback(every=50)])
trainer.train()                        # a `profile` Run in ./proftune.db (or db=, $PROFTUNE_DB)
```
Importing this module needs transformers (``pip install 'proftune[hf]'``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._device import output_loss
from .._optional import require
from ..track import Store
from ._monitoring import MonitoringCallback

_hf: Any = require("transformers", feature=__name__)

__all__ = ["ProftuneCallback"]


class ProftuneCallback(MonitoringCallback, _hf.TrainerCallback):
    """The Monitor's sampled per-layer profile and the health checks, inside ``transformers.Trainer``.

    Every ``every``-th optimizer step is instrumented; ``health`` runs :class:`proftune.HealthCheck`
    (findings logged; ``stop_on_error`` stops training at a finding of severity ``error``);
    ``adapt`` adds :class:`proftune.GradGuard` and :class:`proftune.AdaptiveLR`. At the end the
    profile and findings are a Run of kind ``profile`` in ``store`` (a Store or a URL; ``db`` is the
    older spelling; default ``$PROFTUNE_DB`` or
    ``sqlite:///proftune.db``). The step's loss is the model's own (``ModelOutput.loss``).
    """

    def __init__(self, every: int = 50, health: bool = True, adapt: bool = False, db: str | None = None,
                 *, store: Store | str | None = None, stop_on_error: bool = False) -> None:
        super().__init__(every, health, adapt, db, store=store, stop_on_error=stop_on_error)
        self._losses: list[torch.Tensor] = []
        self._hook: Any = None

    def _catch_loss(self, module: Any, args: Any, output: Any) -> None:
        if module.training:
            loss = output_loss(output)
            if loss is not None:
                self._losses.append(loss.detach())

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            return
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
        self._start(model, inner)
        self._hook = model.register_forward_hook(self._catch_loss)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.resume()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        mon = self.monitor
        if mon is None:
            return
        loss = torch.stack(self._losses).float().mean() if self._losses else None
        self._losses.clear()
        if self._step(loss):
            control.should_training_stop = True
        if control.should_evaluate or control.should_save:
            mon.pause()  # what runs before the next step is not a step

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        if self.monitor is None or not metrics:
            return
        self._evaluated({("val_loss" if k == "eval_loss" else k.removeprefix("eval_")): float(v)
                         for k, v in metrics.items() if isinstance(v, (int, float))}, int(state.epoch or 0))

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.monitor is None or not self._open:
            return
        if self._hook is not None:
            self._hook.remove()
        self._close()
        self._record(source="transformers", task=type(model or self.monitor.model).__name__,
                     device=self.monitor.device, max_steps=state.max_steps)
