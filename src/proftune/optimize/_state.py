"""The run's state on disk (``state.json`` in ``out``): what each finished stage produced.

A stage's outputs are written when it finishes (atomically), so a run killed at any point
continues from the last finished stage; the search stage's trials live in the Optuna study.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict, TypeVar, cast

from .._jsonsafe import json_dumps
from .._paths import OutputPath, output_problems
from .._records import JsonRecord, mapping, record_fields
from ..exceptions import ConfigError, ProblemCollector
from ..track import LOCK_FILE, FolderLock, Store, StudyLock
from ._records import StageOutputs

__all__ = ["STATE_FILE", "OptimizeState", "StageStatus", "StateFile", "check_out_dir", "own_run"]

STATE_FILE = "state.json"
VERSION = 1

R = TypeVar("R", bound=StageOutputs)


@dataclass(frozen=True)
class StageStatus(JsonRecord):
    """One stage's block in ``state.json``: how it ended, its time, its Run and its outputs (the
    stage's record as a dict)."""

    WHAT: ClassVar[str] = "a stage status"
    #: ``finished``, ``skipped`` or ``failed``.
    status: str
    duration_s: float | None = None
    share_s: float | None = None
    run_id: int | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    metric_before: float | None = None
    metric_after: float | None = None
    error: str | None = None

    #: ``interrupted``: ended by Ctrl-C or SIGTERM (``--resume`` runs it again, as a failed one).
    STATUSES: ClassVar[tuple[str, ...]] = ("finished", "skipped", "failed", "interrupted")

    @classmethod
    def from_dict(cls, d: Any, *, stage: str = "") -> StageStatus:
        what = f"the {stage} stage's status in {STATE_FILE}" if stage else cls.WHAT
        rec = cls(**record_fields(cls, mapping(d, what=what), what=what))
        if rec.status not in cls.STATUSES:
            raise ConfigError(f"{what}: status={rec.status!r} is unknown; valid: {', '.join(cls.STATUSES)}.")
        if not isinstance(rec.outputs, dict):
            raise ConfigError(f"{what}: outputs must be an object, but got {type(rec.outputs).__name__}.")
        return rec


class StateFile(TypedDict, total=False):
    """``state.json`` as read: the run's identity, its Run, the seconds spent (the search's part of
    them) and each stage's block (a :class:`StageStatus`'s JSON, by stage)."""

    version: int
    task: str
    study: str
    objective: str
    budget_s: float
    run_id: int
    spent_s: float
    search_spent_s: float
    stages: dict[str, dict[str, Any]]


