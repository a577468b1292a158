"""`proftune profile`: --json keys, --out/--compare, the Run it records, bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune import profile
from proftune.cli import app
from proftune.exceptions import ConfigError
from proftune.track import Store

runner = CliRunner()

BROKEN_TASK = '''
import torch
from torch import nn
import proftune
from proftune.examples import TensorBatches


class Broken(proftune.ClassificationTask):
    name = "broken"

    def build_model(self, params):
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(12, 3)))

    def train_data(self, batch_size, params):
        g = torch.Generator().manual_seed(0)
        return TensorBatches(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g),
                             batch_size, shuffle=False)

    def val_data(self, batch_size):
        return self.train_data(batch_size, {})
'''


def test_json_keys_out_compare_and_run(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    res = runner.invoke(app, ["profile", "digits-mlp", "--steps", "1", "--warmup", "0", "--device", "cpu",
                              "--db", db, "--out", str(a), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert {"total", "trainable"} <= set(d["params"])
    for key in ("macs", "flops", "layers", "memory", "step", "schema_version"):
        assert key in d, key
    for key in ("name", "type", "params", "macs", "flops", "forward_ms", "backward_ms", "activation_bytes"):
        assert all(key in lay for lay in d["layers"]), key
    assert set(d["memory"]) >= {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes"}
    assert set(d["step"]) >= {"time_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms", "throughput"}
    run = Store(db).get_run(d["config"]["run_id"])
    assert run.kind == "profile"
    assert run.status == "finished"
    assert json.loads(a.read_text())["macs"] == d["macs"]

    res = runner.invoke(app, ["profile", "digits-mlp", "--param", "hidden=64", "--steps", "1", "--warmup", "0",
                              "--device", "cpu", "--db", db, "--out", str(b)])
    assert res.exit_code == 0, res.output
    assert "top" in res.stdout
    assert "peak of a step" in res.stdout
    res = runner.invoke(app, ["profile", "--compare", str(a), str(b), "--json"])
    assert res.exit_code == 0, res.output
    cmp = json.loads(res.stdout)
    assert cmp["totals"]["params"]["b"] < cmp["totals"]["params"]["a"]
    first = next(row for row in cmp["layers"] if row["name"] == "0")
    assert first["params"]["a"] == 64 * 128 + 128
    assert first["params"]["b"] == 64 * 64 + 64
    res = runner.invoke(app, ["profile", "--compare", str(a), str(b)])
    assert res.exit_code == 0
    assert "per layer" in res.stdout


def test_batch_size_zero_exits_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["profile", "digits-mlp", "--batch-size", "0", "--db", f"sqlite:///{tmp_path}/p.db"])
    assert res.exit_code == 2
    assert "batch_size" in res.stderr
    assert "0" in res.stderr


def test_a_trace_in_a_missing_folder_names_the_argument_and_the_cli_its_flag(tmp_path: Path) -> None:
    """profile() names trace= (its argument); the command line reads --trace."""
    trace = str(tmp_path / "missing" / "t.json")
    with pytest.raises(ConfigError) as err:
        profile("digits-mlp", steps=1, trace=trace)
    assert str(err.value).startswith(f"trace={trace!r}: folder")
    assert "--trace" not in str(err.value)
    res = runner.invoke(app, ["profile", "digits-mlp", "--steps", "1", "--trace", trace,
                              "--db", f"sqlite:///{tmp_path}/p.db"])
    assert res.exit_code == 2
    assert f"--trace {trace!r}: folder" in " ".join(res.stderr.split())


def test_forward_error_exits_2_naming_layer_and_shapes(tmp_path: Path) -> None:
    task = tmp_path / "broken.py"
    task.write_text(BROKEN_TASK)
    res = runner.invoke(app, ["profile", str(task), "--batch-size", "4", "--device", "cpu",
                              "--db", f"sqlite:///{tmp_path}/p.db"])
    assert res.exit_code == 2, res.output
    err = " ".join(res.stderr.split())
    assert "'2.0'" in err
    assert "Linear" in err
    assert "(4, 16)" in err


def test_missing_task_or_file_exits_2(tmp_path: Path) -> None:
    assert runner.invoke(app, ["profile"]).exit_code == 2
    res = runner.invoke(app, ["profile", "--compare", str(tmp_path / "no.json"), str(tmp_path / "no2.json")])
    assert res.exit_code == 2
    assert "does not exist" in res.stderr


def test_stderr_has_no_native_profiler_log_lines(tmp_path: Path) -> None:
    """kineto logs every profiler start/stop (and a GPU-count error on CUDA builds) to fd 2."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL")}
    proc = subprocess.run(
        [sys.executable, "-m", "proftune.cli", "profile", "digits-mlp", "--steps", "1", "--warmup", "0",
         "--device", "cpu", "--db", f"sqlite:///{tmp_path / 'p.db'}", "--json"],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    json.loads(proc.stdout)
    noisy = [line for line in proc.stderr.splitlines()
             if line.startswith(("USDT:", "ERROR:", "WARNING:", "[W", "[I")) or "Warning" in line]
    assert noisy == []


def test_structure_and_onnx(tmp_path: Path) -> None:
    """--structure adds the module tree (totals those of the profile: one counter), --onnx a
    file ONNX Runtime ran with torch's outputs; --onnx is checked before any work."""
    pytest.importorskip("onnxruntime")
    onnx_path = tmp_path / "m.onnx"
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = runner.invoke(app, ["profile", "digits-mlp", "--steps", "1", "--warmup", "0", "--detail", "step",
                              "--structure", "--onnx", str(onnx_path), "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    s = d["structure"]
    assert s["macs"] == d["macs"]
    assert s["params_total"] == d["params"]["total"]
    root = s["rows"][0]
    assert root["name"] == ""
    assert root["output_shapes"][0][-1] == 10
    assert d["onnx"]["matches"] is True
    assert onnx_path.stat().st_size == d["onnx"]["size_bytes"]
    again = runner.invoke(app, ["profile", "digits-mlp", "--onnx", str(onnx_path), "--db", db])
    assert again.exit_code == 2
    assert "--onnx" in again.output
    assert "exists" in again.output
    table = runner.invoke(app, ["profile", "digits-mlp", "--steps", "1", "--warmup", "0", "--detail", "step",
                                "--structure", "--db", db])
    assert table.exit_code == 0
    assert "model structure" in table.output
    assert "Linear" in table.output
    # the stored profile holds its structure, and its report shows the tree
    from proftune.profile import Profile, Structure
    from proftune.report import render_report
    from proftune.track import Store

    run = Store(db).list_runs(kind="profile")[0]
    stored = Profile.from_dict(dict(run.result))
    assert stored.structure is not None
    assert Structure.from_dict(stored.structure).params_total == stored.params.total
    page = render_report(run, db=db)
    assert "<h2>Structure</h2>" in page or ">Structure<" in page
    assert "Linear" in page
