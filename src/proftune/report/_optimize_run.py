"""The optimize Run as its report page reads it: :class:`OptimizeRun` (the record and the Runs of its
stages, read once from the Store) and how the page writes a number in a cell."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from .._jsonsafe import finite_float as _f
from ..optimize import (
    OptimizeResult,
    StageOutputs,
)
from ..track import RunRecord, Store

S = TypeVar("S", bound=StageOutputs)


def fmt_num(v: Any, digits: int = 3) -> str:
    """Three significant digits for people (``0.0679``), whole numbers as they are."""
    f = _f(v)
    if f is None:
        return "-" if v is None else str(v)
    if f.is_integer() and abs(f) < 1e6:
        return f"{int(f):,}" if abs(f) >= 10_000 else str(int(f))
    return f"{f:.{digits}g}"


def fmt_pm(mean: Any, std: Any = None) -> str:
    """``0.887 ± 0.012``: a mean and its spread over seeds."""
    if _f(mean) is None:
        return "-"
    return fmt_num(mean) + (f" ± {fmt_num(std, 2)}" if _f(std) is not None else "")


class OptimizeRun:
    """The optimize Run's record and the Runs it names, read once from the Store."""

    def __init__(self, r: RunRecord, store: Store | None, res: OptimizeResult | None) -> None:
        self.r, self.store, self.res = r, store, res
        self.metric = (res.metric if res is not None
                       else str((r.config or {}).get("objective") or "metric").split(":")[0])
        self.children: dict[str, RunRecord] = {}
        if store is not None:
            for c in reversed(store.list_runs(parent_id=r.id)):  # oldest first: a resumed stage's last run wins
                name = (c.config or {}).get("stage")
                if name and (c.status == "finished" or name not in self.children):
                    self.children[str(name)] = c

    def stage(self, kind: type[S]) -> S:
        """The stage's whole outputs (its Run), else what the optimize result kept of them."""
        child = self.children.get(kind.STAGE)
        if child is not None and child.result:
            return kind.from_dict(dict(child.result))
        row = self.res.stage(kind.STAGE) if self.res is not None else None
        return row.record(kind) if row is not None else kind()

    def run(self, run_id: Any) -> RunRecord | None:
        if self.store is None or not isinstance(run_id, int):
            return None
        try:
            return self.store.get_run(run_id)
        except Exception:  # noqa: BLE001 - a run deleted from the store: its section says so
            return None


def shorten(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def fmt_param_value(v: Any) -> str:
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {fmt_num(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(str(i.get("layer", i.get("name", i))) if isinstance(i, Mapping) else str(i)
                         for i in v) or "none"
    return fmt_num(v) if isinstance(v, (int, float)) else str(v)
