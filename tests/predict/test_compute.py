"""The compute part of a data-parallel step: one process's step measured where the ranks would run
(target ``cpu``), the ranks' sharing of the cores, the roofline only where nothing can be measured,
and the overlap of each strategy's collectives as the runtime overlaps them."""

from __future__ import annotations

import pytest

from proftune.exceptions import ConfigError
from proftune.predict import COLLECTIVES, STRATEGIES, LinkFigures, ModelSizes, predict
from proftune.predict._compute import (
    ComputeFigures,
    between_collectives,
    measure_compute,
    measure_in_ranks,
    rank_sharing,
    spare_cores_per_rank,
)
from proftune.predict._link import ReplayedCall, replayed_calls
from proftune.task import load_task
from proftune.train import TrainParams

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
    params = TrainParams({**task.default_params, "grad_accumulation": 2})
    got = measure_compute(task, params, batch_size=4, steps=2, warmup=1)
    assert got.forward_ms > 0
    assert got.backward_ms > 0
    assert got.optimizer_ms > 0
    assert 0 < got.cpu_share <= 1.0
    assert "1 thread" in got.source
    assert "per-rank batch 4" in got.source


def test_an_fsdp_rank_is_timed_on_its_shards_with_the_other_ranks_pretended() -> None:
    """In a group of one FSDP2 skips its all-gather copies in and out and holds the whole model;
    of 2 ranks (the other one PyTorch's fake backend) it runs them on a rank's shards."""
    from pathlib import Path

    task = load_task(f"{Path(__file__).parent / 'block_tasks.py'}:DeepBlocks")
    params = TrainParams(task.default_params)
    alone = measure_compute(task, params, batch_size=2, strategy="fsdp", steps=1, warmup=1)
    two = measure_compute(task, params, batch_size=2, strategy="fsdp", steps=1, warmup=1, world=2)
    import torch.distributed as dist

    assert not dist.is_initialized()  # the pretended group is gone with the measurement
    assert (alone.world, two.world) == (1, 2)
    assert "wrapped as one fsdp rank of 2 (the others pretended)" in two.source
    assert "pretended" not in alone.source


def test_fsdp_s_compute_is_timed_at_the_share_a_rank_gets_between_the_collectives_it_waits_on() -> None:
    """FSDP2 on CPU waits on each all-gather and reduce-scatter in its compute thread: its core is
    free for the other ranks then. Stepping together without their collectives the ranks got half
    a core each; between them 0.9: forward and backward take 0.5 / 0.9 of what they measured, the
    optimizer step (no collectives in it) what it measured (issue 46: FSDP2 predicted 1.1-1.5x)."""
    together = ComputeFigures("cpu", 1, 2, "none", forward_ms=10.0, backward_ms=20.0, optimizer_ms=5.0, steps=5,
                              wrapped="fsdp", cpu_share=0.5, ranks=2, world=2)
    got = between_collectives(together, wall_ms=100.0, cpu_ms=90.0)
    assert (got.forward_ms, got.backward_ms) == (pytest.approx(10.0 * 0.5 / 0.9), pytest.approx(20.0 * 0.5 / 0.9))
    assert got.optimizer_ms == 5.0
    assert got.cpu_share == pytest.approx(0.9)
    assert "between its replayed collectives" in got.source
    assert "between its replayed collectives" not in together.source
    assert between_collectives(together, wall_ms=0.0, cpu_ms=0.0) == together  # nothing replayed


def test_fsdp_ranks_time_their_compute_between_their_replayed_collectives() -> None:
    """Two real FSDP ranks (gloo): the step's all-gathers and reduce-scatters replayed between
    them with the compute's CPU time spent before each launch, and the compute read at the share
    of a core each got there."""
    from pathlib import Path

    task = f"{Path(__file__).parent / 'block_tasks.py'}:DeepBlocks"
    params = TrainParams(load_task(task).default_params)
    calls = [ReplayedCall("all-gather parameters (forward)", "all-gather", 16384, 9),
             ReplayedCall("reduce-scatter gradients", "reduce-scatter", 16384, 9)]  # 9 units, 64 KiB each
    got = measure_in_ranks(task, params, ranks=2, batch_size=2, calls=calls, strategy="fsdp", steps=1, warmup=1,
                           repeats=1)
    assert got.between_collectives
    assert 0 < got.cpu_share <= 1.0
    assert got.forward_ms > 0
    assert got.backward_ms > 0
    assert set(got.collectives_ms) == {c.name for c in calls}
    assert "between its replayed collectives" in got.source


