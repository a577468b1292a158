"""proftune imports and runs with only its base dependencies (its layers: tests/test_layering.py).

The optional packages are hidden with a ``sys.meta_path`` blocker in a fresh interpreter, the way
``pip install proftune`` (no extras) leaves them. scipy is not hidden: scikit-learn, a base
dependency, needs it, so every install of proftune has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import proftune

SRC = Path(proftune.__file__).resolve().parent

OPTIONAL = (
    "optuna", "torch_pruning", "torchao", "plotly", "matplotlib", "torchvision", "lightning",
    "transformers", "ray", "mlflow", "tensorboard",
)

BLOCKER = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class _Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {OPTIONAL!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}} (hidden)", name=name)
            return None

    sys.meta_path.insert(0, _Hide())
    """
)


def _run_hidden(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that cannot import any optional dependency."""
    env = {**os.environ, "PYTHONPATH": str(SRC.parent), "OMP_NUM_THREADS": "1",
           "PROFTUNE_DB": f"sqlite:///{tmp_path / 'runs.db'}"}
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=tmp_path, check=False)


def test_import_with_base_dependencies_only(tmp_path: Path) -> None:
    proc = _run_hidden(
        """
        import sys
        import proftune
        hidden = [m for m in sys.modules if m.split(".")[0] in ("optuna", "torchvision", "matplotlib")]
        assert not hidden, hidden
        try:
            proftune.search
        except proftune.DependencyError as exc:
            print("search:", exc)
        print("ok", proftune.__version__)
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok 0.1.0" in proc.stdout
    assert "proftune[search]" in proc.stdout


def test_base_commands_run_and_extra_commands_name_the_extra(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text("lr: [0.001, 0.01]\n")
    proc = _run_hidden(
        """
        import json
        from typer.testing import CliRunner
        from proftune.cli import app

        runs = {
            "train": ["train", "digits-mlp", "--epochs", "1", "--max-steps", "3"],
            "profile": ["profile", "digits-mlp", "--steps", "2"],
            "recommend": ["recommend", "digits-mlp"],
            "tune": ["tune", "digits-mlp", "--space", "space.yaml", "--trials", "1"],
        }
        out = {}
        for name, args in runs.items():
            res = CliRunner().invoke(app, [*args, "--json"])
            out[name] = [res.exit_code, res.output[-400:]]
        print("RESULT" + json.dumps(out))
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    for name in ("train", "profile", "recommend"):
        assert out[name][0] == 0, (name, out[name][1])
    code, text = out["tune"]
    assert code == 2, text
    assert "Traceback" not in text
    assert "pip install 'proftune[search]'" in text


def test_every_extra_named_in_errors_exists_in_pyproject() -> None:
    from proftune._optional import EXTRAS

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    pyproject = SRC.parent.parent / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("not a source checkout")
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS.values()) <= set(extras), set(EXTRAS.values()) - set(extras)


def test_missing_optional_package_is_a_dependency_error_naming_the_extra() -> None:
    from proftune._optional import require
    from proftune.exceptions import DependencyError

    with pytest.raises(DependencyError, match=r"pip install 'proftune\[search\]'"):
        require("optuna.no_such_module_here", feature="a test")
    with pytest.raises(DependencyError, match=r"needs the optional package 'no_such_pkg'.*pip install no_such_pkg"):
        require("no_such_pkg", feature="a test")
