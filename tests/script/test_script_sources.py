"""Where a script's metric is read from beyond ``proftune.report`` and stdout: a Hugging Face
``Trainer``'s eval metrics (``benchmarks/scripts/hf_train.py`` under ``proftune optimize``) and the
TensorBoard scalars a script writes with a ``SummaryWriter`` (``proftune tune``), each end to end."""

from __future__ import annotations

import importlib.util
import json
import shutil
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app

HF_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "scripts" / "hf_train.py"
#: One run of hf_train.py: 9 s quiet, 25 s at the load of other jobs on the shared 2-core machine
#: (measured; the import of transformers most of it). 60 s hold the defaults' run and, when quiet, a
#: trial or two beside a race of two rounds; under load the search is skipped and says why. Whether
#: the search beats the defaults is measured by ``benchmarks/script.py --script hf``, not here.
BUDGET = "60s"

#: Gradient descent on an ill-conditioned bowl in torch, its figure written only as TensorBoard
#: scalars (``val_acc``: 1 - the share of the loss left); its stdout holds nothing parseable.
TB_SCRIPT = textwrap.dedent('''
    import argparse
    import tempfile

    import torch
    from torch.utils.tensorboard import SummaryWriter

    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default=None)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    w = torch.ones(10) + 0.01 * torch.randn(10)
    w.requires_grad_(True)
    scale = torch.linspace(1.0, 20.0, 10)
    start = (scale * w.detach() ** 2).sum().item()
    opt = torch.optim.SGD([w], lr=args.lr)
    writer = SummaryWriter(args.log_dir or tempfile.mkdtemp())
    for epoch in range(args.epochs):
        for _ in range(20):
            loss = (scale * w ** 2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        share = loss.item() / start
        writer.add_scalar("val_acc", max(0.0, 1.0 - min(share, 1.0)) if share == share else 0.0, epoch)
        writer.add_scalars("train", {"loss": loss.item()}, epoch)
    writer.close()
    print("done")
''')


@pytest.mark.slow  # each trial imports torch and tensorboard in its own process: 4-6 s on the loaded 2-core machine
@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tune_reads_the_tensorboard_scalars_a_script_writes(tmp_path: Path, db_url: str) -> None:
    script = tmp_path / "tb_train.py"
    script.write_text(TB_SCRIPT)
    logs = tmp_path / "logs"
    space = tmp_path / "space.yaml"  # rates that all converge: a larger one ends nearer the minimum
    space.write_text("params:\n  lr: {type: float, low: 0.0001, high: 0.01, log: true}\n")
    res = CliRunner().invoke(app, ["tune", "--json", "--db", db_url, "--trials", "3", "--sampler", "random",
                                   "--space", str(space), "--", "python", str(script), "--log-dir", str(logs),
                                   "--objective", "val_acc:max"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["script"]["metric_source"] == ("val_acc read from the TensorBoard scalars the script writes "
                                            "(SummaryWriter.add_scalar), through a hook")
    complete = sorted((t for t in d["trials"] if t["state"] == "complete"), key=lambda t: t["params"]["lr"])
    assert len(complete) == 3, d["trials"]
    for t in complete:
        assert "train/loss" in t["metrics"]  # add_scalars' tags, under main_tag/key
    accs = [t["metrics"]["val_acc"] for t in complete]
    assert all(0.0 < a <= 1.0 for a in accs)
    assert accs == sorted(accs)  # each trial's figure is its own run's: it rises with the rate it was given
    assert list(logs.rglob("events.out.tfevents.*"))  # the writer still wrote its own files


@pytest.mark.slow  # every run imports transformers in its own process: 9-12 s each on the loaded 2-core machine
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_optimize_on_a_hf_trainer_script_reads_its_eval_metrics(tmp_path: Path, db_url: str) -> None:
    script = tmp_path / "hf_train.py"
    shutil.copy(HF_SCRIPT, script)
    before = script.read_bytes()
    res = CliRunner().invoke(app, ["optimize", "--json", "--db", db_url, "--budget", BUDGET, "--",
                                   "python", str(script), "--output-dir", str(tmp_path / "out"),
                                   "--objective", "eval_accuracy:max"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["metric_source"] == ("eval_accuracy read from the Hugging Face Trainer's eval metrics (what its "
                                  "evaluate() returns), through a callback")
    base = d["vs_baseline"]["baseline"]
    assert base["eval_accuracy"] < 0.5  # lr 1e-5 for 3 epochs: the default is far from its best
    assert 0.0 <= base["test_acc"] <= 1.0  # the script's own `test_acc: X` line
    assert base["eval_loss"] > 0  # the rest of the Trainer's eval metrics, through the same callback
    assert base["step_time_ms"] > 0  # each run profiled by the hooks of `proftune run`
    params = d["final"]["params"]
    assert set(params) >= {"learning_rate", "batch_size", "weight_decay", "epochs"}  # argparse dest names
    assert "lr" not in params
    assert set(d["space"]["params"]) == {"learning_rate", "batch_size", "weight_decay"}
    assert d["final"]["command"].startswith(f"python {script}")
    stages = {s["stage"]: s for s in d["stages"]}
    assert stages["compress"]["status"] == "skipped"
    if stages["search"]["status"] == "skipped":  # the load of other jobs: too slow a run for this budget
        assert "holds no trial beside a race" in stages["search"]["did"]
        assert not d["final"]["adopted"]
    else:
        assert stages["search"]["status"] == "finished", stages["search"]["did"]
        assert not stages["search"]["did"].startswith("0 trials")
    if d["final"]["adopted"]:
        assert params["learning_rate"] > 1e-5
        assert "--lr " in d["final"]["command"]  # the flag's first long option
        assert d["vs_baseline"]["best"]["mean"] > d["vs_baseline"]["defaults"]["mean"]
    assert script.read_bytes() == before
