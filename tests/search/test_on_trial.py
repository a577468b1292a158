"""``search(on_trial=)``: each trial's Run handed over once, as it ends, while the study runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import proftune
from proftune.exceptions import ConfigError
from proftune.track import RunRecord, Store

SPACE = {"params": {"x": {"type": "categorical", "choices": [1, 2, 3, 4]}}}


def _objective(p: dict[str, Any]) -> float:
    return float(p["x"])


def test_each_trial_as_it_ends_in_order(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    seen: list[tuple[int, str, int]] = []  # (trial run, its status, trial runs begun so far)

    def on_trial(record: RunRecord) -> None:
        seen.append((record.id, record.status, len(Store(db).list_runs(kind="trial"))))

    result = proftune.search(_objective, SPACE, objectives=["value:min"], trials=4, sampler="grid", db=db,
                             on_trial=on_trial)
    ids = [t.run_id for t in sorted(result.trials, key=lambda t: t.number)]
    assert seen == [(run_id, "finished", i + 1) for i, run_id in enumerate(ids)]


def test_a_raising_observer_ends_the_search(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"

    def on_trial(record: RunRecord) -> None:
        raise RuntimeError("sink down")

    with pytest.raises(RuntimeError, match="sink down"):
        proftune.search(_objective, SPACE, objectives=["value:min"], trials=4, sampler="grid", db=db,
                        on_trial=on_trial)
    store = Store(db)
    assert [r.status for r in store.list_runs(kind="tune")] == ["failed"]
    assert len(store.list_runs(kind="trial")) == 1  # no trial after the one it was handed


def test_on_trial_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="on_trial=3 must be a callable"):
        proftune.search(_objective, SPACE, objectives=["value:min"], trials=1, db=f"sqlite:///{tmp_path / 'p.db'}",
                        on_trial=3)
    assert not (tmp_path / "p.db").exists() or not Store(f"sqlite:///{tmp_path / 'p.db'}").list_runs()
