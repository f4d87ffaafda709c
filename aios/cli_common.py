"""What the three console scripts share: error handling, exit codes, version, console.

The click layer only parses and renders; library errors (:class:`AiosError`) become one
line on stderr and their documented exit code, never a traceback.
"""

from __future__ import annotations

import errno
import sys

import click
from rich.console import Console

from aios import CONTRACT_VERSION, __version__
from aios.errors import AiosError, ExitCode

EXIT_CODES_HELP = (
    "Exit codes: 0 requirements met, 1 not met, 2 usage error, "
    "3 something required could not be evaluated, 4 unreadable or invalid input."
)

# Width of command output that does not go to a terminal (a CI log, a pipe, a file): wide
# enough that rich never wraps a line or truncates a table cell ("measur…"), whatever COLUMNS
# says; tables take their natural width.
LOG_WIDTH = 10_000


def make_console(*, stderr: bool = False) -> Console:
    """The console every command prints through: on a terminal rich fits the terminal's width;
    anywhere else lines are never wrapped or cut (``LOG_WIDTH``). rich honours NO_COLOR."""
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, highlight=False, width=None if tty else LOG_WIDTH)


err_console = make_console(stderr=True)


# A path that cannot be written (or read): read-only folder or file system, no permission, a
# regular file where a folder is needed. Exit 4 (unusable input / output path), one line.
ACCESS_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR,
                           errno.EEXIST})


def access_message(e: OSError) -> str:
    """One sentence for an :data:`ACCESS_ERRNOS` error, naming the path."""
    where = e.filename or "the output"
    if e.filename2:
        where = f"{e.filename} -> {e.filename2}"
    reason = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
    return (f"Cannot write {where}: {reason}. Choose a writable output (-o), or fix the "
            "permissions, and rerun; nothing was written under the final name.")


class AiosGroup(click.Group):
    """A click group that turns user-caused errors into one line and an exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except AiosError as e:
            err_console.print(f"[bold red]error:[/] {e.message}", soft_wrap=True)
            sys.exit(int(e.exit_code))
        except OSError as e:  # a writer other than write_atomic (e.g. gguf-py's) hit a full disk
            from aios.io import disk_full_message, is_disk_full

            if is_disk_full(e):
                err_console.print(f"[bold red]error:[/] {disk_full_message(e.filename, e)}", soft_wrap=True)
                sys.exit(int(ExitCode.NOT_EVALUATED))
            if e.errno not in ACCESS_ERRNOS:
                raise
            err_console.print(f"[bold red]error:[/] {access_message(e)}", soft_wrap=True)
            sys.exit(int(ExitCode.BAD_INPUT))
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]: nothing was written under the final name.")
            sys.exit(130)


def version_option():
    return click.version_option(
        __version__,
        "--version",
        message=f"%(prog)s {__version__} (AIOS Model Contract v{CONTRACT_VERSION})",
    )


__all__ = ["ACCESS_ERRNOS", "AiosGroup", "access_message", "EXIT_CODES_HELP", "ExitCode", "err_console", "version_option"]
