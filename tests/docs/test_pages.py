"""Every code block of the documentation site runs in a test, or its page says why it cannot.

The pages' blocks run as the README's do (:mod:`tests.docs._blocks`): files written, shell lines
through the CLI, Python blocks in one session per section, budgets and epochs cut; a page's
``output`` block is checked against what the block before it printed. The cheap pages run in the
default suite; those that train run under ``slow`` (the CI budget is tight).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ._blocks import DOCS, ROOT, Block, blocks, run_section

#: Each page with blocks, and whether its blocks train (then they run under ``slow``).
PAGES: dict[str, bool] = {
    "extend.md": False,
    "concepts/loop.md": False,
    "index.md": False,
    "quickstart.md": True,
    "tutorial.md": True,
    "howto/optimize.md": True,
    "howto/run.md": True,
    "howto/script.md": True,
    "howto/tasks.md": False,
    "howto/train.md": True,
    "howto/profile.md": True,
    "howto/predict.md": True,
    "howto/recommend.md": True,
    "howto/batch-size.md": True,
    "howto/lr-find.md": True,
    "howto/tune.md": True,
    "howto/compress.md": True,
    "howto/diagnose.md": True,
    "howto/bandit.md": True,
    "howto/report.md": True,
    "howto/export.md": True,
    "howto/runs.md": True,
    "howto/store.md": False,
    "howto/ray.md": True,
    "howto/trackers.md": True,
    "howto/frameworks.md": True,
    "howto/python.md": True,
}


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_every_block_of_the_site_runs_in_a_test_or_says_why_not() -> None:
    with_blocks = {str(p.relative_to(DOCS)) for p in _pages() if blocks(p)}
    assert with_blocks <= set(PAGES), f"pages whose blocks no test runs: {sorted(with_blocks - set(PAGES))}"
    assert set(PAGES) <= with_blocks, f"pages without blocks: {sorted(set(PAGES) - with_blocks)}"
    assert set(PAGES) <= with_blocks, f"pages without blocks: {sorted(set(PAGES) - with_blocks)}"
    assert len(with_blocks) >= 20
    for name in sorted(with_blocks):
        found = blocks(DOCS / name)
        for i, b in enumerate(found):
            assert b.lang in ("bash", "python", "yaml", "text") or b.skip, f"{b.where}: a {b.lang} block"
            if b.lang == "yaml":
                assert b.file, f"{b.where}: a yaml block is a file: <!-- docs-test: NAME.yaml -->"
            if b.lang == "text":
                assert b.output or b.skip, f"{b.where}: a text block is an output: <!-- docs-test: output -->"
            if b.output:
                before = found[i - 1] if i else None
                assert before is not None, f"{b.where}: an output block follows the block that printed it"
                assert before.lang in ("bash", "python"), b.where
                assert not before.skip, b.where
                assert before.section == b.section, b.where


@pytest.fixture
def registries() -> Iterator[None]:
    """The extension guide registers a plug-in of every kind: put every registry back after it."""
    from proftune import metrics, report
    from proftune.compress import COMPRESS_METHODS
    from proftune.diagnose._causes import CHECK_REGISTRY
    from proftune.optimize import STAGE_REGISTRY
    from proftune.search import PRUNER_REGISTRY, SAMPLER_REGISTRY

    regs = [SAMPLER_REGISTRY, PRUNER_REGISTRY, COMPRESS_METHODS, CHECK_REGISTRY, metrics.METRICS,
            STAGE_REGISTRY, report.RENDERERS]
    before = [set(r) for r in regs]
    yield
    for r, names in zip(regs, before, strict=True):
        for name in set(r) - names:
            r.remove(name)


def _run_page(name: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[Block]:
    """Every block of the page in order, its Python blocks in one session (a page is one walk-through)."""
    return run_section(DOCS / name, "", folder, monkeypatch)


@pytest.mark.usefixtures("registries")
@pytest.mark.parametrize("name", [n for n, trains in PAGES.items() if not trains])
def test_the_pages_that_train_nothing_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run_page(name, tmp_path, monkeypatch)


def _made(folder: Path, *files: str) -> None:
    for f in files:
        assert (folder / f).exists(), f"{f} was not written"


#: What a page's blocks must have made, beyond running (exit 0, no exception).
AFTER: dict[str, Callable[[Path], None]] = {
    "tutorial.md": lambda d: _made(d, "proftune-optimize/digits-cnn/summary.json", "digits-profile.json",
                                   "digits-profile.html", "proftune-optimize/regression/summary.json"),
    "howto/optimize.md": lambda d: _made(d, "runs/digits-cnn/summary.json", "runs/digits-cnn/config.yaml"),
    "howto/python.md": lambda d: _made(d, "lr.png", "cnn.json"),
    "howto/tune.md": lambda d: (_made(d, "plots", "cnn-study.html"),
                                # the Pareto example used to exit 2 (a staged space takes one objective)
                                _assert("Pareto front" in (d / "cnn.html").read_text(), "cnn.html: no Pareto front"),
                                _assert((d / "cnn-study.html").stat().st_size > 100_000, "cnn-study.html is small")),
    "howto/report.md": lambda d: _made(d, "run.html"),
    "howto/export.md": lambda d: _made(d, "tb", "mlflow.db", "wandb"),
    "howto/compress.md": lambda d: _made(d, "small.pt"),
    "howto/lr-find.md": lambda d: _made(d, "lr.png"),
    "howto/run.md": lambda d: _made(d, "profile.json"),
}
#: What a page needs installed (its blocks import it), beyond the default extras.
NEEDS = {"howto/frameworks.md": ("lightning", "transformers", "timm"), "howto/ray.md": ("ray",),
         "howto/trackers.md": ("tensorboard", "mlflow", "wandb"), "howto/export.md": ("tensorboard", "mlflow", "wandb")}


def _assert(ok: bool, why: str) -> None:
    assert ok, why


#: Pages that run as a user runs them (one fresh Python process, the block as written, nothing cut),
#: with the wall time the page promises, in seconds.
AS_WRITTEN = {"quickstart.md": 60.0}


@pytest.mark.slow  # each page trains digits tasks for seconds to minutes
@pytest.mark.parametrize("name", [n for n, trains in PAGES.items() if trains and n not in AS_WRITTEN])
def test_the_pages_that_train_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in NEEDS.get(name, ()):
        pytest.importorskip(module)
    try:
        assert _run_page(name, tmp_path, monkeypatch)
        AFTER.get(name, lambda d: None)(tmp_path)
    finally:
        for mod in ("lit_digits", "timm_user", "my_task", "objective"):
            sys.modules.pop(mod, None)


@pytest.mark.slow  # it trains for its budget, 40 s
def test_the_quickstart_runs_as_written_in_under_a_minute(tmp_path: Path) -> None:
    """Issue 63: "runs as written in under a minute on a fresh install": its one block, as a file run
    by a fresh interpreter (imports included), timed from start to exit."""
    page = DOCS / "quickstart.md"
    (block,) = [b for b in blocks(page) if not b.skip]  # and what it printed once, shown
    assert block.lang == "python", block.where
    assert len([x for x in block.code.splitlines() if x.strip()]) <= 20, f"{block.where}: not a quickstart's length"
    (tmp_path / "quickstart.py").write_text(block.code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "quickstart.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    took = time.perf_counter() - start
    assert res.returncode == 0, res.stderr[-3000:]
    assert took < AS_WRITTEN["quickstart.md"], f"{block.where} took {took:.1f} s; the page promises under a minute"
    headline, params = res.stdout.strip().splitlines()[-2:]
    assert "(defaults) ->" in headline, res.stdout
    assert "'lr':" in params, res.stdout
    _made(tmp_path, "proftune-optimize/my-model/summary.json", "proftune-optimize/my-model/report.html", "proftune.db")
