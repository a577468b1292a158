"""optimize's output files are written beside their place and renamed over it: a write that a
signal stops (SIGTERM is a KeyboardInterrupt in the CLI) leaves the finished file that was there,
or none, never a partial one where a finished one belongs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from proftune.optimize import _output


def _interrupted_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Path.write_text and savefig writes half of its bytes, then the signal arrives."""

    def write_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        with open(self, "w", encoding="utf-8") as f:
            f.write(data[: len(data) // 2])
        raise KeyboardInterrupt("signal SIGTERM")

    def savefig(self: Any, fname: Any, *args: Any, **kwargs: Any) -> None:
        Path(fname).write_bytes(b"\x89PNG\r\n half a plot")
        raise KeyboardInterrupt("signal SIGTERM")

    import matplotlib.figure

    monkeypatch.setattr(Path, "write_text", write_text)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)


def test_a_summary_interrupted_while_written_leaves_the_finished_one(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    finished = {"decision": "kept the defaults", "files": {}}
    (tmp_path / "summary.json").write_text(json.dumps(finished))
    result = SimpleNamespace(to_dict=lambda: {"decision": "chose lr=0.01", "pad": "x" * 10_000}, files={})
    _interrupted_writes(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _output.write_summary(result, tmp_path)  # type: ignore[arg-type]
    monkeypatch.undo()
    assert json.loads((tmp_path / "summary.json").read_text()) == finished
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temp file left either


def test_a_plot_interrupted_while_written_leaves_no_partial_png(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    empty = SimpleNamespace(history=[], trials=[], layers=[])
    state = SimpleNamespace(record=lambda kind: empty)
    result = SimpleNamespace(stages=[SimpleNamespace(name="baseline", duration_s=2.0, share_s=3.0)])
    _interrupted_writes(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _output._plots(result, state, tmp_path / "plots")  # type: ignore[arg-type]
    monkeypatch.undo()
    assert list((tmp_path / "plots").iterdir()) == []
