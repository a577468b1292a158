"""The end of a known budget refines around the leaders: a neighbour one step away in every kind
of param, repeats every second evaluation within their share, nothing before the phase."""

from __future__ import annotations

import math

import pytest

from proftune.search import Space
from proftune.search._reeval import Group
from proftune.search._refine import STEPS, neighbours, next_step, refining

SPACE = Space.from_dict({"params": {
    "opt": {"type": "categorical", "choices": ["sgd", "adam", "rmsprop"]},
    "layers": {"type": "int", "low": 1, "high": 4},
    "width": {"type": "int", "low": 16, "high": 1024},
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1},
    "momentum": {"type": "float", "low": 0.0, "high": 0.99, "when": {"opt": "sgd"}}},
    "forbid": [{"layers": 4, "width": ">1000"}]})


def _changed(a: dict, b: dict) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def test_each_neighbour_moves_one_param_one_step() -> None:
    base = {"opt": "adam", "layers": 1, "width": 512, "lr": 1e-3, "dropout": 0.2}
    near = neighbours(base, SPACE)
    moved: dict[str, list] = {}
    for n in near:
        diff = _changed(base, n)
        assert len(diff - {"momentum"}) == 1, (n, diff)  # one searched param (and what it switches on)
        k = next(iter(diff - {"momentum"}))
        moved.setdefault(k, []).append(n[k])
    assert sorted(moved["opt"]) == ["rmsprop", "sgd"]  # every other choice
    assert moved["layers"] == [2]  # a short integer range: the next value; 0 is outside it
    lo, hi = math.log(1e-4), math.log(1e-1)
    for v in moved["lr"]:  # a log range: 1/STEPS of it on the log scale
        assert abs(math.log(v) - math.log(1e-3)) == pytest.approx((hi - lo) / STEPS)
    assert sorted(moved["dropout"]) == pytest.approx([0.1, 0.3])  # a stepped range: the next steps
    assert all(abs(v - 512) == pytest.approx((1024 - 16) / STEPS, abs=1) for v in moved["width"])
    # switching opt to sgd switches momentum on at its centre; leaving sgd drops it
    sgd = next(n for n in near if n["opt"] == "sgd")
    assert sgd["momentum"] == SPACE.param("momentum").center()
    assert all("momentum" not in n for n in neighbours({**sgd, "opt": "sgd"}, SPACE) if n["opt"] != "sgd")


def test_forbidden_neighbours_are_left_out_and_fixed_params_are_not_moved() -> None:
    base = {"opt": "adam", "layers": 3, "width": 1024, "lr": 1e-3, "dropout": 0.0, "seed_fixed": 7}
    near = neighbours(base, SPACE)
    assert near
    assert all(not (n["layers"] == 4 and n["width"] > 1000) for n in near)
    assert all("seed_fixed" not in n for n in near)


def test_the_phase_alternates_neighbours_and_repeats_within_their_share() -> None:
    gs = [Group({"x": i}, (float(abs(i - 5)),)) for i in range(0, 11, 2)]
    space = Space.from_dict({"params": {"x": {"type": "int", "low": 0, "high": 10}}})
    kw = {"maximize": False, "share": 0.25, "budget": 60}
    assert not refining(29, share=0.25, budget=60)
    assert refining(30, share=0.25, budget=60)  # the last 2 x 0.25 of 60
    assert next_step(gs, space, repeats=0, evaluations=29, **kw) is None  # exploring: the sampler draws
    first = next_step(gs, space, repeats=0, evaluations=30, **kw)
    assert first is not None
    assert first.kind == "neighbour"
    assert first.params["x"] in (3, 5, 7)  # next to a leader (4 or 6), not seen yet
    second = next_step(gs, space, repeats=0, evaluations=31, **kw)
    assert second is not None
    assert second.kind == "repeat"
    assert second.params["x"] in (4, 6)
    spent = next_step(gs, space, repeats=15, evaluations=31, **kw)  # 15 = 0.25 x 60: no more repeats
    assert spent is not None
    assert spent.kind == "neighbour"
    assert next_step(gs, space, repeats=0, evaluations=30, maximize=False, share=0.25, budget=40) is None  # < 50


def test_without_a_budget_repeats_are_interleaved_and_no_neighbour_is_tried() -> None:
    close = [Group({"x": 1}, (1.0, 1.2)), Group({"x": 2}, (1.05,)), Group({"x": 3}, (5.0,))]
    space = Space.from_dict({"params": {"x": {"type": "int", "low": 0, "high": 10}}})
    step = next_step(close, space, maximize=False, repeats=0, evaluations=12, share=0.3, budget=None)
    assert step is not None
    assert (step.kind, step.params, step.n) == ("repeat", {"x": 2}, 1)


def test_seen_neighbours_give_way_to_nearer_ones_then_to_a_repeat() -> None:
    cont = Space.from_dict({"params": {"x": {"type": "float", "low": 0.0, "high": 1.0}}})
    kw = {"maximize": False, "share": 0.25, "budget": 60, "repeats": 15, "evaluations": 40}
    seen = [Group({"x": 0.5}, (0.0,)), Group({"x": 0.4}, (1.0,)), Group({"x": 0.6}, (1.0,)), Group({"x": 0.9}, (2.0,))]
    step = next_step(seen, cont, **kw)
    assert step is not None
    assert step.kind == "neighbour"
    assert step.params["x"] in (pytest.approx(0.45), pytest.approx(0.55))  # 0.4 and 0.6 seen: half the step
    # a two-valued categorical: once both are seen, nothing new is near; the least-evaluated leader runs again
    cat = Space.from_dict({"params": {"a": {"type": "categorical", "choices": ["p", "q"]}}})
    both = [Group({"a": "p"}, (0.0, 0.1)), Group({"a": "q"}, (0.5,))]
    again = next_step(both, cat, **kw)
    assert again is not None
    assert (again.kind, again.params) == ("repeat", {"a": "q"})
