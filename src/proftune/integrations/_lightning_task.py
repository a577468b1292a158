"""A LightningModule (and, optionally, a LightningDataModule) as a proftune Task, without user code.

The loss comes from ``training_step``, the optimizer (and schedulers) from ``configure_optimizers``,
the data from the datamodule or the module's own dataloaders, and the metrics from what
``validation_step`` logs with ``self.log``/``self.log_dict`` (captured on the instance: no
Trainer is built). The batch size is set where Lightning's own tuner sets it: a ``batch_size``
attribute or hparam of the module or the datamodule.

Lightning is imported lazily: this module is imported only when a LightningModule is met.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import torch
from torch import nn

from .._device import batch_size_of
from ..exceptions import ConfigError, DependencyError, TaskLoadError
from ..task import Task

__all__ = ["LightningTask", "lightning_module_class", "lightning_namespace"]

_LR_ATTRS = ("lr", "learning_rate")  # the names Lightning's lr_find looks for, in its order


def lightning_namespace() -> Any:
    """``lightning.pytorch`` (or the older ``pytorch_lightning``); DependencyError without either."""
    import importlib

    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise DependencyError("a LightningModule task needs Lightning: pip install 'proftune[lightning]'.")


def lightning_module_class(obj: Any) -> str | None:
    """``"module"``, ``"datamodule"`` or None: what ``obj`` (a class) is, to Lightning.

    Looks only at Lightning packages that are already imported (a file that defines a
    LightningModule imported Lightning), so asking never imports Lightning.
    """
    import sys

    if not inspect.isclass(obj):
        return None
    for name in ("lightning.pytorch", "pytorch_lightning"):
        pkg = sys.modules.get(name)
        if pkg is None:
            continue
        if issubclass(obj, pkg.LightningModule):
            return "module"
        if issubclass(obj, pkg.LightningDataModule):
            return "datamodule"
    return None


def _overrides(obj: Any, method: str, base: type) -> bool:
    """Whether ``obj``'s class defines ``method`` itself (not Lightning's default hook)."""
    return getattr(type(obj), method, None) is not getattr(base, method, None)


class _Logged:
    """Values logged with ``self.log``/``log_dict`` since the last reset: sums weighted by batch."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.objects: dict[str, Any] = {}  # torchmetrics objects: computed once at the end
        self.batch_size = 1

    def reset(self) -> None:
        self.sums.clear()
        self.weights.clear()
        self.objects.clear()

    def add(self, name: str, value: Any, batch_size: int | None) -> None:
        if hasattr(value, "compute") and callable(value.compute):
            self.objects[name] = value
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                return
            value = float(value.detach())
        try:
            v = float(value)
        except (TypeError, ValueError):
            return  # strings and the like: nothing to average
        w = float(batch_size if batch_size is not None else self.batch_size)
        self.sums[name] = self.sums.get(name, 0.0) + v * w
        self.weights[name] = self.weights.get(name, 0.0) + w

    def means(self) -> dict[str, float]:
        out = {k: s / self.weights[k] for k, s in self.sums.items() if self.weights[k] > 0}
        for name, metric in self.objects.items():
            value = metric.compute()
            out[name] = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
            metric.reset()
        return out


