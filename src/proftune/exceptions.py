"""The errors proftune raises; every one derives from :class:`ProftuneError`.

The command line maps :class:`ConfigError` (and its children) to exit code 2 (bad usage, config
or input) and every other :class:`ProftuneError` to exit code 1 (a failure while running).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "ConfigError",
    "DependencyError",
    "OutputWriteError",
    "ProblemCollector",
    "ProftuneError",
    "RunFailedError",
    "StoreError",
    "TaskLoadError",
    "TaskWarning",
]


class ProftuneError(Exception):
    """Base class of every error proftune raises on purpose."""


class ConfigError(ProftuneError, ValueError):
    """Bad usage, configuration or input: the user can fix it (CLI exit code 2).

    Several problems found at once are collected in ``problems`` and listed in one message.
    """

    def __init__(self, message: str | Iterable[str], *, header: str | None = None) -> None:
        if isinstance(message, str):
            problems = [message]
        else:
            problems = [str(m) for m in message]
        if not problems:
            raise ValueError("ConfigError needs at least one problem to report.")
        self.problems: list[str] = problems
        if len(problems) == 1 and header is None:
            text = problems[0]
        else:
            head = header or "Config is not well-formed, found the following errors:"
            text = head + "\n" + "\n".join(f"  - {p}" for p in problems)
        super().__init__(text)


class TaskLoadError(ConfigError):
    """A task spec could not be turned into a Task (missing file, no Task class, import error)."""


class StoreError(ConfigError):
    """The run store cannot be opened as given (not a database, bad URL)."""


class DependencyError(ConfigError):
    """An optional dependency is missing; the message names the extra to install."""


class RunFailedError(ProftuneError):
    """Something failed while running (training diverged, a user's model raised, ...)."""

    #: The Run it failed in, where one was recorded (a sink such as W&B can still log it).
    run_id: int | None = None


class OutputWriteError(RunFailedError, OSError):
    """A file proftune was writing could not be written (a full disk, an I/O error); the message
    names the file and the free space of the device that holds it. An ``OSError`` too (``errno``
    the system's), for code that catches those."""

    def __init__(self, message: str, *, path: str, free_bytes: int | None, errno: int | None = None) -> None:
        super().__init__(message)
        self.path, self.free_bytes = path, free_bytes
        self.errno = errno


class TaskWarning(UserWarning):
    """Something in the user's task that runs but is likely not what was meant (a scheduler
    counted in epochs, stepped per step). The CLI shows it, where it hides library warnings."""


class ProblemCollector:
    """Collects configuration problems so that one :class:`ConfigError` lists them all."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def __bool__(self) -> bool:
        return bool(self.problems)

    def raise_if_any(self, *, header: str | None = None) -> None:
        if self.problems:
            raise ConfigError(self.problems, header=header)
