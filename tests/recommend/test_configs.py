"""find_batch_size, lr_find and recommend take one frozen config of their options (as compress
takes a CompressConfig), and the same fields by name, as the README calls them."""

from __future__ import annotations

import dataclasses

import pytest

import proftune
from proftune import BatchSizeConfig, LRFindConfig, RecommendConfig
from proftune.exceptions import ConfigError


def _linear(per_sample: int, fixed: int):  # type: ignore[no-untyped-def]
    return lambda b: fixed + per_sample * b  # a memory curve known exactly: no real step runs


def test_find_batch_size_config_and_names_agree() -> None:
    measure = _linear(10_000, 2_000_000)
    by_name = proftune.find_batch_size("digits-mlp", memory_budget="12MB", device="cpu", measure=measure)
    cfg = BatchSizeConfig(memory_budget="12MB", device="cpu")
    by_config = proftune.find_batch_size("digits-mlp", None, cfg, measure=measure)
    assert by_config.max_batch_size == by_name.max_batch_size
    assert by_config.max_batch_size <= (12_000_000 - 2_000_000) // 10_000
    smaller = proftune.find_batch_size("digits-mlp", None, cfg, memory_budget="6MB", measure=measure)
    assert smaller.max_batch_size < by_config.max_batch_size  # a name overrides the config's field
    with pytest.raises(ConfigError, match="needs memory_budget"):
        proftune.find_batch_size("digits-mlp", device="cpu", measure=measure)
    with pytest.raises(ConfigError, match=r"unknown options \['budget'\]; valid: .*memory_budget"):
        proftune.find_batch_size("digits-mlp", budget="1GiB")


def test_lr_find_config_and_names_agree() -> None:
    by_name = proftune.lr_find("digits-mlp", min_lr=1e-4, max_lr=1.0, steps=12, device="cpu", seed=0)
    cfg = LRFindConfig(min_lr=1e-4, max_lr=1.0, steps=12, device="cpu", seed=0)
    by_config = proftune.lr_find("digits-mlp", None, cfg)
    assert [p["lr"] for p in by_config.to_dict()["curve"]] == [p["lr"] for p in by_name.to_dict()["curve"]]
    assert by_config.suggested_lr == by_name.suggested_lr  # the same seed, the same sweep
    with pytest.raises(ConfigError, match="min_lr"):
        proftune.lr_find("digits-mlp", None, dataclasses.replace(cfg, min_lr=2.0))


def test_recommend_refuses_unknown_options_and_wrong_configs_before_any_work() -> None:
    with pytest.raises(ConfigError, match=r"unknown options \['lr_step'\]; valid: .*lr_steps"):
        proftune.recommend("digits-mlp", lr_step=10)
    with pytest.raises(ConfigError, match="takes a RecommendConfig as config, but got LRFindConfig"):
        proftune.recommend("digits-mlp", None, LRFindConfig())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ddp_share"):
        proftune.recommend("digits-mlp", None, RecommendConfig(ddp=2, ddp_share=1.5), device="cpu")
    assert dataclasses.is_dataclass(RecommendConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        RecommendConfig().seed = 1  # type: ignore[misc]