@contextlib.contextmanager
def _logging_into(module: Any, logged: _Logged) -> Iterator[None]:
    """Route ``module.log``/``log_dict`` into ``logged`` while a step runs (no Trainer needed).

    Set on the instance only for the call, so that the module stays picklable between calls.
    """

    def log(name: str, value: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> None:
        logged.add(name, value, batch_size)

    def log_dict(dictionary: Mapping[str, Any], *args: Any, batch_size: int | None = None,
                 **kwargs: Any) -> None:
        for key, val in dictionary.items():
            logged.add(str(key), val, batch_size)

    target = module._template if isinstance(module, _Borrowed) else module
    if "log" in vars(target):  # nested: the outer call already routes it
        yield
        return
    object.__setattr__(target, "log", log)
    object.__setattr__(target, "log_dict", log_dict)
    try:
        yield
    finally:
        for name in ("log", "log_dict"):
            vars(target).pop(name, None)


def _set_lightning_attr(holders: list[Any], name: str, value: Any) -> None:
    for holder in holders:
        if isinstance(holder, dict):
            holder[name] = value
        else:
            setattr(holder, name, value)


def _attr_holders(objs: Iterable[Any], name: str) -> list[Any]:
    """Where Lightning's tuner finds ``name``: the object itself, then its ``hparams``."""
    holders: list[Any] = []
    for obj in objs:
        if obj is None:
            continue
        if hasattr(obj, name):
            holders.append(obj)
        hp = getattr(obj, "hparams", None)
        if isinstance(hp, dict) and name in hp:
            holders.append(hp)
    return holders


def _read_attr(holder: Any, name: str) -> Any:
    return holder[name] if isinstance(holder, dict) else getattr(holder, name)


class _SchedulerConfig:
    """One scheduler from ``configure_optimizers`` with Lightning's stepping rules."""

    def __init__(self, scheduler: Any, *, interval: str = "epoch", frequency: int = 1,
                 monitor: str | None = None) -> None:
        self.scheduler = scheduler
        self.interval = interval
        self.frequency = max(int(frequency), 1)
        self.monitor = monitor
        self.plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def step(self, metrics: Mapping[str, float]) -> None:
        if self.plateau:
            value = metrics.get(self.monitor or "")
            if value is not None and math.isfinite(value):
                self.scheduler.step(value)
        else:
            self.scheduler.step()


def parse_optimizers(conf: Any, *, owner: str) -> tuple[torch.optim.Optimizer, list[_SchedulerConfig]]:  # noqa: C901
    """The optimizer and schedulers from any of ``configure_optimizers``' return forms.

    One branch per form Lightning documents; splitting them would scatter the one table.

    Forms: an optimizer; a list or tuple of them; ``(optimizers, schedulers)``; a dict
    ``{"optimizer", "lr_scheduler", "monitor"}`` (the scheduler itself or a config dict with
    ``scheduler``, ``interval``, ``frequency``, ``monitor``); a list of such dicts. Automatic
    optimization steps one optimizer, so several are an error.
    """
    optimizers: list[torch.optim.Optimizer] = []
    scheds: list[_SchedulerConfig] = []

    def add_sched(s: Any, monitor: str | None) -> None:
        if isinstance(s, Mapping):
            if "scheduler" not in s:
                raise ConfigError(f"{owner}.configure_optimizers returned an lr_scheduler dict without "
                                  f"'scheduler' (keys: {sorted(s)}).")
            scheds.append(_SchedulerConfig(s["scheduler"], interval=str(s.get("interval", "epoch")),
                                           frequency=int(s.get("frequency", 1)),
                                           monitor=s.get("monitor", monitor)))
        else:
            scheds.append(_SchedulerConfig(s, monitor=monitor))

    def add(item: Any) -> None:
        if isinstance(item, torch.optim.Optimizer):
            optimizers.append(item)
        elif isinstance(item, Mapping):
            if "optimizer" not in item:
                raise ConfigError(f"{owner}.configure_optimizers returned a dict without 'optimizer' "
                                  f"(keys: {sorted(item)}).")
            optimizers.append(item["optimizer"])
            if item.get("lr_scheduler") is not None:
                add_sched(item["lr_scheduler"], item.get("monitor"))
        else:
            raise ConfigError(f"{owner}.configure_optimizers returned {type(item).__name__}; valid: an "
                              "optimizer, a list of them, (optimizers, schedulers) or a dict with 'optimizer'.")

    if conf is None:
        raise ConfigError(f"{owner}.configure_optimizers returned None; proftune trains with the "
                          "optimizer it returns (an optimizer, a list, or a dict with 'optimizer').")
    if (isinstance(conf, (list, tuple)) and len(conf) == 2 and isinstance(conf[0], (list, tuple))
            and isinstance(conf[1], (list, tuple))):
        for item in conf[0]:
            add(item)
        for s in conf[1]:
            add_sched(s, None)
    elif isinstance(conf, (list, tuple)):
        for item in conf:
            add(item)
    else:
        add(conf)
    if len(optimizers) != 1:
        raise ConfigError(f"{owner}.configure_optimizers returned {len(optimizers)} optimizers; "
                          "automatic optimization (and proftune) steps exactly one.")
    return optimizers[0], scheds


class _Borrowed:
    """A non-Lightning model (quantized, traced) seen through the LightningModule's methods.

    ``training_step(self, ...)`` calls ``self(x)`` or ``self.forward(x)``: those reach the model;
    every other attribute comes from the model if it has it, else from the template module.
    """

    def __init__(self, model: nn.Module, template: nn.Module) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_template", template)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        model = object.__getattribute__(self, "_model")
        if hasattr(model, name):
            return getattr(model, name)
        return getattr(object.__getattribute__(self, "_template"), name)


class LightningTask(Task):
    """A LightningModule class (or factory) and optional LightningDataModule, as a Task.

    ``module``: the LightningModule class, or a function returning an instance (built afresh for
    every model proftune trains, with the params its signature names: ``lr``, ``hidden``, ...).
    ``datamodule``: a LightningDataModule class or instance; without it the module's own
    ``train_dataloader``/``val_dataloader`` give the data.
    """

    #: The task and data specs (absolute paths) this was built from, if it was, and the function
    #: that built it (``task_with_data``, which sets both): a pickled copy (a Ray trial, a --workers
    #: process) is built again by calling it on them; the module objects do not pickle.
    specs: tuple[str, str] | None = None
    rebuild: Callable[[str, str], Any] | None = None

    def __reduce__(self) -> Any:
        if self.specs is None or self.rebuild is None:
            return super().__reduce__()
        return (self.rebuild, self.specs)

    def __init__(self, module: Callable[..., Any], datamodule: Any = None, *, name: str | None = None) -> None:
        pl = lightning_namespace()
        self._pl = pl
        self._factory = module
        self._logged = _Logged()
        label = getattr(module, "__name__", type(module).__name__)
        self.name = name or label  # type: ignore[misc]
        self._template = self._construct({})
        if not getattr(self._template, "automatic_optimization", True):
            raise ConfigError(f"{label} sets automatic_optimization = False; proftune trains with the "
                              "optimizer configure_optimizers returns, stepped by its own loop.")
        if inspect.isclass(datamodule):
            try:
                datamodule = datamodule()
            except Exception as exc:
                raise TaskLoadError(f"building the datamodule {datamodule.__qualname__}() failed: "
                                    f"{type(exc).__name__}: {exc}") from exc
        self._dm = datamodule
        self._dm_label = type(datamodule).__name__ if datamodule is not None else None
        self._label = label
        self._data_source: Any = datamodule if datamodule is not None else self._template
        if datamodule is None and not _overrides(self._template, "train_dataloader", pl.LightningModule):
            raise ConfigError(f"{label} has no train_dataloader() and no datamodule was given; name one "
                              "with data='file.py:DataModule' (proftune.integrations.task_with_data).")
        self._ready = False
        self._test_ready = False
        self._batch_idx = 0
        self._schedulers: list[_SchedulerConfig] = []
        self._sched_opt: torch.optim.Optimizer | None = None
        self._sched_steps = (0, 0)  # (optimizer steps, steps at the last epoch-interval step)
        self._epochs_done = 0
        self._last_metrics: dict[str, float] = {}
        self.default_params = self._defaults()  # type: ignore[misc]
        self.metric_directions = self._directions()  # type: ignore[misc]
        self.description = f"LightningModule {label}" + (f" with {self._dm_label}" if self._dm_label else "")  # type: ignore[misc]

    # -- building -----------------------------------------------------------------------------
    def _construct(self, params: dict[str, Any]) -> Any:
        try:
            sig = inspect.signature(self._factory)
            names = {n for n, p in sig.parameters.items()
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        except (TypeError, ValueError):
            names = set()
        kwargs = {k: v for k, v in params.items() if k in names}
        label = getattr(self._factory, "__qualname__", str(self._factory))
        try:
            module = self._factory(**kwargs)
        except Exception as exc:
            raise TaskLoadError(f"building the LightningModule {label}({', '.join(kwargs)}) failed: "
                                f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(module, self._pl.LightningModule):
            raise TaskLoadError(f"{label}() returned {type(module).__name__}, not a LightningModule.")
        # no Trainer: `module.trainer` is None instead of raising, the state Lightning gives it
        # while exporting (torch.jit.trace probes every attribute, compress traces the model)
        module._jit_is_scripting = True
        return module

    def _defaults(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        holders = _attr_holders([self._template, self._dm], "batch_size")
        if holders:
            out["batch_size"] = int(_read_attr(holders[-1], "batch_size"))
        else:
            loader = self._loader("train_dataloader")
            natural = getattr(loader, "batch_size", None)
            if natural is not None:
                out["batch_size"] = int(natural)
        for attr in _LR_ATTRS:
            lr_holders = _attr_holders([self._template], attr)
            if lr_holders:
                value = _read_attr(lr_holders[-1], attr)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out["lr"] = float(value)
                break
        return out

    def _directions(self) -> dict[str, str]:
        out = dict(getattr(self._template, "metric_directions", None) or {})
        if _overrides(self._template, "configure_callbacks", self._pl.LightningModule):
            callbacks = self._template.configure_callbacks() or []
            for cb in callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]:
                monitor, mode = getattr(cb, "monitor", None), getattr(cb, "mode", None)
                if monitor and mode in ("min", "max"):
                    out.setdefault(str(monitor), str(mode))
        return out

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        module: nn.Module = self._construct(params)
        if "lr" in params:
            self._set_lr(module, float(params["lr"]))
        return module

    def _set_lr(self, module: Any, lr: float) -> bool:
        for attr in _LR_ATTRS:
            holders = _attr_holders([module], attr)
            if holders:
                _set_lightning_attr(holders, attr, lr)
                return True
        return False

    # -- data -----------------------------------------------------------------------------------
    def _prepare(self) -> None:
        if self._ready:
            return
        src = self._data_source
        src.prepare_data()
        src.setup("fit")
        self._ready = True

    def _loader(self, method: str) -> Any:
        self._prepare()
        src = self._data_source
        base = self._pl.LightningDataModule if src is self._dm else self._pl.LightningModule
        if not _overrides(src, method, base):
            return None
        return getattr(src, method)()

    def _set_batch_size(self, batch_size: int) -> None:
        holders = _attr_holders([self._template, self._dm], "batch_size")
        if holders:
            _set_lightning_attr(holders, "batch_size", int(batch_size))
            return
        natural = self.default_params.get("batch_size")
        if natural is not None and int(natural) == int(batch_size):
            return
        where = f"{self._label} nor {self._dm_label}" if self._dm_label else (
            f"{self._label} (and no datamodule was given)")
        raise ConfigError(
            f"batch_size={batch_size} was asked for, but neither {where} has a `batch_size` attribute "
            "or hparam, where Lightning's tuner sets it too; add `self.batch_size = ...` (or "
            "save_hyperparameters with batch_size) and build the dataloaders with it."
        )

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        self._set_batch_size(batch_size)
        self._step_epoch_schedulers()
        self._batch_idx = 0
        loader: Iterable[Any] | None = self._loader("train_dataloader")
        if loader is None:
            raise ConfigError(f"{self._dm_label or self._label} has no train_dataloader().")
        return loader

    def val_data(self, batch_size: int) -> Iterable[Any]:
        self._set_batch_size(batch_size)
        loader = self._loader("val_dataloader")
        return [] if loader is None else loader

    def test_data(self, batch_size: int) -> Iterable[Any] | None:
        """The ``test_dataloader`` of the datamodule (or module), set up for ``"test"``; None
        without one. Evaluated with ``validation_step``, so its metrics have the same names."""
        self._prepare()
        src = self._data_source
        base = self._pl.LightningDataModule if src is self._dm else self._pl.LightningModule
        if not _overrides(src, "test_dataloader", base):
            return None
        if not self._test_ready:
            src.setup("test")
            self._test_ready = True
        self._set_batch_size(batch_size)
        return cast("Iterable[Any]", src.test_dataloader())

    # -- optimizer ------------------------------------------------------------------------------
    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        if "optimizer" in params:  # the search chose one: proftune builds it
            return super().configure_optimizer(model, params)
        lm = model if isinstance(model, self._pl.LightningModule) else self._template
        lr = params.get("lr")
        attr_set = lr is not None and self._set_lr(lm, float(lr))
        try:
            lm._jit_is_scripting = False  # a configure_optimizers that reads the Trainer: say so
            conf = lm.configure_optimizers()
        except RuntimeError as exc:
            if "Trainer" not in str(exc):
                raise
            raise ConfigError(f"{self._label}.configure_optimizers needs a Trainer ({exc}); proftune "
                              "runs it without one: read values such as the step count from hparams.") from exc
        finally:
            lm._jit_is_scripting = True
        opt, scheds = parse_optimizers(conf, owner=self._label)
        if lr is not None and not attr_set:
            self._override_lr(opt, scheds, float(lr))
        self._attach_schedulers(opt, scheds)
        return opt

    @staticmethod
    def _override_lr(opt: torch.optim.Optimizer, scheds: list[_SchedulerConfig], lr: float) -> None:
        """No ``lr`` attribute to set: scale every group so that the first one's rate is ``lr``."""
        base = float(opt.param_groups[0]["lr"]) or lr
        for group in opt.param_groups:
            group["lr"] = float(group["lr"]) * lr / base
            if "initial_lr" in group:
                group["initial_lr"] = float(group["initial_lr"]) * lr / base
        for cfg in scheds:
            base_lrs = getattr(cfg.scheduler, "base_lrs", None)
            if base_lrs is not None:
                cfg.scheduler.base_lrs = [b * lr / base for b in base_lrs]

    def _attach_schedulers(self, opt: torch.optim.Optimizer, scheds: list[_SchedulerConfig]) -> None:
        self._schedulers, self._sched_opt, self._sched_steps = scheds, opt, (0, 0)
        self._epochs_done = 0
        if not scheds:
            return
        every_step = [s for s in scheds if s.interval == "step"]

        def after_step(_opt: Any, _args: Any, _kwargs: Any) -> None:
            done = self._sched_steps[0] + 1
            self._sched_steps = (done, self._sched_steps[1])
            for s in every_step:
                if done % s.frequency == 0:
                    s.step(self._last_metrics)

        opt.register_step_post_hook(after_step)

    def _step_epoch_schedulers(self) -> None:
        """At the start of an epoch after the first: step the epoch-interval schedulers."""
        steps, at_last = self._sched_steps
        if self._sched_opt is None or steps == at_last:
            return
        self._sched_steps = (steps, steps)
        self._epochs_done += 1
        epochs = self._epochs_done
        for s in self._schedulers:
            if s.interval == "epoch" and epochs % s.frequency == 0:
                s.step(self._last_metrics)

    # -- loss and metrics -----------------------------------------------------------------------
    def _as_lightning(self, model: nn.Module) -> Any:
        if isinstance(model, self._pl.LightningModule):
            return model
        return _Borrowed(model, self._template)

    def _call_step(self, model: nn.Module, method: str, batch: Any, idx: int) -> Any:
        lm = self._as_lightning(model)
        fn = getattr(type(self._template), method)
        self._logged.batch_size = batch_size_of(batch)
        with _logging_into(lm, self._logged):
            return fn(lm, batch, idx)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        out = self._call_step(model, "training_step", batch, self._batch_idx)
        self._batch_idx += 1
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if not isinstance(loss, torch.Tensor):
            raise ConfigError(
                f"{self._label}.training_step returned {type(out).__name__}; proftune needs the loss: "
                "a tensor, or a dict with 'loss'."
            )
        return loss

    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        pl = self._pl
        has_val = _overrides(self._template, "validation_step", pl.LightningModule)
        lm = self._as_lightning(model)
        saved = self._logged.sums, self._logged.weights, self._logged.objects
        self._logged.sums, self._logged.weights, self._logged.objects = {}, {}, {}
        losses, count = 0.0, 0
        try:
            if has_val:
                with _logging_into(lm, self._logged):
                    lm.on_validation_epoch_start()
            for idx, batch in enumerate(data):
                n = batch_size_of(batch)
                if has_val:
                    out = self._call_step(model, "validation_step", batch, idx)
                else:
                    out = self._call_step(model, "training_step", batch, idx)
                loss = out.get("loss") if isinstance(out, Mapping) else out
                if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                    losses += float(loss.detach()) * n
                    count += n
            if has_val:
                with _logging_into(lm, self._logged):
                    lm.on_validation_epoch_end()
            metrics = self._logged.means() if has_val else {}
        finally:
            self._logged.sums, self._logged.weights, self._logged.objects = saved
        if "val_loss" not in metrics and count:
            metrics["val_loss"] = losses / count
        self._last_metrics = dict(metrics)
        return metrics

