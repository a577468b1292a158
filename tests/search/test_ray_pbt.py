"""PBT on Ray's local instance: the population's ladder and its rounds, and a population that
beats a fixed rate from a start 10x off.

In a file of its own, apart from ``test_ray.py``: each file starts its own Ray instance (the module
fixture ``local_ray``), so that ``--dist loadgroup`` can run the two files on two workers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

import proftune
from proftune.search import RayOptions

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="ray[tune] is not installed (pip install 'proftune[ray]')")


def test_pbt_ladder_and_population_start_at_the_users_setting() -> None:
    from proftune.search import Space
    from proftune.search._pbt import ladder as _ladder
    from proftune.search._pbt import population_space
    from proftune.search._ray import _ray_space

    space = Space.from_dict({"params": {
        "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True, "default": 0.1},
        "dropout": {"type": "float", "low": 0.0, "high": 0.4, "default": 0.1},
        "hidden": {"type": "int", "low": 32, "high": 256, "step": 32}}})
    lr, dropout = space.params[0], space.params[1]
    # half-decade rungs down from the start, inside the declared range
    assert _ladder(lr) == pytest.approx([1e-4, 10**-3.5, 1e-3, 10**-2.5, 1e-2, 10**-1.5, 0.1])
    assert _ladder(dropout) == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4])
    pop = population_space(_ray_space(space), space, 4)
    spec = type("Spec", (), {})()
    values = []
    for member in range(4):
        spec.config = {"pbt_member": member}
        values.append((pop["lr"].func(spec), pop["dropout"].func(spec)))
    # member 0 at the user's setting, the others on the nearest rungs around it
    assert values[0] == (0.1, 0.1)
    assert [v[0] for v in values[1:]] == pytest.approx([10**-1.5, 1e-2, 10**-2.5])
    assert [v[1] for v in values[1:]] == pytest.approx([0.05, 0.15, 0.0])


def _ranked(schedule: dict[str, list[dict[str, Any]]], epoch: int) -> list[str]:
    """Members worst first by their objective at ``epoch``, ties in member order (as PBT ranks them)."""
    members = sorted(schedule, key=int)
    return sorted(members, key=lambda m: next(p["objective"] for p in schedule[m] if p["epoch"] == epoch))


def _assert_rounds_follow_the_ladder(schedule: dict[str, list[dict[str, Any]]], ladder: list[float],
                                     epochs: int) -> None:
    """Each round (after every epoch but the last) the two worst members continue from the best
    one, a rung above and a rung below it (inward at the ladder's end), and the two best keep
    their rate: decisions made from the scores alone, whichever member reported first."""
    lr = {m: {p["epoch"]: p["lr"] for p in pts} for m, pts in schedule.items()}
    for epoch in range(1, epochs):
        worst, second, third, best = _ranked(schedule, epoch)
        at = ladder.index(pytest.approx(lr[best][epoch]))
        up = at + 1 if at + 1 < len(ladder) else at - 2
        down = at - 1 if at >= 1 else at + 2
        assert sorted([lr[worst][epoch + 1], lr[second][epoch + 1]]) == pytest.approx(
            sorted([ladder[up], ladder[down]])), (epoch, schedule)
        assert lr[third][epoch + 1] == lr[third][epoch]
        assert lr[best][epoch + 1] == lr[best][epoch]


@pytest.mark.parametrize(("start", "low", "high"), [(0.01, 1e-4, 0.1), (10**1.5 / 10, 1e-3, 3.2)],
                         ids=["10x-too-low", "30x-too-high"])
def test_pbt_beats_a_fixed_rate_from_a_start_10x_off(tmp_path: Path, local_ray: Any, start: float,
                                                      low: float, high: float) -> None:
    from proftune.search import Space
    from proftune.search._pbt import ladder as _ladder

    # SGD on digits-mlp for 4 epochs: 0.1 is a good rate (0.79 accuracy); the start is 10x below it, or
    # 3 half-decades above it (3.16, on PBT's ladder through 0.1), where SGD diverges at any thread
    # count (10x above, 1.0, reached 0.76 at 1 thread and 0.63 at 2: its harm was float rounding)
    epochs, good = 4, 0.1
    lr_space = {"type": "float", "low": low, "high": high, "log": True, "default": start}
    space = {"params": {"lr": lr_space}, "fixed": {"optimizer": "sgd"}}
    res = proftune.search("digits-mlp", space, trials=4, epochs=epochs, db=f"sqlite:///{tmp_path / 'p.db'}",
                          study="pbt", device="cpu", backend="ray",
                          ray=RayOptions(workers=2, scheduler="pbt", population=4, storage_path=tmp_path / "ray"))
    fixed = proftune.fit("digits-mlp", {"lr": start, "optimizer": "sgd"}, epochs=epochs, device="cpu")
    tuned = proftune.fit("digits-mlp", {"lr": good, "optimizer": "sgd"}, epochs=epochs, device="cpu")
    assert fixed.metrics["accuracy"] < tuned.metrics["accuracy"] - 0.2  # the start does harm
    schedule = res.backend["schedule"]
    assert len(res.trials) == len(schedule) == 4
    # every member trained exactly `epochs` epochs, one recorded point per epoch
    assert [t.steps for t in res.trials] == [fixed.steps] * 4
    assert all([p["epoch"] for p in pts] == list(range(1, epochs + 1)) for pts in schedule.values())
    # the population is seeded deterministically: member 0 at the user's start, the others around it
    assert schedule["0"][0]["lr"] == start
    _assert_rounds_follow_the_ladder(schedule, _ladder(Space.from_dict({"params": {"lr": lr_space}}).params[0]),
                                     epochs)
    # the population reached the good rate, and it beats the fixed-rate run from the same start;
    # the run is deterministic (seeded, synchronous), these margins hold for it on any machine:
    # measured best 0.76 from the low start against 0.16 at it; from 3.16 the fixed run stays at chance
    assert any(p["lr"] == pytest.approx(good) for pts in schedule.values() for p in pts)
    assert res.best is not None
    assert res.best.metrics["accuracy"] >= fixed.metrics["accuracy"] + 0.2
    # the member that started at the user's setting was rescued by exploiting a better one
    rescued = next(t for t in res.trials if str(t.number) == "0")
    assert rescued.metrics["accuracy"] >= fixed.metrics["accuracy"] + 0.2
