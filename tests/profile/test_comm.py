"""DDP communication: 2 gloo processes on CPU; all-reduced bytes equal the gradient bytes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import proftune


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        # profile() wraps the task's model in DDP when it runs as one of several ranks
        p = proftune.profile("digits-mlp", steps=2, warmup=1, detail="step", device="cpu")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        with proftune.Monitor(ddp, opt, every=2, stats=False) as mon:
            for _ in range(4):
                loss = nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                mon.step(loss)
        assert p.comm is not None
        assert mon.profile.comm is not None
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
            "profile": p.comm.__dict__,
            "profile_grad_bytes": p.memory.grads_bytes,
            "monitor": mon.profile.comm.__dict__,
            "monitor_grad_bytes": sum(q.numel() * q.element_size() for q in model.parameters()),
        }))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_allreduce_bytes_equal_gradient_bytes(tmp_path: Path) -> None:
    # spawn, not fork: a child forked from a test process that has run threads (torch's pools, the
    # Store's, the thread monitor's) can abort in its first collective ("Resource deadlock
    # avoided", SIGABRT: once in a clean-clone CI run on a loaded machine); the imports cost seconds
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    for rank in (0, 1):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for key, grad_bytes in (("profile", r["profile_grad_bytes"]), ("monitor", r["monitor_grad_bytes"])):
            comm = r[key]
            assert comm["backend"] == "gloo"
            assert comm["world_size"] == 2
            # DDP's buckets hold the gradients back to back; padding, if any, is under 1 KiB/bucket
            assert grad_bytes <= comm["allreduce_bytes"] <= grad_bytes + 1024 * comm["allreduce_calls"]
            assert comm["allreduce_ms"] > 0
            assert 0 < comm["share"] <= 1.0
