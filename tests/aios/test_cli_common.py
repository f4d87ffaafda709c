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
