"""diagnose() and bandit() take one config dataclass, its fields also given by name."""

from __future__ import annotations

import pytest

import proftune
from proftune import BanditConfig, DiagnoseConfig
from proftune.exceptions import ConfigError


def test_diagnose_takes_a_config_or_its_fields_by_name(db_url: str) -> None:
    by_config = proftune.diagnose("digits-mlp", None, DiagnoseConfig(max_steps=6, lr_test=False, probes=False),
                                  db=db_url)
    by_name = proftune.diagnose("digits-mlp", max_steps=6, lr_test=False, probes=False, db=db_url)
    assert by_config.steps == by_name.steps == 6
    assert by_config.metrics == pytest.approx(by_name.metrics)  # same seed, same run
    # a keyword overrides the config's field
    assert proftune.diagnose("digits-mlp", None, DiagnoseConfig(max_steps=6), max_steps=4, lr_test=False,
                             probes=False, record=False).steps == 4
    with pytest.raises(ConfigError, match=r"diagnose\(\) got unknown options \['lr_tset'\]"):
        proftune.diagnose("digits-mlp", max_steps=2, lr_tset=False)


def test_bandit_takes_a_config_or_its_fields_by_name(db_url: str) -> None:
    from proftune.diagnose import Arm

    arms = [Arm("a", {"lr": 1e-3}), Arm("b", {"lr": 1e-2})]
    from proftune.diagnose import bandit

    res = bandit("digits-mlp", arms, BanditConfig(max_steps=2, name="cfg"), rounds=2, db=db_url)
    assert res.total_pulls == 2
    assert res.name == "cfg"
    with pytest.raises(ConfigError, match="valid: "):
        bandit("digits-mlp", arms, rounds=1, polcy="ucb", db=db_url)
