"""Optuna's storage on the store's database is opened once a process: the optimize loop's search
calls ``search`` once a chunk of trials, and each opening checked the schema (0.25-0.3 s)."""

from __future__ import annotations

from pathlib import Path

from proftune.search._storage import open_storage
from proftune.track import Store


def test_one_storage_per_database_file_and_a_new_one_for_a_replaced_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    Store(url)
    first = open_storage(url)
    assert open_storage(url) is first
    other = f"sqlite:///{tmp_path / 'q.db'}"
    Store(other)
    assert open_storage(other) is not first
    # the file replaced under the same URL is another database: never the old engine's connections
    first.engine.dispose()
    (tmp_path / "p.db").rename(tmp_path / "old.db")
    Store(url)
    again = open_storage(url)
    assert again is not first
    assert open_storage(url) is again