class OptimizeState:
    """``state.json``: identity of the run (task, study, options) and each stage's record."""

    def __init__(self, path: Path, data: StateFile) -> None:
        self.path, self.data = path, data

    @classmethod
    def load_or_new(cls, out: Path, identity: StateFile) -> OptimizeState:
        """The state in ``out``, every stage block checked as a :class:`StageStatus` (a ConfigError
        naming the stage and the field otherwise), or a new one."""
        path = out / STATE_FILE
        if path.is_file():
            data = json.loads(path.read_text())
            version = data.get("version", 1) if isinstance(data, dict) else None
            if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
                raise ConfigError(f"out={str(out)!r}: {STATE_FILE} has version {version!r}, newer than this "
                                  f"proftune reads (version {VERSION}); upgrade proftune or choose another out=.")
            state = cls(path, data)
            for name in list(state.stages):
                state.status(name)
            return state
        return cls(path, {"version": VERSION, **identity, "stages": {}, "spent_s": 0.0})

    @property
    def stages(self) -> dict[str, dict[str, Any]]:
        return self.data.setdefault("stages", {})

    def finished(self, stage: str) -> bool:
        return self.stages.get(stage, {}).get("status") in ("finished", "skipped")

    def status(self, stage: str) -> StageStatus | None:
        """The stage's status block as its record (None: it has not run)."""
        block = self.stages.get(stage)
        return None if block is None else StageStatus.from_dict(block, stage=stage)

    def set_status(self, stage: str, status: StageStatus) -> None:
        self.stages[stage] = status.to_dict()

    def outputs(self, stage: str) -> dict[str, Any]:
        """The stage's outputs as ``state.json`` holds them (the JSON-shaped dict)."""
        return dict(self.stages.get(stage, {}).get("outputs") or {})

    def record(self, kind: type[R]) -> R:
        """The outputs of stage ``kind.STAGE`` as its record (the defaults of each field where the
        stage has not run or was skipped)."""
        return kind.from_dict(self.outputs(kind.STAGE))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(json_dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def check_out_dir(out: Path, *, resume: bool, study: str | None, task: str,
                  problems: ProblemCollector) -> StateFile | None:
    """Problems with ``out``: unwritable, in use by a running optimize, or holding another run
    that would be overwritten. Returns the stored state when the run there may be continued.
    """
    if out.is_symlink() and not out.exists():  # a dangling link: creating the folder would fail at the lock
        problems.add(f"out={str(out)!r} is a symbolic link to {os.readlink(out)!r}, which does not exist: "
                     "create that folder, or choose another out=.")
        return None
    writable = output_problems(OutputPath("out=", out, folder=True), force=True)  # its files: below
    if writable:
        for problem in writable:
            problems.add(problem)
        return None
    if not out.exists():
        return None
    holder = FolderLock(out, command="optimize").holder()
    if holder is not None:
        problems.add(f"out={str(out)!r} is in use by {holder.describe()}: one run owns an output folder "
                     "at a time. Wait for it to end, or choose another out=.")
        return None
    state_path = out / STATE_FILE
    if state_path.is_file():
        try:
            stored = json.loads(state_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            problems.add(f"out={str(out)!r}: {STATE_FILE} cannot be read ({exc}); choose another out=.")
            return None
        version = stored.get("version", 1) if isinstance(stored, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
            problems.add(f"out={str(out)!r}: {STATE_FILE} has version {version!r}, newer than this proftune "
                         f"reads (version {VERSION}); upgrade proftune or choose another out=.")
            return None
        for name, block in dict(stored.get("stages") or {}).items():
            try:
                StageStatus.from_dict(block, stage=str(name))
            except ConfigError as exc:
                problems.add(f"out={str(out)!r}: {exc}; choose another out=.")
                return None
        same_study = study is not None and stored.get("study") == study
        if not (resume or same_study):
            problems.add(f"out={str(out)!r} holds an optimize run (study {stored.get('study')!r}); pass "
                         "resume=True (or the same study=) to continue it, or choose another out=.")
            return None
        if stored.get("task") != task:
            problems.add(f"out={str(out)!r} holds a run of task {stored.get('task')!r}, not {task!r}; "
                         "choose another out=.")
            return None
        if study is not None and stored.get("study") != study:
            problems.add(f"study={study!r} differs from the study of the run in out= "
                         f"({stored.get('study')!r}); give that one or another out=.")
            return None
        return cast("StateFile", stored)
    if any(p.name != LOCK_FILE for p in out.iterdir()):  # a killed run's lock file is no content
        problems.add(f"out={str(out)!r} is not empty and holds no optimize run; nothing there is "
                     "overwritten: choose an empty or new folder.")
    return None


@contextlib.contextmanager
def own_run(out: Path, store: Store, study: str | None) -> Iterator[None]:
    """Hold ``out`` and ``study`` for this process while the loop runs: a second optimize on
    either is refused (exit 2, naming this one); a killed holder's locks pass to the next run."""
    with contextlib.ExitStack() as stack:
        if study is not None:
            stack.enter_context(StudyLock(store, study, command="optimize"))
        stack.enter_context(FolderLock(out, command="optimize"))  # second: a refusal creates no folder
        yield
