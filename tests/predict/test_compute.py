"""The compute part of a data-parallel step: one process's step measured where the ranks would run
(target ``cpu``), the ranks' sharing of the cores, the roofline only where nothing can be measured,
and the overlap of each strategy's collectives as the runtime overlaps them."""

from __future__ import annotations

import pytest

from proftune.exceptions import ConfigError
from proftune.predict import COLLECTIVES, STRATEGIES, LinkFigures, ModelSizes, predict
from proftune.predict._compute import measure_compute, rank_sharing, spare_cores_per_rank
from proftune.task import load_task
from proftune.train import validate_params

#: A link of 1 ms per call and 1 MB/s: collectives far longer than the step's compute.
SLOW = LinkFigures("gloo", 2, {k: {"latency_s": 1e-3, "bytes_s": 1e6} for k in COLLECTIVES}, False, "test")


@pytest.mark.parametrize(("ranks", "cores", "share", "expected"), [
    (2, 2, None, 1.0),  # a core each
    (4, 2, None, 2.0),  # half a core each
    (3, 4, None, 1.0),
    (4, 2, 0.5, 1.75),  # the one process got half a core: 3 others' threads ran; 7 threads on 2 cores
    (2, 2, 0.5, 1.25),
    (1, 2, 0.5, 1.0),
])
def test_ranks_share_the_cores_with_each_other_and_the_load_the_measurement_met(
        ranks: int, cores: int, share: float | None, expected: float) -> None:
    assert rank_sharing(ranks, threads=1, n_cores=cores, cpu_share=share) == pytest.approx(expected)


def test_spare_cores_per_rank() -> None:
    assert spare_cores_per_rank(2, threads=1, n_cores=2) == 0.0
    assert spare_cores_per_rank(2, threads=1, n_cores=8) == 1.0
    assert spare_cores_per_rank(4, threads=1, n_cores=6) == 0.5


def test_one_process_step_is_timed_by_phase() -> None:
    task = load_task("digits-mlp")
    params = validate_params({**task.default_params, "grad_accumulation": 2})
    got = measure_compute(task, params, batch_size=4, steps=2, warmup=1)
    assert got.forward_ms > 0
    assert got.backward_ms > 0
    assert got.optimizer_ms > 0
    assert 0 < got.cpu_share <= 1.0
    assert "1 thread" in got.source
    assert "per-rank batch 4" in got.source


def test_cpu_ranks_price_the_measured_compute_and_a_named_gpu_the_roofline() -> None:
    kw = {"batch_size": 8, "gpus": 2, "strategy": "ddp", "max_batch": False, "link": SLOW}
    params = {"grad_accumulation": 2}
    cpu = predict("digits-mlp", params, target="cpu", **kw).parallel
    assert cpu is not None
    c = cpu.compute
    assert c["name"] == "measured"
    assert c["source"].startswith("measured: 5 steps of one process on cpu at 1 thread")
    # DDP: every micro-batch's forward and backward, the whole optimizer step, slowed by the sharing
    expected = (2 * (c["forward_ms"] + c["backward_ms"]) + c["optimizer_ms"]) * c["sharing"]
    assert cpu.step["compute_ms"] == pytest.approx(expected)
    roof = predict("digits-mlp", params, target="cpu", compute="roofline", **kw).parallel
    assert roof is not None
    assert roof.compute["name"] == "roofline"
    assert "compute='roofline'" in roof.compute["source"]
    assert roof.step["compute_ms"] != pytest.approx(cpu.step["compute_ms"])
    gpu = predict("digits-mlp", params, target="a100", **kw).parallel
    assert gpu is not None
    assert gpu.compute["name"] == "roofline"
    assert "no a100 here" in gpu.compute["source"]
    with pytest.raises(ConfigError, match="compute='fast' is unknown; valid: auto, roofline"):
        predict("digits-mlp", batch_size=8, gpus=2, compute="fast")


#: Nine units and a root; gradients of 40 MB, bucketed by DDP into several all-reduces.
DEEP = ModelSizes(n_params=10_000_000, params_bytes=40_000_000, grads_bytes=40_000_000, optimizer_bytes=80_000_000,
                  unit_bytes=(4_000_000,) * 9, root_bytes=4_000_000, largest_layer_params=1_000_000)


def test_each_strategy_hides_all_but_one_call_behind_its_phase_on_a_gpu() -> None:
    from proftune.predict._devices import resolve_target
    from proftune.predict._parallel import Evaluator, _Point

    def tracer_for(mode: str) -> None:
        raise AssertionError("no trace here")

    ev = Evaluator(tracer_for, resolve_target("a100"), 4, 1)  # type: ignore[arg-type]
    long = _Point({}, {"forward": 1e6, "backward": 1e6, "optimizer": 1.0}, 0)  # phases far longer than the link
    for name in ("ddp", "fsdp"):
        strategy = STRATEGIES[name]
        step = ev._time(strategy, DEEP, "none", long, 1)
        alone = sum(ms_of(ev, c) / c.calls for c in strategy.collectives(DEEP, 4, 1) if c.overlaps)
        assert step["exposed_comm_ms"] == pytest.approx(alone), name  # one bucket's / unit's call each
        assert 0 < step["exposed_comm_ms"] < 0.5 * step["comm_ms"], name


def ms_of(ev: object, c: object) -> float:
    link = ev._link()  # type: ignore[attr-defined]
    return 1e3 * c.bytes_per_gpu * c.times / link["bytes_s"]  # type: ignore[attr-defined]


def test_cpu_ranks_with_no_core_to_spare_hide_none_of_their_collectives() -> None:
    p = predict("digits-mlp", batch_size=8, target="cpu", gpus=64, strategy="ddp", max_batch=False,
                link={**SLOW.to_dict(), "ranks": 64}).parallel
    assert p is not None
    assert p.step["exposed_comm_ms"] == pytest.approx(p.step["comm_ms"])


def test_real_ddp_ranks_take_about_the_step_the_prediction_says() -> None:
    """DDP on 2 gloo CPU ranks, 8 blocks: the predicted step (one process's step measured here,
    wrapped as one DDP rank, shared between the ranks, plus the collectives over the link those
    ranks measured) against the ranks' measured step. The band is wide because the ranks and the
    measurement run at different moments of a shared machine's load (benchmarks/sharded.py at load
    8-15: 0.39-1.82 over the 16 cases; the roofline's compute with the same link: 0.13-0.63), and
    the suite must pass on a machine in any state (issue 48): a third to three times."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from sharded_runs import measure

    task = f"{Path(__file__).parent / 'block_tasks.py'}:DeepBlocks"
    measured = measure(task, world=2, strategy="ddp", batch_size=2, timed_steps=3, link=True)
    link = LinkFigures("gloo", 2, measured["link"], False, "measured in the ranks")
    p = predict(task, batch_size=2, target="cpu", gpus=2, strategy="ddp", max_batch=False, link=link).parallel
    assert p is not None
    assert p.compute["name"] == "measured"
    assert "wrapped as one ddp rank" in p.compute["source"]
    assert p.link["source"] == "measured in the ranks"
    ratio = float(p.step["time_ms"] or 0) / measured["step_ms"]
    assert 1 / 3 <= ratio <= 3.0, (p.step, p.compute, measured["step_ms"])
