"""A plain ``torch.nn.Module`` (a timm model, say) as a classification Task on synthetic data.

A model alone brings no data; this task makes some, seeded, without downloads: ``C x H x W``
images (or ``D``-vectors) whose class is a smooth random pattern under Gaussian noise, so that a
model that trains raises ``accuracy`` and one that does not stays at chance. The input shape is
the model's own where it says it (timm's ``pretrained_cfg["input_size"]``, a first ``Linear``'s
``in_features``) or the ``input_shape`` param (``params={"input_shape": "3x32x32"}``); the number of
classes is the model's output width. Figures that depend on shapes (profile, batch size, FLOPs,
latency) hold for the model; metrics only say how well it learns this toy problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..exceptions import ConfigError, TaskLoadError
from ..task import ClassificationTask

__all__ = ["INPUT_SHAPE_PARAM", "ModuleTask", "is_plain_module", "parse_input_shape"]

#: The param that gives the input shape of a model that does not say it: ``3x32x32`` or ``64``.
INPUT_SHAPE_PARAM = "input_shape"
#: Side of the images a timm model without a fixed input size trains on by default (its cfg's
#: 224 would make a CPU epoch minutes long); ``input_shape=3x224x224`` restores it.
SMALL_SIDE = 64
_TRAIN_SAMPLES, _VAL_SAMPLES = 512, 256
_CHUNK = 64  # samples drawn together; the data do not depend on the batch size
#: Strength of a class's pattern in one coarse cell's mean over unit noise: the same at every
#: resolution (timm resnet10t at 32x32, AdamW 1e-3: accuracy 0.30 after 1 epoch, 0.91 after 3).
SIGNAL = 2.0
_EXAMPLE = "params={'input_shape': '3x32x32'} (channels x height x width; a vector model: params={'input_shape': 64})"


def is_plain_module(obj: Any) -> bool:
    """Whether ``obj`` is an ``nn.Module`` instance or subclass."""
    import inspect

    return isinstance(obj, nn.Module) or (inspect.isclass(obj) and issubclass(obj, nn.Module))


def parse_input_shape(value: Any) -> tuple[int, ...]:
    """``"3x32x32"``, ``"3,32,32"``, ``64`` or a sequence of ints -> the shape of one sample."""
    if isinstance(value, bool):
        parts: list[Any] = []
    elif isinstance(value, int):
        parts = [value]
    elif isinstance(value, list | tuple):
        parts = list(value)
    else:
        parts = str(value).replace(",", "x").replace("*", "x").lower().split("x")
    try:
        shape = tuple(int(str(p).strip()) for p in parts)
    except ValueError:
        shape = ()
    if not 1 <= len(shape) <= 4 or any(s < 1 for s in shape):
        raise ConfigError(f"param {INPUT_SHAPE_PARAM}={value!r} is not the shape of one sample; "
                          f"give e.g. {_EXAMPLE}.")
    return shape


class _Synthetic:
    """``n`` seeded samples ``(x, y)`` in batches of ``batch_size``: ``x`` is the class's pattern
    plus unit Gaussian noise. Re-iterable, the same samples in the same order every pass."""

    def __init__(self, patterns: torch.Tensor, *, n: int, batch_size: int, seed: int) -> None:
        self.patterns, self.n, self.batch_size, self.seed = patterns, n, batch_size, seed

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def _chunk(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + k)
        b = min(_CHUNK, self.n - k * _CHUNK)
        y = torch.randint(0, self.patterns.shape[0], (b,), generator=g)
        x = self.patterns[y] + torch.randn((b, *self.patterns.shape[1:]), generator=g)
        return x, y

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        have = 0
        for k in range(math.ceil(self.n / _CHUNK)):
            x, y = self._chunk(k)
            xs.append(x)
            ys.append(y)
            have += len(y)
            while have >= self.batch_size:
                x_all, y_all = torch.cat(xs), torch.cat(ys)
                yield x_all[:self.batch_size], y_all[:self.batch_size]
                xs, ys, have = [x_all[self.batch_size:]], [y_all[self.batch_size:]], have - self.batch_size
        if have:
            yield torch.cat(xs), torch.cat(ys)


def _patterns(classes: int, shape: tuple[int, ...]) -> torch.Tensor:
    """One smooth random pattern per class (a coarse grid, at most 4 per side, upsampled)."""
    g = torch.Generator().manual_seed(20_240_607)
    if len(shape) == 1:
        return SIGNAL * torch.randn((classes, *shape), generator=g)
    cells = [min(s, 4) for s in shape[1:]]
    coarse = torch.randn((classes, shape[0], *cells), generator=g)
    per_cell = math.prod(shape[1:]) / math.prod(cells)  # pixels averaged in one cell
    return nn.functional.interpolate(coarse, size=shape[1:], mode="nearest") * (SIGNAL / math.sqrt(per_cell))


class ModuleTask(ClassificationTask):
    """``factory(params)`` (a plain module) trained as a classifier on seeded synthetic data.

    ``build_params`` are the params that change the model (timm's ``num_classes``,
    ``img_size``...): the task probes the model again when they change. Params read:
    ``input_shape`` (see :func:`parse_input_shape`) and the fit loop's.
    """

    default_epochs = 3

    def __init__(self, factory: Callable[[dict[str, Any]], nn.Module], *, name: str,
                 build_params: tuple[str, ...] = (), description: str = "") -> None:
        self._factory = factory
        self._build_params = build_params
        self.name = name  # type: ignore[misc]
        self.default_params = {"batch_size": 32}  # type: ignore[misc]
        self.shape: tuple[int, ...] | None = None
        self.classes: int | None = None
        self._key: Any = None
        self._patterns: torch.Tensor | None = None
        model = self._build({})
        self._shape_hint = _first_conv_channels(model)
        self._configure(model, {})
        self.description = description or (  # type: ignore[misc]
            f"{type(model).__name__} as a classifier on synthetic data")

    # -- the model and what it takes ------------------------------------------------------
    def _build(self, params: dict[str, Any]) -> nn.Module:
        try:
            model = self._factory(params)
        except ConfigError:
            raise
        except Exception as exc:
            raise TaskLoadError(f"building the model of task {self.name!r} failed: "
                                f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(model, nn.Module):
            raise TaskLoadError(f"task {self.name!r}: the factory returned {type(model).__name__}, not an nn.Module.")
        return model

    def _configure(self, model: nn.Module, params: dict[str, Any]) -> None:
        """Learn the input shape and class count for ``params``, probing ``model`` once per change."""
        given = params.get(INPUT_SHAPE_PARAM)
        key = (repr(given), tuple(repr(params.get(p)) for p in self._build_params))
        if key == self._key:
            return
        shape = parse_input_shape(given) if given is not None else model_input_shape(model)
        if shape is None:
            return  # unknown until the param comes; _require says how to give it
        self.classes = _probe_classes(model, shape, name=self.name, given=given is not None)
        self.shape, self._key, self._patterns = shape, key, None

    def _require(self) -> tuple[tuple[int, ...], int]:
        if self.shape is None or self.classes is None:
            example = _EXAMPLE
            if self._shape_hint is not None:
                example = f"params={{'{INPUT_SHAPE_PARAM}': '{self._shape_hint}x32x32'}} (channels x height x width)"
            raise ConfigError(f"the input shape of task {self.name!r} is unknown (the model does not say it): "
                              f"give it as {example}.")
        return self.shape, self.classes

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        model = self._build(params)
        self._configure(model, params)
        self._require()
        return model

    # -- data ---------------------------------------------------------------------------
    def _data(self, batch_size: int, *, n: int, seed: int) -> _Synthetic:
        shape, classes = self._require()
        if self._patterns is None:
            self._patterns = _patterns(classes, shape)
        return _Synthetic(self._patterns, n=n, batch_size=int(batch_size), seed=seed)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> _Synthetic:
        given = params.get(INPUT_SHAPE_PARAM)
        if given is not None and parse_input_shape(given) != self.shape:
            self._configure(self._build(params), params)
        return self._data(batch_size, n=_TRAIN_SAMPLES, seed=0)

    def val_data(self, batch_size: int) -> _Synthetic:
        return self._data(batch_size, n=_VAL_SAMPLES, seed=1)

    def test_data(self, batch_size: int) -> _Synthetic:
        return self._data(batch_size, n=_VAL_SAMPLES, seed=2)


def model_input_shape(model: nn.Module) -> tuple[int, ...] | None:
    """The shape of one input sample the model says it takes, or None.

    timm's ``pretrained_cfg``/``default_cfg`` ``input_size`` (channels from its first conv; a
    model without a fixed input size at most :data:`SMALL_SIDE` per side, a ViT at its own
    ``img_size``), else a first ``Linear``'s ``in_features``.
    """
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    cfg = cfg if isinstance(cfg, dict) else {}
    size = cfg.get("input_size")
    if isinstance(size, tuple | list) and len(size) == 3:
        channels = _first_conv_channels(model) or int(size[0])
        if cfg.get("fixed_input_size"):
            own = getattr(getattr(model, "patch_embed", None), "img_size", None)
            hw = tuple(int(s) for s in own) if isinstance(own, tuple | list) and len(own) == 2 else size[1:]
            return (channels, *(int(s) for s in hw))
        return (channels, *(min(int(s), SMALL_SIDE) for s in size[1:]))
    for module in model.modules():
        if next(module.parameters(recurse=False), None) is None:
            continue
        if isinstance(module, nn.Linear) and not isinstance(module, nn.modules.lazy.LazyModuleMixin):
            return (module.in_features,)
        return None
    return None


def _first_conv_channels(model: nn.Module) -> int | None:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    first = cfg.get("first_conv") if isinstance(cfg, dict) else None
    if isinstance(first, str):
        try:
            conv = model.get_submodule(first)
        except AttributeError:
            conv = None
        if isinstance(conv, nn.modules.conv._ConvNd):
            return int(conv.in_channels)
    for module in model.modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            return int(module.in_channels)
    return None


def _probe_classes(model: nn.Module, shape: tuple[int, ...], *, name: str, given: bool) -> int:
    """The output width of one forward on two samples of ``shape``: the number of classes."""
    where = f"params={{'{INPUT_SHAPE_PARAM}': '{'x'.join(map(str, shape))}'}}"
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros((2, *shape)))
    except (RuntimeError, ValueError, TypeError, AssertionError, IndexError) as exc:
        hint = "" if given else f"; give the shape it takes as {_EXAMPLE}"
        raise ConfigError(f"task {name!r}: a forward on inputs of shape {list(shape)} ({where}) failed: "
                          f"{type(exc).__name__}: {exc}{hint}.") from exc
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        got = f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"task {name!r}: the model returns {got} on a batch of 2 inputs of shape {list(shape)}; "
                          "a module trained as a classifier must return logits of shape (batch, classes).")
    if out.shape[1] < 2:
        raise ConfigError(f"task {name!r}: the model returns {out.shape[1]} output per sample; a classifier "
                          "needs at least 2 classes (timm: params={'num_classes': 10}).")
    return int(out.shape[1])
