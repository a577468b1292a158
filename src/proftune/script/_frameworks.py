"""Inside a script's child process: the metrics a Lightning ``Trainer`` or a Hugging Face ``Trainer``
already computes (``self.log("val_acc", ...)``, ``trainer.evaluate()``'s ``eval_*``) sent to the
report channel, by a callback added to every Trainer the script builds; the scalars it writes with a
TensorBoard ``SummaryWriter`` (``add_scalar``, ``add_scalars``), by a hook on the writer's class. The
script is unchanged."""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path
from typing import Any

from ._channel import REPORT_ENV, channel_line

__all__ = ["install_framework_reports"]


def _send(source: str, metrics: dict[str, Any], step: int | None) -> None:
    path = os.environ.get(REPORT_ENV)
    values = {}
    for k, v in metrics.items():
        try:
            values[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    if path and values:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(channel_line(step, values, source) + "\n")


def _imports(path: str) -> set[str]:
    """The modules the script's own source imports, by their full names (``from torch.utils import
    tensorboard``: ``torch.utils.tensorboard`` and ``torch.utils``)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _wrap_init(cls: Any, add: Any) -> None:
    init = cls.__init__

    @functools.wraps(init)
    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), add()]
        init(self, *args, **kwargs)

    cls.__init__ = patched


def _lightning(module: str) -> None:
    import importlib

    pl = importlib.import_module(module)

    base: Any = pl.Callback

    class _Report(base):
        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                _send("lightning", dict(trainer.callback_metrics), trainer.current_epoch + 1)

        def on_test_end(self, trainer: Any, pl_module: Any) -> None:
            _send("lightning", dict(trainer.callback_metrics), None)

    _wrap_init(pl.Trainer, _Report)


def _transformers() -> None:
    import transformers

    base: Any = transformers.TrainerCallback

    class _Report(base):
        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kw: Any) -> None:
            _send("transformers", dict(metrics or {}), int(state.global_step))

    _wrap_init(transformers.Trainer, _Report)


def _step(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _tensorboard(module: str) -> None:
    """Each scalar written by ``module``'s ``SummaryWriter`` (its tag the metric's name), then written."""
    import importlib

    writer: Any = importlib.import_module(module).SummaryWriter
    add_scalar, add_scalars = writer.add_scalar, writer.add_scalars

    @functools.wraps(add_scalar)
    def scalar(self: Any, tag: str, scalar_value: Any, global_step: Any = None, *args: Any, **kwargs: Any) -> Any:
        out = add_scalar(self, tag, scalar_value, global_step, *args, **kwargs)
        _send("tensorboard", {tag: scalar_value}, _step(global_step))
        return out

    @functools.wraps(add_scalars)
    def scalars(self: Any, main_tag: str, tag_scalar_dict: Any, global_step: Any = None, *args: Any,
                **kwargs: Any) -> Any:
        out = add_scalars(self, main_tag, tag_scalar_dict, global_step, *args, **kwargs)
        _send("tensorboard", {f"{main_tag}/{k}": v for k, v in dict(tag_scalar_dict).items()}, _step(global_step))
        return out

    writer.add_scalar, writer.add_scalars = scalar, scalars


def install_framework_reports(script: str) -> list[str]:
    """Add the reporting callback to the Trainers of the frameworks ``script`` imports, and the hook to
    the TensorBoard writer it imports; their names."""
    names = _imports(script)
    roots = {n.split(".")[0] for n in names}
    done = []
    if "lightning" in roots:
        _lightning("lightning.pytorch")
        done.append("lightning")
    if "pytorch_lightning" in roots:
        _lightning("pytorch_lightning")
        done.append("lightning")
    if "transformers" in roots:
        _transformers()
        done.append("transformers")
    # only where the script's own source imports a writer: importing tensorboard costs a second
    if "torch.utils.tensorboard" in names:
        _tensorboard("torch.utils.tensorboard")
        done.append("tensorboard")
    if "tensorboardX" in roots:
        _tensorboard("tensorboardX")
        done.append("tensorboard")
    return done
