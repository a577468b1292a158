"""The race's decision as a reader sees it: one stated confidence (95% for the race, whatever
the number of tests sharing its error) and a bound that can be checked from the noise shown."""

from __future__ import annotations

import pytest

from proftune.optimize._decide import compare_paired
from proftune.optimize._story import _noise
from proftune.report._optimize_stages import _bound_arithmetic, _bound_label


@pytest.mark.parametrize(("alpha", "label"), [
    (0.05, "95% one-sided"),
    (0.025, "95% for the race (97.5% one-sided for each of its 2 tests)"),
    (0.05 / 3, "95% for the race (98.3% one-sided for each of its 3 tests)"),
])
def test_the_bound_is_stated_at_the_race_s_one_level(alpha: float, label: str) -> None:
    c = compare_paired([0.93, 0.91], [0.90, 0.91], seeds=[0, 1], metric="accuracy", maximize=True,
                       alpha=alpha, prior_std=0.012)
    assert _bound_label(c.level) == label
    said = _noise(c, "accuracy")
    if alpha == 0.05:
        assert "the 95% lower bound" in said
    else:  # one level stated, not the test's own 97% or 98%
        assert "(95% for the race: " in said
        assert f"the {c.level:.0%} lower bound" not in said


def test_the_bound_is_shown_as_arithmetic_on_the_noise_it_came_from() -> None:
    known = compare_paired([0.93, 0.92], [0.90, 0.905], seeds=[0, 1], metric="accuracy", maximize=True,
                           alpha=0.025, prior_std=0.012)
    how = _bound_arithmetic(known, 0.012)
    assert how is not None
    assert "one seed's noise 0.012 x √2 = 0.017" in how
    assert how.startswith(f"{known.gain:+.3g} - 1.96 x 0.017 / √2")  # the noise, not the pairs' 0.0106
    own = compare_paired([0.93, 0.91, 0.95, 0.92], [0.90, 0.91, 0.90, 0.85], seeds=[0, 1, 2, 3],
                         metric="accuracy", maximize=True)
    how = _bound_arithmetic(own, None)
    assert how is not None
    assert "Student's t, 3 df" in how
    # a bound that the figures shown do not give (the noise unknown to the page) is not explained
    assert _bound_arithmetic(known, 0.5) is None
