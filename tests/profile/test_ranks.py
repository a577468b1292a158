"""Stragglers across DDP ranks: a rank that sleeps in data loading is found, in the data phase."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from proftune.profile import StepProfile, profile_ranks
from proftune.profile._ranks import RankRow, summarize_ranks

TASK = '''
import time
import torch.distributed as dist
from proftune.examples._digits import DigitsMLP

class SlowRank(DigitsMLP):
    name = "slow-rank"
    def train_data(self, batch_size, params):
        slow = dist.is_initialized() and dist.get_rank() == 1
        for batch in super().train_data(batch_size, params):
            if slow:
                time.sleep(0.25)
            yield batch
'''
#: Seconds rank 1 sleeps per batch: far above what load adds to a digits batch, so the checks below
#: hold on a busy machine (each leaves half the delay, 125 ms, to noise).
DELAY_MS = 250.0


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_rank_sleeping_in_data_loading_is_the_straggler(tmp_path: Path) -> None:
    task = tmp_path / "slow_rank.py"
    task.write_text(TASK)
    res = profile_ranks(str(task), nprocs=2, steps=4, warmup=1, device="cpu")
    assert [r.rank for r in res.ranks] == [0, 1]
    assert res.slowest_rank == 1
    assert res.phase == "data"
    assert res.ranks[1].data_ms >= DELAY_MS  # the sleep's own floor
    assert res.ranks[0].data_ms < res.ranks[1].data_ms - DELAY_MS / 2
    assert res.excess_ms > DELAY_MS / 2
    assert res.imbalance > 1.1
    assert "data loading" in res.advice
    # the fast rank waited for it in the all-reduce
    assert res.ranks[0].allreduce_ms > res.ranks[1].allreduce_ms


def _row(rank: int, *, data: float = 1.0, fwd: float = 5.0, bwd: float = 10.0, wait: float = 1.0) -> RankRow:
    step = data + fwd + bwd + 1.0
    return RankRow(rank=rank, batch_size=16, allreduce_ms=wait, backend="gloo", task="t",
                   step=StepProfile(time_ms=step, data_ms=data, forward_ms=fwd, backward_ms=bwd, optimizer_ms=1.0,
                                    throughput=1.0))


def test_balanced_ranks_name_no_phase() -> None:
    res = summarize_ranks([_row(0), _row(1), _row(2)])
    assert res.phase is None
    assert "balanced" in res.advice
    assert res.imbalance == pytest.approx(1.0)


def test_forward_straggler_among_four() -> None:
    rows = [_row(0, wait=9.0), _row(1, wait=9.0), _row(2, fwd=14.0, wait=0.5), _row(3, wait=9.0)]
    res = summarize_ranks(rows)
    assert res.slowest_rank == 2
    assert res.phase == "forward"
    assert res.excess_ms == pytest.approx(9.0)


def test_fewer_than_two_ranks_is_a_config_error() -> None:
    from proftune.exceptions import ConfigError

    with pytest.raises(ConfigError, match="at least 2"):
        profile_ranks("digits-mlp", nprocs=1)


FAILING_RANK = '''
import torch.distributed as dist
from proftune.examples._digits import DigitsMLP

class BadRank(DigitsMLP):
    name = "bad-rank"
    def train_data(self, batch_size, params):
        if dist.is_initialized() and dist.get_rank() == 1:
            raise RuntimeError("rank 1 has no data")
        yield from super().train_data(batch_size, params)
'''


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_a_failing_rank_names_itself_and_its_traceback_is_on_stderr(tmp_path: Path,
                                                                    capfd: pytest.CaptureFixture[str]) -> None:
    """The message says where the rank's error is (its stderr, shown with or without the CLI's
    --debug), not a CLI flag: the library has none."""
    from proftune.exceptions import RunFailedError

    task = tmp_path / "bad_rank.py"
    task.write_text(FAILING_RANK)
    with pytest.raises(RunFailedError, match=r"\(1, 1\)") as err:
        profile_ranks(str(task), nprocs=2, steps=2, warmup=0, device="cpu", timeout_s=120)
    assert "traceback to stderr" in str(err.value)
    assert "--" not in str(err.value)
    assert "RuntimeError: rank 1 has no data" in capfd.readouterr().err