def test_the_roofline_where_asked_or_where_the_ranks_are_not_here() -> None:
    kw = {"batch_size": 8, "gpus": 2, "strategy": "ddp", "max_batch": False, "link": SLOW}
    params = {"grad_accumulation": 2}
    roof = predict("digits-mlp", params, target="cpu", compute="roofline", **kw).parallel
    assert roof is not None
    assert roof.compute["name"] == "roofline"
    assert "compute='roofline'" in roof.compute["source"]
    assert roof.link["source"] == "test"
    gpu = predict("digits-mlp", params, target="a100", **kw).parallel
    assert gpu is not None
    assert gpu.compute["name"] == "roofline"
    assert "no a100 here" in gpu.compute["source"]
    with pytest.raises(ConfigError, match="compute='fast' is unknown; valid: auto, roofline"):
        predict("digits-mlp", batch_size=8, gpus=2, compute="fast")


def test_ddp_all_reduces_each_micro_batch_as_the_fit_loop_runs_it() -> None:
    one, four = (STRATEGIES["ddp"].collectives(DEEP, 4, m)[0] for m in (1, 4))
    assert (one.times, four.times) == (1, 4)
    assert four.bytes_per_gpu == one.bytes_per_gpu == 2 * 0.75 * DEEP.grads_bytes


def test_the_replay_sends_each_collective_at_the_step_s_sizes_and_launches() -> None:
    for name in ("ddp", "fsdp"):
        for n in (2, 4):
            collectives = STRATEGIES[name].collectives(DEEP, n, 3)
            calls = replayed_calls(collectives, n)
            for c, r in zip(collectives, calls, strict=True):
                assert r.name == c.name
                assert r.launches == c.calls * c.times
                assert r.elements % n == 0
                ring = (2 if r.kind == "all-reduce" else 1) * (n - 1) / n
                assert r.elements * 4 * ring * c.calls == pytest.approx(c.bytes_per_gpu, rel=1e-3), (name, n, c)
    fsdp = replayed_calls(STRATEGIES["fsdp"].collectives(DEEP, 2, 1), 2)
    # one unit's parameters per all-gather (nine units and the root), not the model's
    assert fsdp[0].elements == 4_000_000 // 4


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


#: The predicted / measured step of the real DDP test: the benchmark's single repetitions of the
#: 2-rank DDP cases reach 0.57-2.01 at load 6-10 (medians of 3: 0.81-1.19), and this test beside
#: the benchmark's ranks read 1.74: a machine in any state.
BAND = (0.4, 2.5)


def test_real_ddp_ranks_take_about_the_step_the_prediction_says() -> None:
    """DDP on 2 gloo CPU ranks, 8 blocks, accumulation 2: the predicted step (the 2 ranks' compute
    measured as they step together, wrapped as DDP ranks, plus the step's all-reduces replayed
    between them), taken right before the real ranks' step. benchmarks/sharded.py at load 6-10,
    all 16 cases: medians of 3 repetitions 0.81-1.49 (12 of 16 within 25%); before (one process's
    step, slowed by a modelled sharing, plus a sweep): 0.39-1.82 (4 of 16).
    The band is for a machine in any state (issue 48)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from sharded_runs import measure

    task = f"{Path(__file__).parent / 'block_tasks.py'}:DeepBlocks"
    params = {"grad_accumulation": 2}
    p = predict(task, params, batch_size=2, target="cpu", gpus=2, strategy="ddp", max_batch=False).parallel
    measured = measure(task, world=2, strategy="ddp", batch_size=2, params=params, timed_steps=5)
    assert p is not None
    c = p.compute
    assert c["name"] == "measured"
    assert c["source"].startswith("measured: 5 steps of each of 2 processes stepping together on cpu at 1 thread")
    assert "wrapped as one ddp rank" in c["source"]
    assert c["ranks_measured"] == 2
    assert c["sharing"] == 1.0  # measured while the ranks shared the cores, not modelled
    # DDP: every micro-batch's forward and backward, the whole optimizer step
    assert p.step["compute_ms"] == pytest.approx(2 * (c["forward_ms"] + c["backward_ms"]) + c["optimizer_ms"])
    # the collectives: the step's own, replayed between those ranks (no sweep, no datasheet)
    assert p.link["name"] == "replayed gloo (2 ranks)"
    replayed = p.link["collectives_ms"]
    assert set(replayed) == {"all-reduce gradients"}
    assert [x["times"] for x in p.collectives] == [2]  # one all-reduce per micro-batch
    assert p.step["comm_ms"] == pytest.approx(sum(replayed.values()))
    assert p.step["comm_ms"] > 0
    ratio = float(p.step["time_ms"] or 0) / measured["step_ms"]
    assert BAND[0] <= ratio <= BAND[1], (p.step, p.compute, measured["step_ms"])
