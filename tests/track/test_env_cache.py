"""The environment recorded with each run is read once per process for what does not change in it."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from proftune.track import _env


def test_git_is_asked_once_per_folder_within_its_ttl(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    calls: list[list[str]] = []
    real = subprocess.run

    def counting(cmd: list[str], **kw: Any) -> Any:
        calls.append(cmd)
        return real(cmd, **kw)

    monkeypatch.setattr(_env.subprocess, "run", counting)
    monkeypatch.setattr(_env, "_GIT", {})
    clock = [100.0]
    monkeypatch.setattr(_env.time, "monotonic", lambda: clock[0])
    first = _env._git_commit(str(tmp_path))
    n = len(calls)
    assert n >= 1
    assert _env._git_commit(str(tmp_path)) == first
    assert len(calls) == n  # within the TTL: no new git process
    clock[0] += _env.GIT_TTL_S + 1
    _env._git_commit(str(tmp_path))
    assert len(calls) > n  # past it: read again


def test_the_package_versions_are_read_once() -> None:
    assert _env._versions() == _env._versions()
    assert _env._versions_read.cache_info().hits >= 1
    assert "optuna" in _env._versions()
