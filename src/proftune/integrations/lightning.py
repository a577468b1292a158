"""Lightning: :class:`ProftuneCallback` for ``lightning.Trainer``, and the LightningModule task.

```python
trainer = L.Trainer(max_epochs=3, callbacks=[ProftuneCallback(every=50)])
trainer.fit(model, datamodule=dm)      # a `profile` Run in ./proftune.db (or db=, $PROFTUNE_DB)
```
Importing this module needs Lightning (``pip install 'proftune[lightning]'``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._optional import require
from ._lightning_task import LightningTask
from ._monitoring import MonitoringCallback

_Callback: Any = require("lightning.pytorch", feature=__name__).Callback

__all__ = ["LightningTask", "ProftuneCallback"]


class _AfterBackward:
    """The optimizer as the Monitor sees it: step pre-hooks run after the backward.

    Lightning runs forward and backward inside ``optimizer.step(closure)``, so a real step
    pre-hook would fire before them; the callback fires these from ``on_before_optimizer_step``
    (gradients complete, not yet clipped). Everything else is the real optimizer.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._opt = optimizer
        self._pre: dict[int, Any] = {}

    def register_step_pre_hook(self, hook: Any) -> Any:
        key = max(self._pre, default=-1) + 1
        self._pre[key] = hook
        pre = self._pre

        class _Handle:
            def remove(self) -> None:
                pre.pop(key, None)

        return _Handle()

    def fire(self) -> None:
        for hook in list(self._pre.values()):
            hook(self._opt, (), {})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._opt, name)


class ProftuneCallback(MonitoringCallback, _Callback):
    """The Monitor's sampled per-layer profile and the health checks, inside ``lightning.Trainer``.

    Every ``every``-th optimizer step is instrumented (the others run untouched). ``health``:
    :class:`proftune.HealthCheck` watches every step; its findings are logged and, with
    ``stop_on_error``, a finding of severity ``error`` stops the run. ``adapt``:
    :class:`proftune.GradGuard` and :class:`proftune.AdaptiveLR` act on the run. At the end the
    profile and findings are a Run of kind ``profile`` in ``store`` (a Store or a URL; ``db`` is the
    older spelling; default ``$PROFTUNE_DB`` or
    ``sqlite:///proftune.db``) and the profile's metrics go to the Trainer's logger.
    """

    _opt: _AfterBackward | None = None
    _stepped = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        opts = trainer.optimizers
        self._opt = _AfterBackward(opts[0]) if opts else None
        self._start(pl_module, self._opt)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.monitor is not None:
            self.monitor.resume()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._opt is not None:
            self._opt.fire()
        self._stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.monitor is None or not self._stepped:
            return  # a micro-batch of an accumulated step: the step ends with its optimizer step
        self._stepped = False
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if self._step(loss if isinstance(loss, torch.Tensor) else None):
            trainer.should_stop = True

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.pause()

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is None or trainer.sanity_checking:
            return
        self._evaluated({k: float(v) for k, v in trainer.callback_metrics.items()
                         if isinstance(v, (int, float, torch.Tensor)) and torch.as_tensor(v).numel() == 1},
                        trainer.current_epoch)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._close():
            return
        self._record(source="lightning", task=type(pl_module).__name__, device=pl_module.device,
                     max_epochs=trainer.max_epochs)
        if trainer.logger is not None and self.metrics:
            trainer.logger.log_metrics({f"proftune/{k}": v for k, v in self.metrics.items()},
                                       step=trainer.global_step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(exception)
