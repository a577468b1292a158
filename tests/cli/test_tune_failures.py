"""A tune whose every trial failed did not do what was asked: exit 1 with the reason, its run failed."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from proftune.cli import app
from proftune.track import Store

TASK = '''
from proftune.examples._wine import WineMLP


class Broken(WineMLP):
    name = "broken-wine"

    def evaluate(self, model, data):
        raise ValueError("my evaluate is broken")
'''


def test_a_tune_whose_every_trial_failed_exits_1_with_the_reason(tmp_path: Path) -> None:
    task = tmp_path / "broken.py"
    task.write_text(TASK)
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    result = CliRunner().invoke(app, ["tune", str(task), "--space", str(space), "--trials", "2", "--epochs", "1",
                                      "--max-failures", "5", "--db", f"sqlite:///{tmp_path / 'runs.db'}"])
    assert result.exit_code == 1, result.output
    assert "every trial failed (2 of 2)" in result.stderr
    assert "my evaluate is broken" in result.stderr
    # its tune run is failed too, not finished (issue 47), with the reason
    (tune,) = Store(f"sqlite:///{tmp_path / 'runs.db'}").list_runs(kind="tune")
    assert tune.status == "failed"
    assert "every trial failed (2 of 2)" in (tune.error or "")
