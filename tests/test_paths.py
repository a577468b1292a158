"""Output paths: the one check every command runs before its work, and the atomic writer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from proftune._paths import OutputPath, check_outputs, output_problems, replacing, write_text
from proftune.exceptions import ConfigError, ProblemCollector


def _problems(path: Path | str, *, force: bool = False, folder: bool = False, names: tuple[str, ...] = ()) -> str:
    return " ".join(output_problems(OutputPath("--out", path, folder=folder, names=names), force=force))


def test_a_new_file_in_an_existing_folder_is_fine(tmp_path: Path) -> None:
    assert _problems(tmp_path / "new.json") == ""
    assert list(tmp_path.iterdir()) == []  # the writability probe leaves nothing behind


def test_a_missing_folder_is_refused_and_not_created(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "t.json"
    assert "folder" in _problems(target)
    assert "does not exist" in _problems(target)
    assert not (tmp_path / "no").exists()


def test_a_parent_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    assert "is a file, not a folder" in _problems(tmp_path / "afile" / "t.json")
    assert "is a file, not a folder" in _problems(tmp_path / "afile" / "deeper" / "t.json")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_folder_where_no_file_can_be_created_is_refused_even_for_root() -> None:
    # os.access says /proc is writable for root; creating a file there fails
    assert "not writable" in _problems("/proc/t.json")


def test_an_existing_file_needs_force_and_a_folder_is_never_a_file(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    assert "force=True" in _problems(f)
    assert _problems(f, force=True) == ""
    assert "is a folder" in _problems(tmp_path, force=True)


def test_a_symlink_is_neither_followed_nor_replaced_without_force(tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text("the user's")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert "symbolic link" in _problems(link)
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere")
    assert "symbolic link" in _problems(tmp_path / "dangling.json")
    assert _problems(link, force=True) == ""
    write_text(link, "new")  # with --force: the link itself is replaced, its target kept
    assert not link.is_symlink()
    assert link.read_text() == "new"
    assert target.read_text() == "the user's"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe")
def test_a_pipe_is_never_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in _problems(fifo, force=True)


def test_a_folder_output_may_be_created_but_keeps_the_files_it_holds(tmp_path: Path) -> None:
    assert _problems(tmp_path / "plots" / "deep", folder=True) == ""
    assert not (tmp_path / "plots").exists()
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "history.png").write_bytes(b"png")
    text = _problems(plots, folder=True, names=("history.png", "pareto.png"))
    assert "history.png" in text
    assert "pareto.png" not in text
    assert "force=True" in text
    assert _problems(plots, folder=True, names=("history.png",), force=True) == ""
    (tmp_path / "f").write_text("x")
    assert "is a file, not a folder" in _problems(tmp_path / "f", folder=True)


def test_every_problem_is_named_in_one_error(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    with pytest.raises(ConfigError) as err:
        check_outputs([OutputPath("--out", tmp_path / "a.json"), OutputPath("--trace", tmp_path / "x" / "t.json"),
                       OutputPath("--report", None)])
    assert "--out" in str(err.value)
    assert "--trace" in str(err.value)
    collector = ProblemCollector()
    check_outputs([OutputPath("--out", tmp_path / "b.json"), OutputPath("--trace", tmp_path / "b.json")],
                  problems=collector)
    assert collector.problems == [f"--out and --trace name the same path {str(tmp_path / 'b.json')!r}; "
                                  "give each its own."]


def test_replacing_leaves_the_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    f = tmp_path / "model.pt"
    f.write_text("old")

    def crash() -> None:
        with replacing(f) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        crash()
    assert f.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]
    with pytest.raises(OSError, match="produced no file"), replacing(f):
        pass  # a writer that logs its failure and returns (torch.profiler's trace export)
    assert f.read_text() == "old"


@pytest.mark.parametrize("folder", [True, False])
def test_a_path_under_a_loop_of_symbolic_links_is_refused(tmp_path: Path, folder: bool) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    text = _problems(tmp_path / "a" / "out", folder=folder)  # before: accepted, then ELOOP at the lock (exit 1)
    assert f"{str(tmp_path / 'a')!r} is a loop of symbolic links" in text


def test_a_relative_store_is_resolved_when_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from proftune.track import Store

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    store = Store("sqlite:///rel.db")
    assert store.url == f"sqlite:///{first / 'rel.db'}"
    monkeypatch.chdir(second)  # a task that changes the working folder, as Hydra does
    run_id = store.start_run("train", "t", config={})
    assert [r.id for r in Store(f"sqlite:///{first / 'rel.db'}").list_runs()] == [run_id]
    assert not (second / "rel.db").exists()
