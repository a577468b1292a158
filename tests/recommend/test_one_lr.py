"""One lr across `lr-find` and `recommend` (issue 63): both run the same range test on the task's
batch, so `recommend`'s rate is `lr-find`'s suggestion, scaled to the batch it recommends, and its
reason says so in one line; `lr-find` says what the other commands do with its rate."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from proftune.cli import app
from proftune.recommend import lr_find, recommend, scale_lr


def test_recommend_s_lr_is_lr_find_s_suggestion_scaled_to_its_batch() -> None:
    found = lr_find("wine-mlp", device="cpu", seed=0)
    assert found.suggested_lr is not None
    recs = {r.name: r for r in recommend("wine-mlp", device="cpu", seed=0)}
    lr = recs["lr"]
    assert lr.evidence["suggested_lr"] == found.suggested_lr  # the same test, the same rate
    batch = recs["batch_size"].value
    if batch == found.batch_size:
        assert lr.value == pytest.approx(found.suggested_lr)
        assert "the rate `proftune lr-find` suggests" in lr.reason
    else:
        rule = scale_lr(found.suggested_lr, from_batch=found.batch_size, to_batch=batch,
                        optimizer=found.optimizer.lower())
        assert lr.value == pytest.approx(rule.lr)
        assert f"scaled to batch {batch}" in lr.reason
        assert f"prints the unscaled {found.suggested_lr:.3g}" in lr.reason


def test_lr_find_says_what_recommend_and_optimize_do_with_its_rate(tmp_path) -> None:
    res = CliRunner().invoke(app, ["lr-find", "wine-mlp", "--steps", "30", "--device", "cpu",
                                   "--db", f"sqlite:///{tmp_path / 'p.db'}"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "`recommend` runs this same test and scales" in text
    assert "`optimize` runs it shorter, checks the rate in a short training and searches around it" in text
