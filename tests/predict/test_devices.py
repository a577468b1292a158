"""predict/_devices.py: a target that is not in the table names predict's arguments for a custom one."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from proftune import ConfigError
from proftune.cli import app
from proftune.predict import resolve_target


def test_unknown_target_names_the_arguments_and_the_cli_its_flags() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_target("h900")
    message = str(err.value)
    assert message.startswith("target='h900' is not a known device; valid: h200, h100, a100")
    assert "give device_memory=, peak_tflops= and bandwidth= for another one" in message
    assert "--" not in message
    res = CliRunner().invoke(app, ["predict", "digits-mlp", "--batch-size", "8", "--target", "h900"])
    assert res.exit_code == 2
    assert "give --device-memory, --peak-tflops and --bandwidth for another one" in " ".join(res.stderr.split())
