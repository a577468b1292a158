"""Inside a script's child process: the metrics a Lightning ``Trainer`` or a Hugging Face ``Trainer``
already computes (``self.log("val_acc", ...)``, ``trainer.evaluate()``'s ``eval_*``) sent to the
report channel, by a callback added to every Trainer the script builds. The script is unchanged."""

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
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    return roots


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


def install_framework_reports(script: str) -> list[str]:
    """Add the reporting callback to the Trainers of the frameworks ``script`` imports; their names."""
    roots = _imports(script)
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
    return done
