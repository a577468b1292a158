"""One name for the run store in the Python API: every public entry that records takes
``store=`` (a Store or a URL) and ``db=`` (the older spelling of a URL) the same way."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import proftune
from proftune.exceptions import ConfigError
from proftune.track import Store

PACKAGES = ("proftune", "proftune.profile", "proftune.recommend", "proftune.compress", "proftune.diagnose",
            "proftune.search", "proftune.report", "proftune.integrations.lightning",
            "proftune.integrations.transformers")
#: optimize/ is reworked in #23's part A (its config names the store db=); records whose field is a URL.
#: notify_ended is a search backend's hook, handed the open Store of the study it runs (no URL).
#: SearchSettings is what a sampler or backend plug-in is handed: the study's resolved URL (``db``), not an entry.
EXEMPT = {"optimize", "OptimizeConfig", "SearchResult", "Context", "run_page", "RunHandle", "StudyLock",
          "Bandit", "BanditPulls", "simulate", "notify_ended", "SearchSettings"}


def _entries() -> list[tuple[str, inspect.Signature]]:
    out = []
    for name in PACKAGES:
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", []):
            obj = getattr(mod, attr)
            if attr in EXEMPT or not callable(obj):
                continue
            try:
                sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
            except (TypeError, ValueError):
                continue
            if {"store", "db"} & set(sig.parameters):
                out.append((f"{name}.{attr}", sig))
    return out


def test_every_public_entry_takes_store_and_db() -> None:
    entries = _entries()
    assert len(entries) >= 15
    for name, sig in entries:
        assert {"store", "db"} <= set(sig.parameters), name
        assert sig.parameters["store"].default is None, name
        assert sig.parameters["db"].default is None, name


def test_profile_records_under_either_name_and_refuses_both(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    a = proftune.profile("digits-mlp", batch_size=8, steps=1, device="cpu", detail="step", store=url)
    b = proftune.profile("digits-mlp", batch_size=8, steps=1, device="cpu", detail="step", db=url)
    runs = Store(url).list_runs(kind="profile")
    assert sorted(r.id for r in runs) == sorted([a.config["run_id"], b.config["run_id"]])
    with pytest.raises(ConfigError, match="once"):
        proftune.profile("digits-mlp", batch_size=8, steps=1, device="cpu", store=url, db=url)
    with pytest.raises(ConfigError, match="once"):
        proftune.find_batch_size("digits-mlp", memory_budget="1GiB", device="cpu", store=url, db=url)


def test_callbacks_take_a_store_too(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from proftune.integrations.lightning import ProftuneCallback

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    assert ProftuneCallback(store=Store(url)).store is not None
    with pytest.raises(ConfigError, match="once"):
        ProftuneCallback(store=url, db=url)
    with pytest.raises(ConfigError, match="store must be"):
        ProftuneCallback(store=3)  # type: ignore[arg-type]
