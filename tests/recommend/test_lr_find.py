from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import proftune
from proftune import ConfigError
from proftune.recommend import _lr_find, lr_find, suggest_lr

LRS = np.geomspace(1e-7, 10, 100)


def _curve() -> np.ndarray:
    """Flat at ln(10), falls around 1e-3, minimum near 1e-2, explodes past 1e-1."""
    x = np.log10(LRS)
    return 2.3 - 2.1 / (1 + np.exp(-(x + 3) / 0.3)) + 0.5 * np.exp(3 * (x + 1))


def _noisy(seed: int, sigma: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    spikes = (rng.random(len(LRS)) < 0.05) * rng.exponential(1.0, len(LRS))
    return _curve() + rng.normal(0, sigma, len(LRS)) + spikes


def _steepest(losses: np.ndarray) -> float:
    """The fragile rule of common tools: EMA (0.05), skip 10/5, argmin of np.gradient."""
    avg, smoothed = losses[0], []
    for v in losses:
        avg = 0.05 * v + 0.95 * avg
        smoothed.append(avg)
    lrs, sm = LRS[10:-5], np.array(smoothed)[10:-5]
    return float(lrs[np.gradient(sm).argmin()])


def test_reading_of_a_clean_curve() -> None:
    r = suggest_lr(LRS, _curve())
    assert r.message is None
    assert 1e-4 < r.min_lr < r.suggested_lr < r.lr_at_min_loss < r.max_lr < 1.0
    assert r.suggested_lr == pytest.approx(r.lr_at_min_loss / 10)


def test_suggestion_is_robust_to_noise_where_steepest_slope_is_not() -> None:
    clean = suggest_lr(LRS, _curve()).suggested_lr
    ours = np.array([suggest_lr(LRS, _noisy(s, 0.3)).suggested_lr for s in range(20)])
    steep = np.array([_steepest(_noisy(s, 0.3)) for s in range(20)])
    assert np.all(ours > 0)
    # every noisy run lands within 2x of the noise-free answer, the spread stays under 3x
    assert np.all(np.abs(np.log(ours / clean)) < np.log(2.0))
    assert ours.max() / ours.min() < 3.0
    # the steepest-slope rule spreads over about a decade on the same curves
    assert steep.max() / steep.min() > 3 * (ours.max() / ours.min())


def test_a_loss_that_rises_from_the_first_step_gets_no_suggestion() -> None:
    rising = 2.3 * np.exp(np.linspace(0, 4, 30)) + np.random.default_rng(0).normal(0, 0.05, 30)
    r = suggest_lr(LRS[:30], rising, diverged=True)
    assert r.suggested_lr is None
    assert "rose from the first step" in (r.message or "")
    nan_early = suggest_lr(LRS[:3], [2.3, float("nan"), float("nan")], diverged=True)
    assert nan_early.suggested_lr is None
    assert "diverged" in (nan_early.message or "")


def test_a_flat_loss_says_the_range_is_too_low() -> None:
    flat = 2.3 + np.random.default_rng(1).normal(0, 0.01, 60)
    r = suggest_lr(LRS[:60], flat)
    assert r.suggested_lr is None
    assert "did not fall" in (r.message or "")


def test_a_flat_loss_that_then_blew_up_does_not_advise_a_larger_range() -> None:
    """A loss that never fell and then blew up: a larger max_lr would only blow up sooner."""
    flat = [*(2.3 + np.random.default_rng(1).normal(0, 0.01, 60)), 40.0, float("nan")]
    for diverged in (True, False):  # the callback's flag, or only the non-finite loss
        r = suggest_lr(LRS[:62], flat, diverged=diverged)
        assert r.suggested_lr is None
        assert "before it blew up" in (r.message or "")
        assert "raise max_lr" not in (r.message or "")
    still_falling = suggest_lr(LRS[:40], [*_curve()[:38], float("nan"), float("nan")])
    assert "raise max_lr" not in (still_falling.message or "")


def test_range_test_runs_through_the_fit_loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict] = []
    real_fit = _lr_find.fit

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs)
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(_lr_find, "fit", spy)
    plot = tmp_path / "lr.png"
    r = lr_find("digits-mlp", min_lr=1e-5, max_lr=10.0, steps=40, device="cpu", plot=str(plot))
    assert len(calls) == 1
    assert isinstance(calls[0]["callbacks"][0], _lr_find.LRRangeCallback)
    assert calls[0]["max_steps"] == 40
    assert calls[0]["evaluate"] is False
    # the lrs are the planned geometric sweep, the test stopped on divergence before the end
    assert np.allclose(r.lrs, np.geomspace(1e-5, 10.0, 40)[: r.steps])
    assert r.diverged
    assert r.steps < 40
    assert "x best" in (r.stop_reason or "")
    assert r.suggested_lr is not None
    assert r.min_lr <= r.suggested_lr <= r.lr_at_min_loss <= r.max_lr
    assert plot.stat().st_size > 10_000
    assert plot.read_bytes()[:4] == b"\x89PNG"
    d = r.to_dict()
    assert len(d["curve"]) == r.steps
    assert {"lr", "loss", "smoothed"} <= set(d["curve"][0])


