from __future__ import annotations

import pytest

from proftune.diagnose import CAUSES, CHECKS, Finding, flatten_findings, rank_findings
from proftune.exceptions import ConfigError


def _f(cause: str, confidence: float, step: int | None, severity: str = "warning") -> Finding:
    return Finding(cause, severity, f"{cause} seen", "fix it", {"x": 1.0}, confidence, step=step)


def test_causes_are_the_issue_list() -> None:
    """Each cause of the issue's list is known and reported by a registered check (each check's
    behaviour on a History that shows its cause: test_checks.py)."""
    expected = {"lr_too_high", "unshuffled_data", "exploding_gradients", "vanishing_gradients",
                "dead_units", "nan_inf", "overfitting", "lr_too_low", "batchnorm_small_batch",
                "saturated_activations", "oscillating_loss", "slow_convergence", "no_warmup", "no_lr_decay"}
    assert set(CAUSES) == expected
    assert sorted(c.cause for c in CHECKS) == sorted(expected)
    for cause in expected:
        assert Finding(cause, "warning", "s", "f").cause == cause


def test_unknown_cause_and_severity_are_one_error() -> None:
    with pytest.raises(ConfigError) as info:
        Finding("slow", "fatal", "s", "f")
    assert "cause='slow'" in str(info.value)
    assert "severity='fatal'" in str(info.value)


def test_symptom_that_started_later_is_attached_to_its_cause() -> None:
    ranked = rank_findings([_f("dead_units", 0.7, step=12), _f("lr_too_high", 0.9, step=10, severity="error")])
    assert [f.cause for f in ranked] == ["lr_too_high"]
    (dead,) = ranked[0].consequences
    assert dead.cause == "dead_units"
    assert dead.explained_by == "lr_too_high"
    assert dead.confidence == pytest.approx(0.35)
    assert "step 10" in dead.why
    assert "step 12" in dead.why
    assert "explains dead_units (step 12)" in ranked[0].why


def test_root_cause_explains_even_a_more_confident_symptom() -> None:
    ranked = rank_findings([_f("lr_too_high", 0.9, step=3), _f("exploding_gradients", 0.6, step=6)],
                           roots=["exploding_gradients"])
    assert [f.cause for f in ranked] == ["exploding_gradients"]
    assert ranked[0].consequences[0].explained_by == "exploding_gradients"


def test_explosion_explains_the_nan_and_the_dead_units_and_takes_their_severity() -> None:
    """The issue's deep ReLU net: a warning (dead units) and an error (NaN) that the explosion caused
    are its consequences, not rivals ranked above it."""
    explosion = Finding("exploding_gradients", "warning", "s", "f", confidence=0.9, step=1, root=True)
    ranked = rank_findings([_f("dead_units", 0.95, step=2), explosion,
                            _f("nan_inf", 0.95, step=3, severity="error")])
    assert [f.cause for f in ranked] == ["exploding_gradients"]
    assert [c.cause for c in ranked[0].consequences] == ["dead_units", "nan_inf"]
    assert ranked[0].severity == "error"
    assert "severity error from its consequence nan_inf" in ranked[0].why


def test_independent_roots_are_ordered_by_severity_and_say_why() -> None:
    ranked = rank_findings([_f("overfitting", 0.9, step=5), _f("nan_inf", 0.6, step=9, severity="error")])
    assert [f.cause for f in ranked] == ["nan_inf", "overfitting"]
    assert ranked[0].why.startswith("ranked first")
    assert ranked[1].why == "ranked below nan_inf: severity warning < error"


def test_a_check_that_names_its_cause_is_explained_by_it_whatever_the_onsets() -> None:
    osc = Finding("oscillating_loss", "warning", "s", "f", {"attributed_to": "lr_too_high"}, 0.7, step=3)
    ranked = rank_findings([osc, _f("lr_too_high", 0.9, step=20)])
    assert [f.cause for f in ranked] == ["lr_too_high"]
    assert ranked[0].consequences[0].why.startswith("explained by lr_too_high: the oscillating_loss check names it")


def test_consequences_round_trip_through_to_dict() -> None:
    ranked = rank_findings([_f("dead_units", 0.7, step=12), _f("lr_too_high", 0.9, step=10)])
    d = ranked[0].to_dict()
    assert d["consequences"][0]["cause"] == "dead_units"
    assert d["why"]
    assert Finding.from_dict(d) == ranked[0]
    assert [f.cause for f in flatten_findings(ranked)] == ["lr_too_high", "dead_units"]


def test_one_finding_per_cause_and_dict_round_trip() -> None:
    ranked = rank_findings([_f("overfitting", 0.4, 3), _f("overfitting", 0.8, 5)])
    assert len(ranked) == 1
    assert ranked[0].confidence == 0.8
    d = ranked[0].to_dict()
    assert d["evidence"]["step"] == 5
    assert Finding.from_dict(d) == ranked[0]


def test_function_and_subpackage_share_the_name() -> None:
    import proftune
    from proftune.diagnose import AdaptiveLR, HealthCheck, bandit

    assert callable(proftune.diagnose)
    assert proftune.diagnose.diagnose.__module__ == "proftune.diagnose._api"  # proftune.diagnose: the subpackage
    assert proftune.AdaptiveLR is AdaptiveLR
    assert proftune.HealthCheck is HealthCheck
    assert callable(bandit)
    assert {"diagnose", "AdaptiveLR", "GradGuard", "EarlyStopping"} <= set(proftune.__all__)


def test_bandit_api_checks_arms_against_the_task(db_url: str) -> None:
    from proftune.diagnose import Arm, bandit

    with pytest.raises(ConfigError) as info:
        bandit("digits-mlp", [Arm("a", {"lr": 0.01}), Arm("a", {"hiden": 3, "lr": -1})], rounds=1, db=db_url)
    text = str(info.value)
    assert "'hiden' is unknown" in text
    assert "lr=-1" in text
    assert "unique" in text
