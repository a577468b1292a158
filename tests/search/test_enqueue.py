"""search(enqueue=...): one checked record per configuration, validated and merged with the task's
defaults once on its way to the fit loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import proftune
import proftune._train_params as train_params
from proftune import ConfigError
from proftune.search import EnqueuedTrial

SPACE: dict[str, Any] = {"params": {"hidden": {"type": "int", "low": 8, "high": 64, "step": 8},
                                    "lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True}}}


def _search(tmp_path: Path, **kw: Any) -> proftune.search.SearchResult:
    return proftune.search("wine-mlp", SPACE, max_steps=2, epochs=1, device="cpu", scan=0, analyse=False,
                           store=f"sqlite:///{tmp_path / 's.db'}", **kw)


def test_the_dict_form_and_the_record_train_the_same_configurations(tmp_path: Path) -> None:
    queue: list[Any] = [{"params": {"hidden": 24, "lr": 0.005}, "tags": {"arm": "centre"}},
                        EnqueuedTrial({"hidden": 24, "lr": 0.005}, tags={"arm": "centre"}, repeat=1),
                        {"params": {"hidden": 16, "lr": 0.01}, "repeat": None, "tags": None}]
    result = _search(tmp_path, trials=3, seed=4, enqueue=queue)
    got = [(t.params, t.tags, t.repeat, t.seed) for t in sorted(result.trials, key=lambda t: t.number)]
    assert got == [({"hidden": 24, "lr": 0.005}, {"arm": "centre"}, 0, 4),
                   ({"hidden": 24, "lr": 0.005}, {"arm": "centre"}, 1, 5),  # a repeat: a new seed
                   ({"hidden": 16, "lr": 0.01}, {}, 0, 4)]


def test_a_record_is_checked_where_it_is_made_and_keeps_its_own_copy() -> None:
    params = {"lr": 0.01}
    item = EnqueuedTrial(params, tags={"arm": "x"})
    params["lr"] = 1.0
    assert item.params == {"lr": 0.01}
    with pytest.raises(ConfigError) as err:
        EnqueuedTrial([("lr", 0.01)], repeat=-1)  # type: ignore[arg-type]
    assert "params=[('lr', 0.01)] must be a mapping" in str(err.value)
    assert "repeat=-1 must be an integer >= 0" in str(err.value)
    with pytest.raises(ConfigError, match="repeat=True"):
        EnqueuedTrial({}, repeat=True)
    with pytest.raises(ConfigError, match=r"tags=.* must be a mapping"):
        EnqueuedTrial({}, tags={1: "a"})  # type: ignore[dict-item]


def test_every_bad_item_is_named_in_one_error_with_what_is_valid(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _search(tmp_path, trials=1, enqueue=[{"params": {"hiden": 8}}, {"parms": {}, "repeat": "2"}, 3])
    text = str(err.value)
    assert "enqueue[0] names param(s) ['hiden'] that the space does not hold; valid: hidden, lr." in text
    assert "enqueue[1] has unknown key(s) ['parms']; valid: params, tags, repeat." in text
    assert "enqueue[1]: repeat='2' must be an integer >= 0" in text
    assert "enqueue[2]=3 must be a dict" in text
    with pytest.raises(ConfigError, match=r"enqueue=.* must be a list"):
        _search(tmp_path, trials=1, enqueue={"params": {"hidden": 8}})


def test_an_enqueued_configuration_is_validated_and_merged_once_on_its_way_to_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the profile gate (a step, as the trial's training) and the fit loop: one validation
    and one merge with the task's defaults (the gate's profile and ``fit`` each did their own)."""
    seen: list[dict[str, Any]] = []
    merged: list[dict[str, Any]] = []
    validate, of = train_params.validate_params, train_params.TrainParams.of.__func__  # type: ignore[attr-defined]

    def counted(params: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(params))
        return validate(params)

    def counted_of(cls: Any, task: Any, params: Any = None, /, **given: Any) -> Any:
        merged.append(dict(params or {}))
        return of(cls, task, params, **given)

    monkeypatch.setattr(train_params, "validate_params", counted)
    monkeypatch.setattr(train_params.TrainParams, "of", classmethod(counted_of))
    result = _search(tmp_path, trials=1, seed=0, constraints=["step_time_ms<100000"],
                     enqueue=[{"params": {"hidden": 16, "lr": 0.01}}])
    assert [t.state for t in result.trials] == ["complete"]
    assert merged == [{"hidden": 16, "lr": 0.01}]
    assert len(seen) == 1
    assert {k: seen[0][k] for k in ("hidden", "lr")} == {"hidden": 16, "lr": 0.01}
    assert seen[0]["batch_size"] == proftune.load_task("wine-mlp").default_params["batch_size"]
