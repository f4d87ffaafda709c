"""aios/cli_common.py: one ``error:`` line and a documented exit code for user-caused errors."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest
from click.testing import CliRunner

from contract.cli import main as contract_main
from convert.cli import main as convert_main
from runtime.cli import main as run_main

FAST = ["--samples", "2", "--max-tokens", "8"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny GGUF and a check report to feed the writing commands."""
    d = tmp_path_factory.mktemp("inputs")
    res = CliRunner().invoke(convert_main, ["gguf", "tiny-falcon-relu", "-o", str(d / "m.gguf")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(contract_main, ["check", "tiny-falcon", *FAST, "--format", "json",
                                             "-o", str(d / "rep")])
    assert res.exit_code == 0, res.output
    return d


def _writing_commands(d, out_dir, out_file):
    gguf, rep = str(d / "m.gguf"), str(d / "rep" / "aios-report.json")
    return {
        "check": (contract_main, ["check", "tiny-falcon", *FAST, "-o", out_dir]),
        "compare": (contract_main, ["compare", rep, rep, "-o", out_dir]),
        "report": (contract_main, ["report", rep, "-o", out_dir]),
        "gguf": (convert_main, ["gguf", "tiny-falcon", "-o", out_file]),
        "layout": (convert_main, ["layout", gguf, *FAST, "-o", out_file]),
        "bench": (run_main, ["bench", gguf, "-n", "2", "--prompt-tokens", "4", "--no-project",
                             "-o", out_dir]),
        "fit-predictor": (run_main, ["fit-predictor", gguf, "--rank", "4", "--max-tokens", "32",
                                     "-o", out_file]),
    }


def _one_error_line(res) -> str:
    assert "Traceback" not in res.output, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.output
    return errors[0]


@pytest.mark.parametrize("name", ["check", "compare", "report", "gguf", "layout", "bench",
                                  "fit-predictor"])
def test_output_under_a_regular_file_is_one_error_line_exit_4(made, tmp_path, name):
    """Issue 19.4: an unwritable -o is exit 4 with one sentence, not a traceback and exit 1."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file")
    group, args = _writing_commands(made, str(blocker / "out"), str(blocker / "out.bin"))[name]
    res = CliRunner().invoke(group, args)
    assert res.exit_code == 4, res.output
    assert "blocker" in _one_error_line(res)


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES])
def test_read_only_output_is_one_error_line_exit_4(made, tmp_path, monkeypatch, err):
    """A read-only folder or file system (simulated: as root chmod does not stop writes)."""

    def refuse(*_a, **_k):
        raise OSError(err, os.strerror(err), str(tmp_path / "out"))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    for name in ("check", "gguf"):
        group, args = _writing_commands(made, str(tmp_path / "out"), str(tmp_path / "out.gguf"))[name]
        res = CliRunner().invoke(group, args)
        assert res.exit_code == 4, (name, res.output)
        assert os.strerror(err) in _one_error_line(res)


def test_other_os_errors_keep_their_traceback(monkeypatch):
    """Only access errors become exit 4; anything else is a bug and is not hidden."""
    import contract.check

    def boom(*_a, **_k):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(contract.check, "check_model", boom)
    res = CliRunner().invoke(contract_main, ["check", "tiny-falcon"])
    assert res.exit_code == 1 and isinstance(res.exception, OSError)


# --- output a CI log can read (issue 19.7) and third-party noise (issue 19.8) ------------------


class _Tty(__import__("io").StringIO):
    def isatty(self) -> bool:
        return True


def test_no_color_means_no_escape_codes(monkeypatch):
    """NO_COLOR honoured even on a terminal: no colour and no other escape code either."""
    import sys

    from aios.cli_common import make_console

    for env, escapes in ((None, True), ("1", False)):
        if env is None:
            monkeypatch.delenv("NO_COLOR", raising=False)
        else:
            monkeypatch.setenv("NO_COLOR", env)
        monkeypatch.setenv("TERM", "xterm-256color")
        out = _Tty()
        monkeypatch.setattr(sys, "stdout", out)
        make_console().print("[bold red]error:[/] something")
        assert ("\x1b[" in out.getvalue()) is escapes, out.getvalue()


def test_log_output_is_never_wrapped(monkeypatch):
    """Not a terminal (a CI log): one long line stays one line, whatever COLUMNS says."""
    import io
    import sys

    from aios.cli_common import make_console

    for columns in (None, "80"):
        if columns is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", columns)
        out = io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        line = "measured " + " ".join(f"word{i}" for i in range(60))
        make_console().print(line)
        assert out.getvalue() == line + "\n"


def test_quiet_silences_progress_but_not_results_or_errors(tmp_path):
    args = ["svd-residual", "tiny-falcon", "--rank", "2", *FAST, "--eval-tokens", "0"]
    res = CliRunner().invoke(convert_main, [*args, "-o", str(tmp_path / "a.gguf")])
    assert res.exit_code == 0 and "calibration" in res.stderr, res.output
    res = CliRunner().invoke(convert_main, [*args, "-q", "-o", str(tmp_path / "b.gguf")])
    assert res.exit_code == 0, res.output
    assert res.stderr == "" and "b.gguf" in res.stdout
    res = CliRunner().invoke(contract_main, ["check", "", "--quiet"])
    assert res.exit_code == 2 and res.stderr.startswith("error:")


def test_every_command_has_quiet_and_verbose():
    for group in (contract_main, convert_main, run_main):
        for name, cmd in group.commands.items():
            opts = {o for p in cmd.params for o in p.opts}
            assert {"--quiet", "-q", "--verbose"} <= opts, name


def test_gguf_loading_noise_only_in_the_verbose_log(made, capfd, monkeypatch):
    """transformers' tqdm dequantization bar and load report are not in our output."""
    from aios.models import resolve_model

    monkeypatch.delenv("AIOS_VERBOSE", raising=False)
    resolve_model(str(made / "m.gguf")).load_torch()
    err = capfd.readouterr().err
    assert "de-quantizing" not in err and "LOAD REPORT" not in err


def test_check_prints_no_third_party_noise(tmp_path):
    """A whole check in a fresh process: only our own progress lines on stderr by default (no
    "Token indices sequence length…" from transformers, no tqdm bars); --verbose shows the log;
    --quiet prints nothing there."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TRANSFORMERS_VERBOSITY", "TQDM_DISABLE",
                                                            "AIOS_VERBOSE", "COLUMNS")}
    long_text = tmp_path / "long.jsonl"  # longer than the tokenizer's 512: transformers warns
    long_text.write_text('{"text": "%s"}\n' % ("many words " * 400), encoding="utf-8")
    cmd = [sys.executable, "-m", "contract.cli", "check", "tiny-falcon", "--calibration", str(long_text)]
    quiet = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    # only our own progress, one plain line per step (no live bar in a log)
    lines = quiet.stderr.splitlines()
    assert lines and all(line.startswith(("R1: ", "R3: ")) and line.endswith("…") for line in lines), lines
    silent = subprocess.run([*cmd, "--quiet"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert silent.returncode == 0 and silent.stderr == "" and "Tier:" in silent.stdout
    loud = subprocess.run([*cmd, "--verbose"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert loud.returncode == 0 and "Token indices sequence length" in loud.stderr


# --- smaller points (issue 19.9) -----------------------------------------------------------------


def test_click_usage_errors_are_one_error_line():
    """click's 3-line usage block becomes our one `error:` line, still exit 2."""
    for group, args, words in (
        (contract_main, ["check"], "Missing argument 'MODEL'"),
        (contract_main, ["check", "tiny-falcon", "--bogus"], "No such option '--bogus'"),
        (convert_main, ["svd-residual", "tiny-falcon", "-o", "x.gguf", "--residual", "q3_x"],
         "Invalid value for '--residual'"),
        (run_main, ["generate"], "Missing argument"),
    ):
        res = CliRunner().invoke(group, args)
        assert res.exit_code == 2, res.output
        line = _one_error_line(res)
        assert words in line and "--help" in line
        assert "Usage:" not in res.output
    res = CliRunner().invoke(contract_main, ["--version"])
    assert res.exit_code == 0 and "0.1" in res.output
    assert CliRunner().invoke(contract_main, ["check", "--help"]).exit_code == 0


def test_format_without_output_is_a_usage_error(made):
    """`--format html` without -o used to write nothing and exit 0."""
    res = CliRunner().invoke(contract_main, ["check", "tiny-falcon", *FAST, "--format", "html"])
    assert res.exit_code == 2 and "-o DIR" in _one_error_line(res)
    rep = str(made / "rep" / "aios-report.json")
    res = CliRunner().invoke(contract_main, ["compare", rep, rep, "--format", "md"])
    assert res.exit_code == 2 and "-o DIR" in _one_error_line(res)
    assert CliRunner().invoke(contract_main, ["compare", rep, rep]).exit_code == 0  # print only


def test_fetch_of_a_bundled_model_does_not_try_the_hub(monkeypatch):
    import aios.models.hub as hub

    def no_network(*_a, **_k):
        raise AssertionError("tried the hub")

    monkeypatch.setattr(hub, "download", no_network)
    res = CliRunner().invoke(contract_main, ["fetch", "tiny-falcon"])
    assert res.exit_code == 0 and "bundled" in res.output


def test_error_messages_are_printed_as_text_not_markup(monkeypatch):
    """A message holding "[sparse]" or "[bold]" keeps it: it is text, not rich markup."""
    import contract.check
    from aios.errors import UsageError

    def fail(*_a, **_k):
        raise UsageError("file.gguf [sparse] cannot run; see [bold]x[/bold]")

    monkeypatch.setattr(contract.check, "check_model", fail)
    res = CliRunner().invoke(contract_main, ["check", "tiny-falcon"])
    assert res.exit_code == 2 and "file.gguf [sparse] cannot run; see [bold]x[/bold]" in res.stderr