def test_given_model_and_optimizer_are_restored() -> None:
    task = proftune.load_task("digits-mlp")
    torch.manual_seed(0)
    model = task.build_model({})
    model.eval()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = lr_find(task, model=model, optimizer=optimizer, min_lr=1e-4, max_lr=1.0, steps=15, device="cpu")
    assert r.steps == 15
    assert r.optimizer == "Adam"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training
    assert optimizer.param_groups[0]["lr"] == 3e-4
    assert len(optimizer.state) == 0


def test_diverging_from_the_first_step_says_so() -> None:
    r = lr_find("digits-mlp", {"optimizer": "sgd"}, min_lr=50.0, max_lr=1e4, steps=30, device="cpu",
                ladder_steps=0)
    assert r.suggested_lr is None
    assert r.ladder is None
    assert r.diverged
    assert "first step" in (r.message or "") or "diverged" in (r.message or "")


def test_bad_ranges_are_config_errors_naming_every_problem() -> None:
    with pytest.raises(ConfigError, match=r"min_lr=1\.0 must be below max_lr=0\.1"):
        lr_find("digits-mlp", min_lr=1.0, max_lr=0.1)
    with pytest.raises(ConfigError) as info:
        lr_find("digits-mlp", min_lr=-1.0, max_lr=float("nan"), steps=2)
    assert len(info.value.problems) == 3


def test_plot_problems_name_the_argument_and_the_cli_reads_the_flag(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """lr_find() names plot= (a missing folder, no matplotlib); `proftune lr-find` reads --plot."""
    from typer.testing import CliRunner

    from proftune.cli import app
    from proftune.exceptions import DependencyError

    db = f"sqlite:///{tmp_path / 'p.db'}"
    missing = str(tmp_path / "missing" / "lr.png")
    with pytest.raises(ConfigError) as err:
        lr_find("digits-mlp", steps=5, device="cpu", plot=missing, db=db)
    assert str(err.value).startswith(f"plot={missing!r}: folder")
    res = CliRunner().invoke(app, ["lr-find", "digits-mlp", "--steps", "5", "--device", "cpu", "--plot", missing,
                                   "--db", db])
    assert res.exit_code == 2
    assert f"--plot {missing!r}: folder" in " ".join(res.stderr.split())

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the report extra not installed
    plot = str(tmp_path / "lr.png")
    with pytest.raises(DependencyError, match=r"\(plot=\) needs matplotlib"):
        lr_find("digits-mlp", steps=5, device="cpu", plot=plot, db=db)
    res = CliRunner().invoke(app, ["lr-find", "digits-mlp", "--steps", "5", "--device", "cpu", "--plot", plot,
                                   "--db", db])
    assert res.exit_code == 2
    assert "(--plot) needs matplotlib: pip install 'proftune[report]'" in " ".join(res.stderr.split())
