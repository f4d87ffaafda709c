"""The commands the README and docs/ show parse as written: every concrete ``aios-*`` line in a
fenced code block (and every ``torchrun`` / ``accelerate launch ... -m convert.cli`` line) names
an existing command and only options and choices it accepts.

(Synopsis lines with ``[optional]`` parts are skipped; the commands are parsed, not run.)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINE = re.compile(r"^\s*(?:\$\s+)?(?:[A-Z_]+=\S+\s+)*(aios-(?:contract|convert|run))\s+(.*)$")
# distributed launches run the same command as a module: `torchrun ... -m convert.cli relufy ...`
LAUNCH = re.compile(r"^\s*(?:torchrun|accelerate launch)\s.*?-m\s+(convert\.cli)\s+(.*)$")


def _examples() -> list[tuple[str, str, str]]:
    out = []
    for doc in DOCS:
        in_block = False
        for line in doc.read_text().splitlines():
            if line.strip().startswith("```"):
                in_block = not in_block
                continue
            m = (LINE.match(line) or LAUNCH.match(line)) if in_block else None
            if not m:
                continue
            rest = re.sub(r"\s+#.*$", "", m.group(2)).strip()
            if any(c in rest for c in "[|…") or "..." in rest or rest.endswith("\\"):
                continue  # synopsis or continued line
            out.append((doc.name, "aios-convert" if m.group(1) == "convert.cli" else m.group(1), rest))
    return out


EXAMPLES = _examples()


def _group(tool: str) -> click.Group:
    from contract.cli import main as contract_main
    from convert.cli import main as convert_main
    from runtime.cli import main as run_main

    return {"aios-contract": contract_main, "aios-convert": convert_main, "aios-run": run_main}[tool]


def test_docs_have_examples():
    assert len(EXAMPLES) >= 10, EXAMPLES


@pytest.mark.parametrize("doc, tool, args", EXAMPLES, ids=[f"{d}:{t} {a[:40]}" for d, t, a in EXAMPLES])
def test_documented_command_parses(doc, tool, args):
    group = _group(tool)
    name, *sub_args = shlex.split(args)
    ctx = click.Context(group, info_name=tool)
    cmd = group.get_command(ctx, name)
    assert cmd is not None, f"{doc}: {tool} has no command {name!r}"
    cmd.make_context(name, sub_args, parent=ctx)  # raises on unknown options or bad choices


# --- the README's sample scorecard is what its first command prints ---------------------------

README = ROOT / "README.md"
SCORECARD_WIDTH = 100  # the README shows the scorecard as a 100-column terminal prints it


def _readme_scorecard() -> str:
    """The fenced block that follows "Command 1 prints a scorecard"."""
    text = README.read_text()
    m = re.search(r"Command 1 prints a scorecard.*?\n```\n(.*?)\n```", text, re.DOTALL)
    assert m, "README: no scorecard block after 'Command 1 prints a scorecard'"
    return m.group(1)


def _mask(text: str) -> list[str]:
    """Lines with what legitimately varies masked. Only the wall time varies between runs and
    machines ("exit 0 · 41.0 s" and the "Time: R1 30.2 s, ..." line): every other figure is a measurement of the bundled weights on
    the bundled calibration text, or arithmetic on their config, the same on every run; a change
    there is a change the README must show. Trailing spaces (rich pads the centred title) are
    dropped."""
    return ["Time: <split>" if line.startswith("Time: ") else re.sub(r"· \d+(\.\d+)? s$", "· <seconds> s", line.rstrip())
            for line in text.splitlines()]


def test_readme_scorecard_is_what_check_prints(tmp_path, monkeypatch):
    """The README's first command, `aios-contract check tiny-falcon -o aios-report`, run as
    written (its `aios-contract check` part, read from the README; default calibration, ~15 s on
    one core), prints the README's scorecard. Its stdout
    console is swapped for a 100-column one, as a terminal of that width gets (off a terminal,
    as here, rich never wraps: aios.cli_common.LOG_WIDTH)."""
    from click.testing import CliRunner
    from rich.console import Console

    import contract.cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(contract.cli, "console", Console(width=SCORECARD_WIDTH, highlight=False, no_color=True,
                                                         color_system=None))
    first = re.search(r"aios-contract (check [^\n`&|;]*)", README.read_text())  # command 1's check
    assert first and first.group(1).split()[:2] == ["check", "tiny-falcon"], first
    res = CliRunner().invoke(contract.cli.main, shlex.split(first.group(1)))
    assert res.exit_code == 0, res.output
    assert _mask(res.stdout) == _mask(_readme_scorecard()), res.stdout
