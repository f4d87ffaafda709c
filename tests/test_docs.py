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
