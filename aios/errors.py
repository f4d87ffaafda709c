"""Errors a user can cause, each mapped to a stable exit code (docs/design.md, "Exit codes").

The CLI catches :class:`AiosError` and prints its one-sentence message; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Documented, stable process exit codes shared by every command."""

    OK = 0  # requested tier / requirements met
    NOT_MET = 1  # evaluated, but the requested tier / requirements are not met
    USAGE = 2  # bad option or argument (click uses 2 as well)
    NOT_EVALUATED = 3  # something required could not be evaluated (e.g. no weights)
    BAD_INPUT = 4  # unreadable or invalid input file / model


class AiosError(Exception):
    """Base class: a message meant for the user plus the exit code to end with."""

    exit_code: ExitCode = ExitCode.BAD_INPUT

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(AiosError):
    exit_code = ExitCode.USAGE


class InvalidModelError(AiosError):
    """The input exists but is not a model we can read (corrupt, truncated, not a model)."""

    exit_code = ExitCode.BAD_INPUT


class ModelNotFoundError(AiosError):
    """The MODEL argument names nothing we can find locally."""

    exit_code = ExitCode.BAD_INPUT


class UnsupportedArchitectureError(AiosError):
    exit_code = ExitCode.BAD_INPUT


class WeightsUnavailableError(AiosError):
    """A measurement needs weights that are not present (e.g. a built-in alias)."""

    exit_code = ExitCode.NOT_EVALUATED
