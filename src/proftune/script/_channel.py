"""``proftune.report(val_acc=0.91, step=3)``: a script's metric, sent to the proftune that runs it.

Inside a script that ``proftune tune/optimize -- python train.py`` started, each call appends one
JSON line to the file the parent named in ``PROFTUNE_REPORT_FILE`` (and reads while the script
runs: the intermediate values prune a trial); anywhere else it does nothing.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, TypedDict

from ..exceptions import ConfigError

__all__ = ["REPORT_ENV", "report"]

#: The environment variable naming the file a launched script's reports go to.
REPORT_ENV = "PROFTUNE_REPORT_FILE"


class ChannelLine(TypedDict, total=False):
    """One line of the channel: a report's ``step`` and ``metrics`` (a non-finite value as its text)
    and the framework that sent it (``source``), or a watched script's ``profile`` figures and ``summary``."""

    step: int | None
    metrics: dict[str, float | str]
    source: str
    profile: dict[str, float]
    summary: str


def report(step: int | None = None, **metrics: Any) -> None:
    """Report ``metrics`` (name=number) of the running script, at ``step`` (an epoch or a step count;
    None: the next one). A no-op unless proftune launched this script."""
    if not metrics:
        raise ConfigError("proftune.report() needs at least one metric: proftune.report(val_acc=0.91, step=3).")
    values: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"proftune.report({name}=...) must be a number, but got "
                              f"{type(value).__name__}: {value!r:.60}.") from None
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ConfigError(f"proftune.report(step=...) must be an integer or None, but got {step=}.")
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(channel_line(step, values) + "\n")


def channel_line(step: int | None, values: dict[str, float], source: str | None = None) -> str:
    """One line of the report channel: strict JSON, a non-finite value as its text (float() reads it)."""
    metrics = {k: (v if math.isfinite(v) else str(v)) for k, v in values.items()}
    payload: ChannelLine = {"step": step, "metrics": metrics}
    if source is not None:
        payload["source"] = source
    return json.dumps(payload, allow_nan=False)
