"""What the three console scripts share: error handling, exit codes, version, console.

The click layer only parses and renders; library errors (:class:`AiosError`) become one
line on stderr and their documented exit code, never a traceback.
"""

from __future__ import annotations

import errno
import os
import sys

import click
from rich.console import Console
from rich.markup import escape

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


# --quiet: no progress or informational messages on stderr (errors and results still print)
_state = {"quiet": False}


def no_color() -> bool:
    """NO_COLOR (https://no-color.org) set to anything non-empty, or a dumb terminal."""
    return os.environ.get("NO_COLOR", "") != "" or os.environ.get("TERM") == "dumb"


def make_console(*, stderr: bool = False, errors: bool = False) -> Console:
    """The console every command prints through: on a terminal rich fits the terminal's width;
    anywhere else lines are never wrapped or cut (``LOG_WIDTH``). With NO_COLOR no escape code
    is written at all (no colour, no bold). A stderr console is silent under ``--quiet`` unless
    it prints ``errors``."""
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    plain = no_color()
    return Console(stderr=stderr, highlight=False, width=None if tty else LOG_WIDTH,
                   no_color=plain or None, color_system=None if plain else "auto",
                   quiet=stderr and not errors and _state["quiet"])


err_console = make_console(stderr=True)


def warn(text: str, label: str = "warning") -> None:
    """One ``label: text`` line on stderr, so that stdout stays the command's result (a table, a
    JSON document, "wrote ..." lines). Printed under ``--quiet`` too: a warning is neither
    progress nor information. ``text`` is plain text, not rich markup."""
    make_console(stderr=True, errors=True).print(f"[yellow]{label}:[/] {escape(text)}", soft_wrap=True)


def set_quiet(quiet: bool = True) -> None:
    """``--quiet``: silence progress and informational stderr output from now on."""
    _state["quiet"] = quiet
    err_console.quiet = quiet


# Third-party noise (transformers' warnings and load reports, tqdm bars) goes only to the
# --verbose log; our own progress is unaffected. Environment values a user set are kept.
VERBOSE_ENV = "AIOS_VERBOSE"  # read by aios.models.handle while loading models
_NOISE_ENV = {"TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
_set_by_us: dict[str, str] = {}


def quiet_third_party(verbose: bool = False) -> None:
    """Default: silence third-party logs and bars. ``verbose``: let them through (the log)."""
    import logging
    import warnings

    if verbose:
        os.environ[VERBOSE_ENV] = "1"
        for k, v in list(_set_by_us.items()):
            if os.environ.get(k) == v:
                del os.environ[k]
            del _set_by_us[k]
    else:
        os.environ.pop(VERBOSE_ENV, None)
        for k, v in _NOISE_ENV.items():
            if k not in os.environ:
                os.environ[k] = _set_by_us[k] = v
        warnings.filterwarnings("ignore", module=r"transformers(\.|$)")
    if "transformers" in sys.modules:  # already imported: its env var was read; set it directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(logging.WARNING if verbose else logging.ERROR)


def _quiet_callback(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        set_quiet(True)


def _verbose_callback(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        quiet_third_party(verbose=True)


def common_options() -> list[click.Option]:
    """``--quiet`` and ``--verbose``, added to every command of an :class:`AiosGroup`."""
    return [
        click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, is_eager=True,
                     callback=_quiet_callback,
                     help="No progress or informational messages on stderr; results and errors still print."),
        click.Option(["--verbose"], is_flag=True, expose_value=False, is_eager=True,
                     callback=_verbose_callback,
                     help="Also show third-party logs (transformers warnings and load reports, tqdm bars)."),
    ]


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

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        """click's usage errors (3 lines: usage, hint, "Error: …") as our one ``error:`` line."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # a bare `aios-contract`: the help, as click does
                e.show()
                sys.exit(e.exit_code)

            hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            make_console(stderr=True, errors=True).print(
                f"[bold red]error:[/] {escape(e.format_message())}{escape(hint)}", soft_wrap=True)
            sys.exit(int(ExitCode.USAGE))
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            make_console(stderr=True, errors=True).print("[bold red]interrupted[/]")
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        have = {o for p in cmd.params for o in p.opts}
        cmd.params.extend(o for o in common_options() if not have.intersection(o.opts))
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context):
        set_quiet(False)
        quiet_third_party(verbose=False)  # a command's --verbose turns the log back on
        err = make_console(stderr=True, errors=True)
        try:
            return super().invoke(ctx)
        except AiosError as e:
            err.print(f"[bold red]error:[/] {escape(e.message)}", soft_wrap=True)  # text, not markup
            sys.exit(int(e.exit_code))
        except OSError as e:  # a writer other than write_atomic (e.g. gguf-py's) hit a full disk
            from aios.io import disk_full_message, is_disk_full

            if is_disk_full(e):
                err.print(f"[bold red]error:[/] {escape(disk_full_message(e.filename, e))}", soft_wrap=True)
                sys.exit(int(ExitCode.NOT_EVALUATED))
            if e.errno not in ACCESS_ERRNOS:
                raise
            err.print(f"[bold red]error:[/] {escape(access_message(e))}", soft_wrap=True)
            sys.exit(int(ExitCode.BAD_INPUT))
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]: nothing was written under the final name.")
            sys.exit(130)


def version_option():
    return click.version_option(
        __version__,
        "--version",
        message=f"%(prog)s {__version__} (AIOS Model Contract v{CONTRACT_VERSION})",
    )


__all__ = [
    "ACCESS_ERRNOS",
    "EXIT_CODES_HELP",
    "AiosGroup",
    "ExitCode",
    "access_message",
    "common_options",
    "err_console",
    "make_console",
    "no_color",
    "quiet_third_party",
    "set_quiet",
    "version_option",
    "warn",
]
