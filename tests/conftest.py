"""Shared fixtures: a throwaway run store per test, never ./proftune.db."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the default store at a temp file so no test writes ./proftune.db."""
    monkeypatch.setenv("PROFTUNE_DB", f"sqlite:///{tmp_path / 'proftune.db'}")


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture(autouse=True, scope="session")
def _threads() -> None:
    # two cores shared with the test runner; keep runs comparable and quick
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
