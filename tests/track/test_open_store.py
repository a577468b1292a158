"""One way to name the run store: a Store, a database URL or None (the default store)."""

from __future__ import annotations

from pathlib import Path

import pytest

import proftune
from proftune.exceptions import ConfigError
from proftune.track import Store, open_store, optional_store


def test_store_url_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'given.db'}"
    store = Store(url)
    assert open_store(store) is store
    assert open_store(url).url == url
    assert open_store(db=url).url == url
    monkeypatch.setenv("PROFTUNE_DB", f"sqlite:///{tmp_path / 'env.db'}")
    assert open_store(None).url.endswith("env.db")
    assert optional_store(None) is None
    assert optional_store(url).url == url  # type: ignore[union-attr]


def test_store_given_twice_or_of_a_wrong_type(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ConfigError, match="store= or as db="):
        open_store(url, db=url)
    with pytest.raises(ConfigError, match="store must be a Store, a database URL or None"):
        open_store(3)  # type: ignore[arg-type]


def test_recording_functions_take_a_url_as_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    report = proftune.run_train("wine-mlp", max_steps=2, epochs=1, store=url)
    assert report.task == "wine-mlp"
    assert report.to_dict()["task"] == "wine-mlp"
    assert all(not k.startswith("_") for k in report.result.params)
    assert Store(url).get_run(report.run_id).kind == "train"


def test_every_recording_function_takes_store_the_same_way() -> None:
    """Every public function that records a Run (noise_scale records nothing) names it alike."""
    import inspect

    from proftune.diagnose import bandit

    functions = [proftune.run_train, proftune.profile, proftune.compress, proftune.diagnose, bandit,
                 proftune.search, proftune.recommend, proftune.find_batch_size, proftune.lr_find]
    for fn in functions:
        param = inspect.signature(fn).parameters.get("store")
        assert param is not None, fn.__name__
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, fn.__name__
        assert param.annotation == "Store | str | None", (fn.__name__, param.annotation)
