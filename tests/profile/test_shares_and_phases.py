"""Per-layer shares with their spread over the timed steps, and phases that add up to the step
(issue 63: a ReLU at 63% of the step in one run and 20% in the next; 1.07 ms of phases for a
0.24 ms step)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import proftune
from proftune.profile import Monitor, Profile
from proftune.profile._timing import PHASES, LayerTimer, fastest_step_ms, scaled_to, share_spread, step_summary


def _phases(summary: dict[str, float]) -> float:
    return sum(summary[k] for k in PHASES) + summary["other_ms"]


def test_phases_are_the_median_steps_and_add_up_to_it() -> None:
    # phase-by-phase medians would be data 1, forward 5, backward 5, optimizer 1: 12 ms of
    # phases for a median step of 10 ms
    timings = [
        {"data_ms": 1.0, "forward_ms": 5.0, "backward_ms": 1.0, "optimizer_ms": 1.0, "wall_ms": 9.0},
        {"data_ms": 1.0, "forward_ms": 1.0, "backward_ms": 5.0, "optimizer_ms": 1.0, "wall_ms": 10.0},
        {"data_ms": 4.0, "forward_ms": 5.0, "backward_ms": 5.0, "optimizer_ms": 4.0, "wall_ms": 20.0},
    ]
    s = step_summary(timings, [32, 32, 32])
    assert s["time_ms"] == 10.0
    assert (s["data_ms"], s["forward_ms"], s["backward_ms"], s["optimizer_ms"]) == (1.0, 1.0, 5.0, 1.0)
    assert s["other_ms"] == pytest.approx(2.0)
    assert _phases(s) == pytest.approx(s["time_ms"])
    # an even count: the mean of the two middle steps, which is the median wall
    s = step_summary([*timings, {**timings[2], "wall_ms": 30.0}], [32] * 4)
    assert s["time_ms"] == pytest.approx(15.0)
    assert _phases(s) == pytest.approx(15.0)
    # a step whose clocks put its phases past its wall takes their sum as its time
    s = step_summary([{"data_ms": 1.0, "forward_ms": 2.0, "backward_ms": 3.0, "optimizer_ms": 1.0,
                       "wall_ms": 5.0}], [1])
    assert s["time_ms"] == 7.0
    assert s["other_ms"] == 0.0


def test_phases_of_instrumented_steps_are_scaled_to_the_untouched_step() -> None:
    sampled = step_summary([{"data_ms": 0.1, "forward_ms": 0.5, "backward_ms": 0.35, "optimizer_ms": 0.12,
                             "wall_ms": 1.07}], [8])
    s = scaled_to(sampled, 0.24)
    assert s["time_ms"] == 0.24
    assert s["sampled_ms"] == pytest.approx(1.07)
    assert _phases(s) == pytest.approx(0.24)
    assert s["forward_ms"] / s["time_ms"] == pytest.approx(0.5 / 1.07)


def test_share_spread_needs_two_steps_for_quartiles() -> None:
    assert share_spread([], 10.0).samples == 0
    one = share_spread([4.0], 10.0)
    assert (one.fastest, one.median) == (0.4, 0.4)
    assert one.q1 is None
    assert one.second is None
    five = share_spread([2.0, 6.3, 3.0, 2.5, 3.5], 10.0)
    assert five.fastest == pytest.approx(0.2)
    assert five.second == pytest.approx(0.25)
    assert five.median == pytest.approx(0.3)
    assert five.q1 == pytest.approx(0.25)
    assert five.q3 == pytest.approx(0.35)
    assert five.samples == 5


def _monitored(steps: int = 24) -> Profile:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
    with Monitor(model, opt, every=2) as mon:
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    return mon.profile


def test_a_monitored_profile_has_phases_that_add_up_to_its_step_and_shares_with_spread() -> None:
    p = _monitored()
    s = p.step
    phases = s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms + s.other_ms
    assert phases == pytest.approx(s.time_ms, rel=1e-6)
    # the step is the untouched one; the sampled (hooked) step is kept beside it
    assert p.config["sampled_step_ms"] > 0
    timed = [lay for lay in p.layers if lay.forward_ms is not None]
    assert timed
    for lay in timed:
        # every other sample is a timed one: 12 samples, 6 timed
        assert lay.time_share_samples == 6
        assert lay.time_share_q1 is not None
        assert lay.time_share_q3 is not None
        assert 0.0 <= lay.time_share <= lay.time_share_q1 <= lay.time_share_median <= lay.time_share_q3
    # the record keeps the spread through its JSON
    assert Profile.from_dict(p.to_dict()).layers == p.layers


def test_profile_keeps_each_layers_share_per_step_and_its_findings_give_the_spread() -> None:
    p = proftune.profile("digits-mlp", batch_size=32, steps=4, device="cpu")
    s = p.step
    assert s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms + s.other_ms == pytest.approx(s.time_ms)
    timed = [lay for lay in p.layers if lay.forward_ms is not None]
    assert timed
    assert all(lay.time_share_samples == 4 for lay in timed)
    top = p.bottlenecks[0]
    assert top["time_share_samples"] == 4
    assert top["time_share_q1"] <= top["time_share_q3"]
    assert "fastest of 4 steps; their middle half took" in top["finding"]


def test_a_step_stalled_in_one_layer_moves_neither_its_time_nor_its_share() -> None:
    """Five steps of two layers (fc: 2 ms forward and 2 ms backward, act: 1 ms and 1 ms) and 1 ms of
    loss outside them; on one step the machine's load stalls act's forward for 50 ms. Means would
    read act at 12 ms of a 17 ms step (71%); the medians read it as the other four steps do (2 ms
    of 7, 29%)."""
    timer = LayerTimer(nn.Identity())
    timer._begin()
    for step in range(5):
        act_fwd = 51.0 if step == 2 else 1.0
        timer._fwd = {"fc": 2.0, "act": act_fwd}
        # backward runs act's then fc's piece (seconds on the timer's clock)
        timer._events = [(0.0, "act"), (0.001, "fc")]
        timer.mark_backward_end(0.003)
        timer.end_step(2.0 + act_fwd + 3.0 + 1.0)  # the layers, and 1 ms of loss outside them
    assert timer.per_layer() == {"fc": (2.0, pytest.approx(2.0)), "act": (1.0, pytest.approx(1.0))}
    total, outside = timer.typical_step_ms()
    assert (total, outside) == (pytest.approx(7.0), pytest.approx(1.0))
    fastest = fastest_step_ms(timer.step_ms, timer.rest_ms)
    assert fastest == pytest.approx(7.0)
    act = share_spread(timer.step_ms["act"], fastest)
    assert act.fastest == act.median == pytest.approx(2 / 7)
    assert act.q3 == pytest.approx(2 / 7)  # the stalled step (52 ms) is outside the middle half
    assert max(timer.step_ms["act"]) == pytest.approx(52.0)
