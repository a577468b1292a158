"""The space file: parsing, conditions, forbid rules, grids, hashing, and one error for all problems."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from proftune import ConfigError
from proftune.search import Space, load_space

SPACE = """
params:
  optimizer:  {type: categorical, choices: [adamw, sgd]}
  lr:         {type: float, low: 1e-4, high: 0.1, log: true, tier: training}
  momentum:   {type: float, low: 0.0, high: 0.99, when: {optimizer: sgd}}
  hidden:     {type: int, low: 8, high: 64, step: 8}
  batch_size: {type: categorical, choices: [16, 32]}
fixed: {weight_decay: 0.0}
forbid:
  - {optimizer: sgd, lr: ">0.05"}
"""


def test_parses_types_log_step_and_numbers_written_as_yaml_1_1_strings() -> None:
    space = load_space(SPACE)
    lr = space.param("lr")
    assert lr.type == "float"
    assert lr.log
    assert lr.low == pytest.approx(1e-4)
    assert space.param("hidden").step == 8
    assert space.param("batch_size").choices == (16, 32)
    assert space.fixed == {"weight_decay": 0.0}


def test_conditional_param_is_suggested_only_when_its_condition_holds() -> None:
    space = load_space(SPACE)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = {"adamw": 0, "sgd": 0}
    for _ in range(30):
        trial = study.ask()
        values = space.suggest(trial)
        seen[values["optimizer"]] += 1
        assert ("momentum" in values) == (values["optimizer"] == "sgd")
        assert values["hidden"] % 8 == 0
        assert 8 <= values["hidden"] <= 64
        study.tell(trial, 0.0)
    assert seen["adamw"]
    assert seen["sgd"]


def test_forbid_rules_match_combinations() -> None:
    space = load_space(SPACE)
    assert space.forbidden({"optimizer": "sgd", "lr": 0.08}) is not None
    assert space.forbidden({"optimizer": "sgd", "lr": 0.01}) is None
    assert space.forbidden({"optimizer": "adamw", "lr": 0.08}) is None
    assert "optimizer==sgd" in space.forbidden({"optimizer": "sgd", "lr": 0.08}).describe()


def test_grid_and_hash() -> None:
    space = load_space(SPACE)
    grid = space.grid(3)
    assert grid["hidden"] == [8, 32, 64] or len(grid["hidden"]) == 3
    assert grid["lr"] == pytest.approx([1e-4, 10 ** -2.5, 0.1])
    assert grid["optimizer"] == ["adamw", "sgd"]
    same = load_space(SPACE)
    other = load_space(SPACE.replace("high: 64", "high: 128"))
    assert space.hash() == same.hash() != other.hash()


def test_every_problem_is_listed_in_one_error() -> None:
    bad = {
        "params": {
            "a": {"type": "float", "low": 1.0, "high": 0.1},
            "b": {"type": "float", "low": 0.0, "high": 1.0, "log": True},
            "c": {"type": "complex", "low": 0, "high": 1},
            "d": {"type": "categorical", "choices": []},
            "e": {"type": "int", "low": 1, "high": 5, "when": {"nope": 1}},
        },
        "forbid": [{"ghost": 3}, {"e": {">": 0.5}}],
    }
    with pytest.raises(ConfigError) as info:
        Space.from_dict(bad)
    text = str(info.value)
    assert len(info.value.problems) == 7, info.value.problems
    assert "{'>': 0.5} is not a condition; valid: a value, a list of values, or a comparison string" in text
    assert "low=1 > high=0.1" in text
    assert "log: true (a key of the space file) needs low > 0" in text
    assert "type='complex' is unknown" in text
    assert "float, int, categorical" in text
    assert "choices is empty" in text
    assert "unknown param 'nope'" in text
    assert "unknown param 'ghost'" in text


def test_tiers_need_every_param_tiered_and_load_the_default_order() -> None:
    space = Space.from_dict({"params": {
        "width": {"type": "int", "low": 4, "high": 8, "tier": "architecture"},
        "lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True, "tier": "training"},
        "dropout": {"type": "float", "low": 0.0, "high": 0.5, "tier": "regularization"},
    }})
    assert space.tiers == ("architecture", "training", "regularization")
    with pytest.raises(ConfigError, match="has no tier"):
        Space.from_dict({"params": {
            "width": {"type": "int", "low": 4, "high": 8, "tier": "architecture"},
            "lr": {"type": "float", "low": 1e-3, "high": 1e-1, "tier": "training"},
            "dropout": {"type": "float", "low": 0.0, "high": 0.5},
        }})


def test_a_space_file_that_is_not_text_names_what_it_should_be(tmp_path: Path) -> None:
    binary = tmp_path / "space.yaml"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(ConfigError, match=r"is not a text file.*YAML or JSON search space"):
        load_space(binary)
    from typer.testing import CliRunner

    from proftune.cli import app

    res = CliRunner().invoke(app, ["tune", "digits-mlp", "--space", str(binary),
                                   "--db", f"sqlite:///{tmp_path / 't.db'}"])
    assert res.exit_code == 2, res.output
    assert "is not a text file" in res.output
