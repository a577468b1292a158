"""benchmarks/gpu_check.py: claims nothing without a GPU; its table, exit codes and CPU dry run work."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses resolve the module's annotations through it
    spec.loader.exec_module(mod)
    return mod


def test_without_a_gpu_it_says_so_and_claims_nothing(gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no GPU")
    assert len(out.splitlines()) == 1


def test_table_and_exit_codes(gpu_check: ModuleType) -> None:
    row = gpu_check.Row
    rows = [row("fits", 900.0 * 2**20, 1024.0 * 2**20, "B", True),
            row("speedup", 1.2, 1.5, "x", False, "needs >= 1.5x"),
            row("tflops", 40.0, 50.0, "TFLOP/s", None)]
    table = gpu_check.format_table(rows, dry=False)
    head, rule, *lines = table.splitlines()
    assert head.split()[:5] == ["check", "ours", "reference", "ratio", "result"]
    assert set(rule) == {"-"}
    assert "900.0 MiB" in lines[0]
    assert "0.879" in lines[0]
    assert "PASS" in lines[0]
    assert "1.20x" in lines[1]
    assert "0.800" in lines[1]
    assert "FAIL" in lines[1]
    assert "needs >= 1.5x" in lines[1]
    assert "info" in lines[2]
    assert gpu_check.exit_code(rows, dry=False) == 1  # a failed check fails the run
    assert gpu_check.exit_code(rows[:1] + rows[2:], dry=False) == 0
    # the dry run judges nothing about numbers; only a check that raised fails it
    assert gpu_check.exit_code(rows, dry=True) == 0
    assert "cpu dry-run" in gpu_check.format_table(rows, dry=True)
    assert "FAIL" not in gpu_check.format_table(rows, dry=True)
    broken = [*rows, row("compress", "error", None, passed=False, note="ValueError: x", error=True)]
    assert gpu_check.exit_code(broken, dry=True) == 1
    assert "ERROR" in gpu_check.format_table(broken, dry=True)


def test_a_check_that_raises_is_an_error_row(gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    def boom(ctx: object) -> list[object]:
        raise RuntimeError("kernel missing")

    monkeypatch.setitem(gpu_check.CHECKS, "boom", boom)
    ctx = gpu_check.Ctx(device=torch.device("cpu"), quick=True, tmp=tmp_path)
    rows = gpu_check.run_checks(ctx, ["boom"], deadline=float("inf"))
    assert len(rows) == 1
    assert rows[0].error
    assert "kernel missing" in rows[0].note


def test_cpu_dry_run_of_every_check(gpu_check: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--device", "cpu", "--quick"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "ERROR" not in out
    assert out.count("cpu dry-run") >= 12
    rows = [line for line in out.splitlines() if "cpu dry-run" in line]
    for check in ("memory digits-cnn", "profile peak vs allocator peak", "per-layer fwd+bwd sum", "Monitor(every=",
                  "bf16 step speedup", "achieved TFLOP/s", "structured 0.5", "INT8 dynamic: backend chosen"):
        assert any(line.startswith(check) for line in rows), (check, out)
